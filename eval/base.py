"""The scorer interface: name, version, higher-is-better, aggregation, bootstrap standard error."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from mtad.core import stats

# A scorer's ``stderr``: the standard error of the project's one bootstrap (``mtad.core.stats``:
# the resamples, method and seed of the intervals the tables show).
bootstrap_stderr = stats.bootstrap_stderr


class Scorer(ABC):
    name: str = "scorer"
    version: str = "1"
    higher_is_better: bool = True
    aggregation: str = "mean"

    @classmethod
    def preflight(cls, **settings: Any) -> None:
        """Refuse, before anything is loaded or written, settings that cannot work on this
        machine (one-line ValueError or RuntimeError); ``settings`` are the scorer's config
        fields. Nothing to check by default."""
        return None

    @abstractmethod
    def score(self, example, completion: str) -> float:
        """Score one completion against ``example.reference``."""

    def record_fields(self, value: float | None) -> dict[str, Any]:
        """The fields a scored record carries: the score and which scorer (and version) gave it."""
        return {"score": value, "scorer": self.name, "scorer_version": self.version}

    def aggregate(self, scores: list[float]) -> dict[str, Any]:
        vals = np.asarray([s for s in scores if s is not None], dtype=float)
        value = float(vals.mean()) if vals.size else float("nan")
        return {
            "metric": self.name,
            "version": self.version,
            "value": value,
            "stderr": bootstrap_stderr(vals),
            "n": int(vals.size),
            "higher_is_better": self.higher_is_better,
            "aggregation": self.aggregation,
        }
