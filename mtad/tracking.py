"""Experiment tracking behind a ``logger`` config group: ``none`` (default) or ``wandb``."""

from __future__ import annotations

import os
from typing import Any


class NullLogger:
    """Logs nothing."""

    def start(self, config: dict, name: str | None = None) -> None:
        pass

    def log_example(self, record: dict) -> None:
        pass

    def log_summary(self, summary: dict) -> None:
        pass

    def log_table(self, name: str, dataframe) -> None:
        pass

    def log_image(self, name: str, path: str) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbLogger(NullLogger):
    """Weights & Biases: online when an API key is set, offline mode otherwise."""

    def __init__(self, project: str = "mtad", entity: str | None = None, group: str | None = None,
                 tags: list[str] | None = None, mode: str | None = None):
        self.project, self.entity, self.group, self.tags = project, entity, group, list(tags or [])
        self.mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._run: Any = None

    def start(self, config: dict, name: str | None = None) -> None:
        import wandb

        self._run = wandb.init(project=self.project, entity=self.entity, group=self.group, tags=self.tags,
                               mode=self.mode, config=config, name=name, reinit=True)

    def log_example(self, record: dict) -> None:
        if self._run is not None:
            keys = ("new_tokens", "steps", "wall_time", "block_efficiency", "tokens_per_s", "perplexity", "score")
            self._run.log({f"example/{k}": record[k] for k in keys if record.get(k) is not None})

    def log_summary(self, summary: dict) -> None:
        if self._run is not None:
            flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
            self._run.summary.update(flat)

    def log_table(self, name: str, dataframe) -> None:
        if self._run is not None:
            import wandb

            self._run.log({name: wandb.Table(dataframe=dataframe)})

    def log_image(self, name: str, path: str) -> None:
        if self._run is not None:
            import wandb

            self._run.log({name: wandb.Image(path)})

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
