"""Every conf/ group member composes and instantiates (templates: lightning-hydra-template)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from mtad.run.cli import check_overrides, group_options
from mtad.run.config import ConfigError, decoder_knobs, rule_for, validate

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=False)


def _resolve(cfg):
    # ${hydra:...} interpolations need a Hydra run; drop the keys that use them.
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "output_dir"])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("name", group_options("decoder"))
def test_decoder_configs_instantiate(name):
    cfg = _compose([f"decoder={name}"])
    _resolve(cfg)
    dec = instantiate(cfg.decoder)
    assert hasattr(dec, "step")


@pytest.mark.parametrize("name", group_options("model"))
def test_model_configs_compose(name):
    cfg = _compose([f"model={name}"])
    m = _resolve(cfg)["model"]
    assert m["_target_"].startswith("mtad.models.pair.")
    if m["_target_"].endswith("tiny_pair"):
        pair = instantiate(cfg.model)
        assert pair.vocab_size > 0 and pair.draft is not None
    else:
        assert m["target"]["id"] and m["draft"]["id"]


@pytest.mark.parametrize("name", group_options("task"))
def test_task_configs_instantiate(name):
    cfg = _compose([f"task={name}"])
    task_cfg = _resolve(cfg)["task"]
    scorer_cfg = task_cfg.pop("scorer", None)
    task = instantiate(task_cfg)
    assert task.name
    if scorer_cfg:
        scorer = instantiate(scorer_cfg)
        assert scorer.name and scorer.version


@pytest.mark.parametrize("name", group_options("logger"))
def test_logger_configs_instantiate(name):
    cfg = _compose([f"logger={name}"])
    logger = instantiate(cfg.logger)
    assert hasattr(logger, "log_summary")


@pytest.mark.parametrize("name", group_options("experiment"))
def test_experiment_configs_compose(name):
    cfg = _compose([f"+experiment={name}"])
    _resolve(cfg)


def test_design_sweep_command_composes():
    cfg = _compose(["decoder=spd", "gamma=6", "tau=0.3"])
    assert cfg.decoder.gamma == 6


@pytest.mark.parametrize(
    "override,field",
    [("gamma=0", "gamma"), ("temperature=-1", "temperature"), ("top_p=0", "top_p"), ("top_p=1.5", "top_p"),
     ("max_new_tokens=0", "max_new_tokens"), ("top_k=-2", "top_k"), ("tau=0", "tau"), ("width=0", "width"),
     ("limit=0", "limit"), ("limit=-1", "limit")],
)
def test_bad_values_name_the_field(override, field):
    cfg = _compose([override])
    with pytest.raises(ConfigError, match=f"^{field} must be"):
        validate(cfg)


def test_good_values_pass():
    validate(_compose(["limit=1", "gamma=1", "tau=inf", "temperature=0", "top_k=0", "top_p=1.0"]))
    validate(_compose(["limit=null"]))


@pytest.mark.parametrize("name", group_options("decoder"))
def test_decoders_declare_a_version_and_only_known_knobs(name):
    """Every decoder class has a version (part of a point's identity); its YAML interpolates
    only top-level knobs (``${gamma}``), exactly the knobs its schema declares."""
    from hydra.utils import get_class

    from mtad.run.config import KNOBS

    cfg = _compose([f"decoder={name}"])
    assert isinstance(get_class(cfg.decoder._target_).__dict__.get("version"), str)
    raw = OmegaConf.to_container(cfg.decoder, resolve=False)
    interpolated = {v[2:-1] for v in raw.values() if isinstance(v, str) and v.startswith("${")}
    assert interpolated == set(decoder_knobs(cfg.decoder)) and interpolated <= set(KNOBS)


@pytest.mark.parametrize("name", group_options("decoder"))
def test_every_decoder_field_has_a_rule_and_its_defaults_pass(name):
    """A decoder's own fields are checked before anything loads (its schema's rules)."""
    from mtad.run.cli import load_decoder
    from mtad.testing import sampling_overrides

    cfg = _compose([f"decoder={name}", *sampling_overrides(load_decoder(name))])
    fields = [k for k in cfg.decoder if k not in ("_target_", "name")]
    assert [k for k in fields if rule_for(f"decoder.{k}", cfg.decoder) is None] == []
    validate(cfg)


def test_rule_choices_are_the_codes_own():
    from mtad.decoders.bild import MODES
    from mtad.decoders.mjgd import METHODS
    from mtad.models.offline import DTYPES

    assert rule_for("decoder.method").choices == METHODS and rule_for("decoder.mode").choices == MODES
    assert rule_for("model.dtype").choices == rule_for("model.target.dtype").choices == DTYPES


@pytest.mark.parametrize(
    "override,field",
    [("task.limit=0", "task.limit"), ("decoder.gamma=0", "decoder.gamma"), ("seed=-1", "seed"),
     ("task.max_prompt_tokens=0", "task.max_prompt_tokens"), ("model.target.dtype=int8", "model.target.dtype")],
)
def test_bad_nested_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=f"^{field.replace('.', '[.]')} must be"):
        validate(_compose([override]))


def test_unknown_decoder_did_you_mean(capsys):
    with pytest.raises(SystemExit) as e:
        check_overrides(["decoder=sdp"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown decoder 'sdp'" in err and "did you mean 'spd'" in err


def test_unknown_model_lists_options(capsys):
    with pytest.raises(SystemExit):
        check_overrides(["model=tiny_randon"])
    err = capsys.readouterr().err
    assert "tiny_random" in err


def test_known_overrides_pass():
    check_overrides(["decoder=spd", "gamma=3", "model=tiny_random", "hydra.run.dir=x"])
