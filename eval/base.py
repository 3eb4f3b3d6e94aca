"""The scorer interface: name, version, higher-is-better, aggregation, bootstrap standard error."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


def bootstrap_stderr(values, statistic=np.mean, seed: int = 0) -> float:
    """Bootstrap standard error of ``statistic`` over per-example ``values``: the standard
    deviation of the bootstrap distribution of ``scipy.stats.bootstrap`` run with the
    resamples and seed of ``mtad.core.stats`` (the project's one bootstrap, whose intervals the
    tables show)."""
    from scipy.stats import bootstrap

    from mtad.core.stats import N_RESAMPLES

    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float("nan")
    res = bootstrap((values,), statistic, n_resamples=N_RESAMPLES, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.standard_error)


class Scorer(ABC):
    name: str = "scorer"
    version: str = "1"
    higher_is_better: bool = True
    aggregation: str = "mean"

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
