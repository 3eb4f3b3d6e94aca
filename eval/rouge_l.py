"""Rouge-L F-measure (``rouge_score``, Porter stemming) of a completion against the reference."""

from __future__ import annotations

from eval.base import Scorer


class RougeLScorer(Scorer):
    """``example.reference`` is the reference text (or a list of them: the best score counts)."""

    name = "rougeL_f"
    version = "1"
    higher_is_better = True
    aggregation = "mean"

    def __init__(self, use_stemmer: bool = True, split_summaries: bool = False):
        from rouge_score import rouge_scorer

        self.use_stemmer = bool(use_stemmer)
        # rougeLsum (newline-split summary-level LCS) when split_summaries is set
        self.rouge_type = "rougeLsum" if split_summaries else "rougeL"
        self._scorer = rouge_scorer.RougeScorer([self.rouge_type], use_stemmer=self.use_stemmer)

    def score(self, example, completion: str) -> float | None:
        refs = example.reference
        if refs is None:
            return None
        if isinstance(refs, str):
            refs = [refs]
        return max(
            float(self._scorer.score(ref, completion or "")[self.rouge_type].fmeasure) for ref in refs
        )
