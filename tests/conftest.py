import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_pair():
    """float64 toy target/draft with a 6-token vocabulary for statistical tests."""
    from mtad.models.tiny import tiny_causal_lm

    target = tiny_causal_lm("qwen2", vocab_size=6, hidden_size=16, num_layers=1, num_heads=2, seed=3,
                            dtype=torch.float64, logit_scale=3.0)
    draft = tiny_causal_lm("qwen2", vocab_size=6, hidden_size=16, num_layers=1, num_heads=2, seed=11,
                           dtype=torch.float64, logit_scale=3.0)
    return target, draft
