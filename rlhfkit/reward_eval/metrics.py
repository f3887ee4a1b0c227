"""Reward-model metrics over rewards that are already computed: the numbers of `rlhfkit rm-eval`.

Everything here takes the scalar reward of each chosen and each rejected response (plus the
`Comparison` records they came from) and turns them into the numbers of Section 6 of Huang et al. 2024:

- pairwise accuracy and loss (Equation 2),
- accuracy by split, batch, confidence, policy pair and task (Detail 16, Table 5), each with a bootstrap
  interval and beside the "always prefer the longer response" rule on the same pairs,
- the most confident errors, to read by hand.

The rest of the evaluation lives beside it: `calibration` (the reward margin against accuracy, and length
bias), `probes` (hand-written ladders scored by the RM), `figures`, `evaluate` (a reward model's rewards
computed and `evaluate_rewards`, every number at once) and `report` (writes rm_eval.json and its files).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..data.formats import QUERY_FORMATS, format_query
from ..data.tldr import Comparison
from ..intervals import bootstrap_interval

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
