"""Reward-model metrics over rewards that are already computed: the numbers of `rlhfkit rm-eval`.

Everything here takes the scalar reward of each chosen and each rejected response (plus the
`Comparison` records they came from) and turns them into the numbers of Section 6 of Huang et al. 2024:

- pairwise accuracy and loss (Equation 2),
- accuracy by split, batch, confidence, policy pair and task (Detail 16, Table 5), each with a bootstrap
  interval and beside the "always prefer the longer response" rule on the same pairs,
- calibration of the reward margin against accuracy (Detail 18, Figure 5 right; Bai et al. 2022),
- length bias: does reward follow response length rather than quality (seed 002's error analysis),
- the most confident errors, to read by hand,
- `evaluate_rewards`, all of the above at once.

The rest of the evaluation lives beside it: `probes` (hand-written ladders scored by the RM),
`plots` (the figures), `rm_report` (writes rm_eval.json and its files) and `report` (report.html).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data.formats import QUERY_FORMATS, format_query
from ..data.tldr import Comparison
from .winrate import bootstrap_interval

UNKNOWN = "unknown"  # group label for a missing split/batch/confidence, so JSON keys stay readable
BREAKDOWN_ATTRIBUTES = ("split", "batch", "confidence", "policy_pair", "task")
LENGTH_RELATIONS = ("chosen longer", "chosen shorter", "equal length")
CONFIDENCE = 0.95  # of every bootstrap interval
RESAMPLES = 2000


# ---------------------------------------------------------------------------------------------
# Inputs


def as_rewards(values: Any, name: str) -> np.ndarray:
    """A 1-D float array; NaN or inf fail here, because one broken reward would silently poison every mean."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of rewards, got shape {array.shape}")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{name} has {bad.size} non-finite rewards (first at index {bad[0]})")
    return array


def reward_pair(chosen_rewards: Any, rejected_rewards: Any) -> tuple[np.ndarray, np.ndarray]:
    chosen, rejected = as_rewards(chosen_rewards, "chosen_rewards"), as_rewards(rejected_rewards, "rejected_rewards")
    if chosen.shape != rejected.shape:
        raise ValueError(f"{chosen.size} chosen rewards but {rejected.size} rejected rewards")
    if chosen.size == 0:
        raise ValueError("no pairs to evaluate")
    return chosen, rejected


def check_aligned(comparisons: Sequence[Comparison], rewards: np.ndarray) -> None:
    if len(comparisons) != rewards.size:
        raise ValueError(f"{len(comparisons)} comparisons but {rewards.size} rewards")


def char_lengths(comparisons: Sequence[Comparison]) -> tuple[np.ndarray, np.ndarray]:
    """Response lengths in characters: a tokenizer-free fallback when token lengths are not at hand."""
    return np.array([len(c.chosen.strip()) for c in comparisons]), np.array(
        [len(c.rejected.strip()) for c in comparisons]
    )


def response_lengths(
    comparisons: Sequence[Comparison], chosen_lengths: Any, rejected_lengths: Any, unit: str = "tokens"
) -> tuple[np.ndarray, np.ndarray, str]:
    """(chosen lengths, rejected lengths, unit): the given lengths, or characters when either is missing."""
    if chosen_lengths is None or rejected_lengths is None:
        return (*char_lengths(comparisons), "characters")
    chosen = np.asarray(chosen_lengths, dtype=np.float64)
    rejected = np.asarray(rejected_lengths, dtype=np.float64)
    if chosen.shape != (len(comparisons),) or rejected.shape != (len(comparisons),):
        raise ValueError(
            f"need one length per response: {len(comparisons)} pairs, "
            f"{chosen.size} chosen and {rejected.size} rejected lengths"
        )
    return chosen, rejected, unit


# ---------------------------------------------------------------------------------------------
# Pairwise accuracy and loss


def correct_mask(chosen_rewards: Any, rejected_rewards: Any) -> np.ndarray:
    """True where the human-chosen response gets the strictly higher reward.

    A tie counts as wrong, as in the reference `(chosen_rewards > rejected_rewards).float().mean()`:
    a model that scores everything the same must not get credit.
    """
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    return chosen > rejected


def pairwise_accuracy(chosen_rewards: Any, rejected_rewards: Any) -> float:
    return float(correct_mask(chosen_rewards, rejected_rewards).mean())


def pairwise_loss(chosen_rewards: Any, rejected_rewards: Any) -> float:
    """Mean of -log sigmoid(r_c - r_r) (Equation 2), written as log(1 + e^-d) via logaddexp so that
    a large negative margin gives a large finite loss instead of log(0)."""
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    return float(np.logaddexp(0.0, -(chosen - rejected)).mean())


def reward_stats(rewards: Any) -> dict[str, float]:
    """Max, mean, min and std of rewards: the "Reward" rows of Table 5."""
    values = as_rewards(rewards, "rewards")
    return {
        "max": float(values.max()),
        "mean": float(values.mean()),
        "min": float(values.min()),
        "std": float(values.std()),
    }


# ---------------------------------------------------------------------------------------------
# Breakdown by metadata (Detail 16, Table 5)


def natural_key(value: Any) -> tuple:
    """Sorts "batch6" before "batch10" and 2 before 10, so tables read in upstream order; unknown last."""
    text = str(value)
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)
    return (value is None or text == UNKNOWN, parts)


def accuracy_stats(hits: np.ndarray) -> dict[str, float]:
    """Accuracy, count and its binomial standard error sqrt(p(1-p)/n): with a single run there are no
    seeds to take a std over (Table 5), but the stderr says which batch differences are more than noise."""
    n = int(hits.size)
    accuracy = float(hits.mean())
    return {"accuracy": accuracy, "count": n, "stderr": math.sqrt(accuracy * (1 - accuracy) / n)}


def group_members(groups: Sequence[str | int | None]) -> dict[Any, np.ndarray]:
    """The indices of each distinct group value, in natural order."""
    members: dict[Any, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    return {group: np.array(members[group]) for group in sorted(members, key=natural_key)}


def accuracy_by(groups: Sequence[str | int | None], correct: Any) -> dict[Any, dict[str, float]]:
    """Accuracy, count and stderr per distinct group value, in natural order; `correct` is per pair."""
    hits = np.asarray(correct, dtype=np.float64)
    if len(groups) != hits.size:
        raise ValueError(f"{len(groups)} group labels but {hits.size} correctness values")
    return {group: accuracy_stats(hits[index]) for group, index in group_members(groups).items()}


def group_value(comparison: Comparison, attribute: str) -> str | int:
    value = getattr(comparison, attribute)
    return UNKNOWN if value in (None, "", "? vs ?") else value


def breakdown(
    comparisons: Sequence[Comparison],
    correct: Any,
    chosen_lengths: Any = None,
    rejected_lengths: Any = None,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """Overall accuracy and accuracy by split, batch, confidence, policy pair and task, each row as
    `accuracy_with_baseline` gives it; lengths default to characters.

    Detail 16: annotation batches differ widely in how hard they are (0.51 to 0.77 for one RM), so a
    single number on a random subset of the validation set is not comparable across papers.
    """
    hits = np.asarray(correct, dtype=np.float64)
    if len(comparisons) != hits.size:
        raise ValueError(f"{len(comparisons)} comparisons but {hits.size} correctness values")
    chosen_len, rejected_len, _ = response_lengths(comparisons, chosen_lengths, rejected_lengths)
    rule, shorter = length_rule_hits(chosen_len, rejected_len), chosen_shorter_mask(chosen_len, rejected_len)

    def row(index: Any) -> dict[str, Any]:
        return accuracy_with_baseline(hits[index], rule[index], shorter[index], seed, resamples)

    result: dict[str, Any] = {"overall": row(slice(None))}
    for attribute in BREAKDOWN_ATTRIBUTES:
        members = group_members([group_value(c, attribute) for c in comparisons])
        result[attribute] = {group: row(index) for group, index in members.items()}
    return result


# ---------------------------------------------------------------------------------------------
# Accuracy beside the "always prefer the longer response" rule


def length_rule_hits(chosen_lengths: Any, rejected_lengths: Any) -> np.ndarray:
    """Per pair, how often "always prefer the longer response" agrees with the human: 1 where the chosen
    response is longer, 0 where it is shorter, 0.5 at equal length (the rule has no pick, a coin flip)."""
    chosen, rejected = np.asarray(chosen_lengths), np.asarray(rejected_lengths)
    return (chosen > rejected) + 0.5 * (chosen == rejected)


def chosen_shorter_mask(chosen_lengths: Any, rejected_lengths: Any) -> np.ndarray:
    """The pairs the length rule gets wrong: accuracy here is what an RM knows beyond length."""
    return np.asarray(chosen_lengths) < np.asarray(rejected_lengths)


def mean_interval(values: np.ndarray, seed: int, resamples: int) -> tuple[float | None, ...]:
    """(mean, low, high) with a percentile bootstrap interval over pairs; Nones without a pair."""
    if values.size == 0:
        return None, None, None
    return (float(values.mean()), *bootstrap_interval(values, np.mean, resamples, CONFIDENCE, seed))


def accuracy_with_baseline(
    hits: Any, rule_hits: Any, shorter_mask: Any, seed: int = 0, resamples: int = RESAMPLES
) -> dict[str, Any]:
    """`accuracy_stats` of the model beside the length rule on the same pairs, every mean with a bootstrap
    interval: `low`/`high` (the model), `length_rule`, `model_minus_rule`, `chosen_shorter_accuracy`
    (with `chosen_shorter_count`), each with `_low`/`_high`.

    `model_minus_rule` resamples pairs once for both sides (a paired bootstrap of the per-pair
    difference), so pairs both get right or both get wrong add no width: an interval above 0 says the
    model beats the length rule by more than the noise of this sample of pairs.
    """
    hits = np.asarray(hits, dtype=np.float64)
    rule = np.asarray(rule_hits, dtype=np.float64)
    shorter = np.asarray(shorter_mask, dtype=bool)
    if rule.shape != hits.shape or shorter.shape != hits.shape:
        raise ValueError(f"{hits.size} hits but {rule.size} length-rule hits and {shorter.size} mask values")
    _, low, high = mean_interval(hits, seed, resamples)
    rule_mean, rule_low, rule_high = mean_interval(rule, seed, resamples)
    difference, difference_low, difference_high = mean_interval(hits - rule, seed, resamples)
    shorter_accuracy, shorter_low, shorter_high = mean_interval(hits[shorter], seed, resamples)
    return accuracy_stats(hits) | {
        "low": low,
        "high": high,
        "length_rule": rule_mean,
        "length_rule_low": rule_low,
        "length_rule_high": rule_high,
        "model_minus_rule": difference,
        "model_minus_rule_low": difference_low,
        "model_minus_rule_high": difference_high,
        "chosen_shorter_accuracy": shorter_accuracy,
        "chosen_shorter_count": int(shorter.sum()),
        "chosen_shorter_low": shorter_low,
        "chosen_shorter_high": shorter_high,
    }


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


# ---------------------------------------------------------------------------------------------
# Error analysis


def prompt_text(comparison: Comparison) -> str:
    """The untruncated query in the task's template, so an error reads as the RM read it."""
    if comparison.task in QUERY_FORMATS:
        try:
            return format_query(comparison.task, comparison.fields)
        except KeyError:  # fields that do not fit the template: show them as they are
            pass
    return "\n\n".join(f"{key}: {value}" for key, value in comparison.fields.items())


def error_record(rank: int, comparison: Comparison, chosen_reward: float, rejected_reward: float) -> dict[str, Any]:
    margin = chosen_reward - rejected_reward
    return {
        "rank": rank,
        "prompt_id": comparison.prompt_id,
        "task": comparison.task,
        "prompt": prompt_text(comparison),
        "chosen": comparison.chosen,
        "rejected": comparison.rejected,
        "chosen_reward": float(chosen_reward),
        "rejected_reward": float(rejected_reward),
        "margin": float(margin),
        "model_confidence": float(1.0 / (1.0 + math.exp(margin))),  # P(rejected better) = sigmoid(-margin), margin <= 0
        "chosen_chars": len(comparison.chosen.strip()),
        "rejected_chars": len(comparison.rejected.strip()),
        "metadata": {
            "split": comparison.split,
            "batch": comparison.batch,
            "confidence": comparison.confidence,
            "worker": comparison.worker,
            "chosen_policy": comparison.chosen_policy,
            "rejected_policy": comparison.rejected_policy,
            "where": comparison.where,
        },
    }


def most_confident_errors(
    comparisons: Sequence[Comparison], chosen_rewards: Any, rejected_rewards: Any, k: int = 20
) -> list[dict[str, Any]]:
    """The k pairs the RM gets wrong by the widest margin (most negative r_c - r_r first; ties, which
    count as wrong, come last). Confident errors are where label noise or a learned shortcut such as
    length shows most clearly."""
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    check_aligned(comparisons, chosen)
    margins = chosen - rejected
    wrong = np.flatnonzero(margins <= 0)
    order = wrong[np.argsort(margins[wrong], kind="stable")][: max(k, 0)]
    return [error_record(rank, comparisons[i], chosen[i], rejected[i]) for rank, i in enumerate(order, start=1)]


# ---------------------------------------------------------------------------------------------
# Everything at once


def evaluate_rewards(
    comparisons: Sequence[Comparison],
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any = None,
    rejected_lengths: Any = None,
    length_unit: str = "tokens",
    n_bins: int = 10,
    k_errors: int = 20,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> dict[str, Any]:
    """All metrics of this module for one set of rewards; lengths default to characters."""
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    check_aligned(comparisons, chosen)
    chosen_lengths, rejected_lengths, length_unit = response_lengths(
        comparisons, chosen_lengths, rejected_lengths, length_unit
    )
    correct = chosen > rejected
    return {
        "pairs": int(chosen.size),
        "accuracy": float(correct.mean()),
        "loss": pairwise_loss(chosen, rejected),
        "rewards": {
            "all": reward_stats(np.concatenate([chosen, rejected])),
            "chosen": reward_stats(chosen),
            "rejected": reward_stats(rejected),
            "margin": reward_stats(chosen - rejected),
        },
        "breakdown": breakdown(comparisons, correct, chosen_lengths, rejected_lengths, seed, resamples),
        "intervals": {
            "method": "percentile bootstrap over pairs",
            "confidence": CONFIDENCE,
            "resamples": resamples,
            "seed": seed,
        },
        "calibration": calibration(chosen, rejected, n_bins),
        "length_bias": length_bias(chosen, rejected, chosen_lengths, rejected_lengths, length_unit),
        "confident_errors": most_confident_errors(comparisons, chosen, rejected, k_errors),
    }
