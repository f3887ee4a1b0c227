"""Reward-model calibration and length bias over computed rewards: how far the reward margin can be read as a
probability (Detail 18, Figure 5 right; Bai et al. 2022), and whether reward follows response length rather
than quality (seed 002's error analysis)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .metrics import LENGTH_RELATIONS, accuracy_by, reward_pair

# ---------------------------------------------------------------------------------------------
# Calibration (Detail 18, Figure 5 right)


def preferred_probability(margins: np.ndarray) -> np.ndarray:
    """The RM's probability that its preferred response is the human's: sigmoid(|margin|).

    Under the Bradley-Terry model the RM is trained on, P(a preferred over b) = sigmoid(r_a - r_b);
    exp(-|m|) <= 1, so this form never overflows.
    """
    return 1.0 / (1.0 + np.exp(-np.abs(margins)))


def agreement(margins: np.ndarray) -> np.ndarray:
    """1 where the RM's preferred response is the human's, 0 where not, 0.5 for a tie (the RM has no
    preference and predicts 0.5, so a coin flip is the calibrated outcome)."""
    return (margins > 0) + 0.5 * (margins == 0)


def margin_bin_edges(abs_margins: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-count (quantile) edges from 0 to inf: every calibration point rests on about the same
    number of pairs, so a sparse tail of huge margins cannot dominate the plot or the ECE."""
    inner = np.quantile(abs_margins, np.linspace(0.0, 1.0, n_bins + 1)[1:-1]) if n_bins > 1 else []
    return np.unique(np.concatenate([[0.0], inner, [np.inf]]))


def calibration(
    chosen_rewards: Any, rejected_rewards: Any, n_bins: int = 10, boundaries: Sequence[float] | None = None
) -> dict[str, Any]:
    """Accuracy against confidence in bins of |r_c - r_r|, and the expected calibration error.

    `boundaries` are the |margin| values between bins (e.g. [1.0] gives [0, 1) and [1, inf)); by
    default `n_bins` equal-count bins. ECE = sum_b (n_b / N) |accuracy_b - confidence_b|.
    """
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    margins = chosen - rejected
    abs_margins = np.abs(margins)
    if boundaries is None:
        edges = margin_bin_edges(abs_margins, n_bins)
    else:
        inner = np.asarray(boundaries, dtype=np.float64)
        if inner.size and (np.any(np.diff(inner) <= 0) or inner[0] <= 0):
            raise ValueError(f"calibration boundaries must be positive and increasing, got {list(boundaries)}")
        edges = np.concatenate([[0.0], inner, [np.inf]])
    which = np.searchsorted(edges, abs_margins, side="right") - 1  # bin i holds edges[i] <= |m| < edges[i+1]
    confidence, agrees = preferred_probability(margins), agreement(margins)
    bins, ece = [], 0.0
    for i in range(len(edges) - 1):
        members = which == i
        n = int(members.sum())
        if n == 0:
            continue
        accuracy, mean_confidence = float(agrees[members].mean()), float(confidence[members].mean())
        ece += n / margins.size * abs(accuracy - mean_confidence)
        bins.append(
            {
                "margin_low": float(edges[i]),
                "margin_high": float(edges[i + 1]) if np.isfinite(edges[i + 1]) else None,
                "mean_margin": float(abs_margins[members].mean()),
                "confidence": mean_confidence,
                "accuracy": accuracy,
                "count": n,
                "stderr": math.sqrt(accuracy * (1 - accuracy) / n),
            }
        )
    return {"ece": ece, "pairs": int(margins.size), "bins": bins}


# ---------------------------------------------------------------------------------------------
# Length bias


def average_ranks(values: Any) -> np.ndarray:
    """Ranks from 0 with ties sharing their average rank, as Spearman's rho requires."""
    _, inverse, counts = np.unique(np.asarray(values, dtype=np.float64), return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts - 1) / 2.0)[inverse]


def pearson(x: Any, y: Any) -> float | None:
    """Pearson correlation, or None when either side is constant (undefined, and NaN is not valid JSON)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.size < 2 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def spearman(x: Any, y: Any) -> float | None:
    return pearson(average_ranks(x), average_ranks(y))


def length_relations(chosen_lengths: Any, rejected_lengths: Any) -> list[str]:
    chosen, rejected = np.asarray(chosen_lengths), np.asarray(rejected_lengths)
    return [
        LENGTH_RELATIONS[0] if c > r else LENGTH_RELATIONS[1] if c < r else LENGTH_RELATIONS[2]
        for c, r in zip(chosen, rejected, strict=True)
    ]


def length_bias(
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any,
    rejected_lengths: Any,
    unit: str = "tokens",
) -> dict[str, Any]:
    """How much reward follows length.

    - `pearson` / `spearman`: reward against length over all responses (chosen and rejected);
    - `pairwise_spearman`: margin against length difference within pairs, which holds the prompt
      fixed and so is not confounded by long posts getting long summaries;
    - `accuracy_by_length`: accuracy when the chosen response is the longer / shorter / equal one;
      seed 002 found errors concentrate where the rejected response is longer;
    - `humans_prefer_longer` vs `model_prefers_longer` over pairs of unequal length: a model above the
      humans has amplified the length bias of its training data.
    """
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    chosen_len = np.asarray(chosen_lengths, dtype=np.float64)
    rejected_len = np.asarray(rejected_lengths, dtype=np.float64)
    if chosen_len.shape != chosen.shape or rejected_len.shape != chosen.shape:
        raise ValueError(
            f"need one length per response: {chosen.size} pairs, "
            f"{chosen_len.size} chosen and {rejected_len.size} rejected lengths"
        )
    rewards, lengths = np.concatenate([chosen, rejected]), np.concatenate([chosen_len, rejected_len])
    unequal = chosen_len != rejected_len
    decided = unequal & (chosen != rejected)
    model_picks_chosen = chosen > rejected
    longer_is_chosen = chosen_len > rejected_len
    return {
        "unit": unit,
        "responses": int(rewards.size),
        "pearson": pearson(lengths, rewards),
        "spearman": spearman(lengths, rewards),
        "pairwise_spearman": spearman(chosen_len - rejected_len, chosen - rejected),
        "accuracy_by_length": accuracy_by(length_relations(chosen_len, rejected_len), model_picks_chosen),
        "humans_prefer_longer": float(longer_is_chosen[unequal].mean()) if unequal.any() else None,
        "model_prefers_longer": float((model_picks_chosen == longer_is_chosen)[decided].mean())
        if decided.any()
        else None,
    }
