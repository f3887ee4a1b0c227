"""ROUGE-L of generated summaries against references (the paper's Figure 2 right)."""

from __future__ import annotations

from rouge_score import rouge_scorer


def rouge_l(predictions: list[str], references: list[str]) -> list[float]:
    """ROUGE-L F-measure per pair (stemmed, as in the paper's evaluation)."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references, strict=True)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
