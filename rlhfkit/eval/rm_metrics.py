"""Reward-model evaluation over rewards that are already computed: the model-free half of `rlhfkit rm-eval`.

Everything here takes the scalar reward of each chosen and each rejected response (plus the
`Comparison` records they came from) and turns them into the numbers and plots of Section 6 of
Huang et al. 2024:

- pairwise accuracy and loss (Equation 2),
- accuracy by split, batch, confidence, policy pair and task (Detail 16, Table 5),
- calibration of the reward margin against accuracy (Detail 18, Figure 5 right; Bai et al. 2022),
- length bias: does reward follow response length rather than quality (seed 002's error analysis),
- the most confident errors, to read by hand,
- probes: hand-written quality and length ladders scored by the RM (seed 000's scoring examples),
- writers for `rm_eval.json`, `confident_errors.jsonl`, PNG plots and a Markdown probe table.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..data.formats import QUERY_FORMATS, format_query
from ..data.tldr import Comparison
from ..errors import UserError
from .report import pyplot

UNKNOWN = "unknown"  # group label for a missing split/batch/confidence, so JSON keys stay readable
BREAKDOWN_ATTRIBUTES = ("split", "batch", "confidence", "policy_pair", "task")
DEFAULT_PROBES = Path(__file__).resolve().parents[1] / "probes" / "tldr-probes.yaml"
PROBE_KINDS = ("quality", "length")
PROBE_TASK_FIELDS = {"tldr": ("subreddit", "title", "post"), "cnndm": ("article",), "hh": ("dialogue",)}
LENGTH_RELATIONS = ("chosen longer", "chosen shorter", "equal length")


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
    chosen, rejected = (
        as_rewards(chosen_rewards, "chosen_rewards"),
        as_rewards(rejected_rewards, "rejected_rewards"),
    )
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


def accuracy_by(groups: Sequence[str | int | None], correct: Any) -> dict[Any, dict[str, float]]:
    """Accuracy, count and stderr per distinct group value, in natural order; `correct` is per pair."""
    hits = np.asarray(correct, dtype=np.float64)
    if len(groups) != hits.size:
        raise ValueError(f"{len(groups)} group labels but {hits.size} correctness values")
    members: dict[Any, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    return {group: accuracy_stats(hits[members[group]]) for group in sorted(members, key=natural_key)}


def group_value(comparison: Comparison, attribute: str) -> str | int:
    value = getattr(comparison, attribute)
    return UNKNOWN if value in (None, "", "? vs ?") else value


def breakdown(comparisons: Sequence[Comparison], correct: Any) -> dict[str, Any]:
    """Overall accuracy and accuracy by split, batch, confidence, policy pair and task.

    Detail 16: annotation batches differ widely in how hard they are (0.51 to 0.77 for one RM), so a
    single number on a random subset of the validation set is not comparable across papers.
    """
    hits = np.asarray(correct, dtype=np.float64)
    if len(comparisons) != hits.size:
        raise ValueError(f"{len(comparisons)} comparisons but {hits.size} correctness values")
    result: dict[str, Any] = {"overall": accuracy_stats(hits)}
    for attribute in BREAKDOWN_ATTRIBUTES:
        result[attribute] = accuracy_by([group_value(c, attribute) for c in comparisons], hits)
    return result


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
            raise ValueError(
                f"calibration boundaries must be positive and increasing, got {list(boundaries)}"
            )
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
    _, inverse, counts = np.unique(
        np.asarray(values, dtype=np.float64), return_inverse=True, return_counts=True
    )
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
            f"need one length per response: {chosen.size} pairs, {chosen_len.size} chosen and {rejected_len.size} rejected lengths"
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


def error_record(
    rank: int, comparison: Comparison, chosen_reward: float, rejected_reward: float
) -> dict[str, Any]:
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
        "model_confidence": float(
            1.0 / (1.0 + math.exp(margin))
        ),  # P(rejected better) = sigmoid(-margin), margin <= 0
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
    return [
        error_record(rank, comparisons[i], chosen[i], rejected[i]) for rank, i in enumerate(order, start=1)
    ]


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
) -> dict[str, Any]:
    """All metrics of this module for one set of rewards; lengths default to characters."""
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    check_aligned(comparisons, chosen)
    if chosen_lengths is None or rejected_lengths is None:
        (chosen_lengths, rejected_lengths), length_unit = char_lengths(comparisons), "characters"
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
        "breakdown": breakdown(comparisons, correct),
        "calibration": calibration(chosen, rejected, n_bins),
        "length_bias": length_bias(chosen, rejected, chosen_lengths, rejected_lengths, length_unit),
        "confident_errors": most_confident_errors(comparisons, chosen, rejected, k_errors),
    }


# ---------------------------------------------------------------------------------------------
# Probes: hand-written ladders of responses to one prompt


class ProbeFileError(UserError, ValueError):
    """The probe file does not follow the schema; the message names the file and the bad field."""


@dataclass(frozen=True)
class ProbeResponse:
    label: str
    text: str


@dataclass(frozen=True)
class Ladder:
    name: str
    kind: str  # "quality": best first, scores should fall; "length": same quality, lengths differ
    responses: tuple[ProbeResponse, ...]


@dataclass(frozen=True)
class Probe:
    name: str
    task: str
    fields: dict[str, str]
    ladders: tuple[Ladder, ...]


def check_mapping(value: Any, where: str, required: Sequence[str], source: str) -> dict[str, Any]:
    """A mapping with exactly the `required` keys; unknown keys fail so a typo is not silently ignored."""
    if not isinstance(value, dict):
        raise ProbeFileError(
            f"{source}: {where} must be a mapping with fields {', '.join(required)} (got {type(value).__name__})"
        )
    unknown = [k for k in value if k not in required]
    if unknown:
        raise ProbeFileError(
            f"{source}: {where}.{unknown[0]} is not a known field (expected: {', '.join(required)})"
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise ProbeFileError(f"{source}: {where}.{missing[0]} is missing")
    return value


def check_text(value: Any, where: str, source: str) -> str:
    if not isinstance(value, str) or not value.strip():
        got = repr(value) if isinstance(value, str) else type(value).__name__
        raise ProbeFileError(f"{source}: {where} must be a non-empty string (got {got})")
    return value.strip()


def check_list(value: Any, where: str, source: str, minimum: int) -> list[Any]:
    if not isinstance(value, list) or len(value) < minimum:
        got = f"{len(value)} items" if isinstance(value, list) else type(value).__name__
        raise ProbeFileError(f"{source}: {where} must be a list of at least {minimum} (got {got})")
    return value


def check_unique(names: list[str], where: str, source: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise ProbeFileError(f"{source}: {where}[{index}] repeats {name!r}; names must be unique")
        seen.add(name)


def parse_ladder(value: Any, where: str, source: str) -> Ladder:
    data = check_mapping(value, where, ("name", "kind", "responses"), source)
    name = check_text(data["name"], f"{where}.name", source)
    if data["kind"] not in PROBE_KINDS:
        raise ProbeFileError(
            f"{source}: {where}.kind must be one of {', '.join(PROBE_KINDS)} (got {data['kind']!r})"
        )
    responses = []
    for index, item in enumerate(check_list(data["responses"], f"{where}.responses", source, minimum=2)):
        at = f"{where}.responses[{index}]"
        entry = check_mapping(item, at, ("label", "text"), source)
        responses.append(
            ProbeResponse(
                check_text(entry["label"], f"{at}.label", source),
                check_text(entry["text"], f"{at}.text", source),
            )
        )
    check_unique([r.label for r in responses], f"{where}.responses", source)
    if data["kind"] == "length" and len({word_count(r.text) for r in responses}) < 2:
        raise ProbeFileError(f"{source}: {where}.responses of a length ladder must differ in word count")
    return Ladder(name, data["kind"], tuple(responses))


def parse_probe(value: Any, where: str, source: str) -> Probe:
    data = check_mapping(value, where, ("name", "task", "fields", "ladders"), source)
    name = check_text(data["name"], f"{where}.name", source)
    if data["task"] not in PROBE_TASK_FIELDS:
        raise ProbeFileError(
            f"{source}: {where}.task must be one of {', '.join(PROBE_TASK_FIELDS)} (got {data['task']!r})"
        )
    task_fields = PROBE_TASK_FIELDS[data["task"]]
    fields = check_mapping(data["fields"], f"{where}.fields", task_fields, source)
    # the subreddit may legitimately be empty upstream (see data/tldr.py); the other fields may not
    fields = {
        k: fields[k].strip()
        if k == "subreddit" and isinstance(fields[k], str)
        else check_text(fields[k], f"{where}.fields.{k}", source)
        for k in task_fields
    }
    ladders = [
        parse_ladder(item, f"{where}.ladders[{i}]", source)
        for i, item in enumerate(check_list(data["ladders"], f"{where}.ladders", source, 1))
    ]
    check_unique([ladder.name for ladder in ladders], f"{where}.ladders", source)
    return Probe(name, data["task"], fields, tuple(ladders))


def parse_probes(data: Any, source: str = "probes") -> list[Probe]:
    probes = [
        parse_probe(item, f"probes[{i}]", source)
        for i, item in enumerate(check_list(data, "the top level (probes)", source, 1))
    ]
    check_unique([p.name for p in probes], "probes", source)
    return probes


def load_probes(path: str | Path = DEFAULT_PROBES) -> list[Probe]:
    """Read and validate a probe YAML file: a list of {name, task, fields, ladders: [{name, kind, responses: [{label, text}]}]}."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ProbeFileError(f"{path}: cannot read probe file: {error}") from error
    except yaml.YAMLError as error:
        raise ProbeFileError(f"{path}: not valid YAML: {error}") from error
    return parse_probes(data, str(path))


def word_count(text: str) -> int:
    return len(text.split())


def probe_items(probes: Sequence[Probe]) -> list[dict[str, Any]]:
    """Every response to score, in a fixed order (probe, ladder, position); score
    (`task`, `fields`, `text`) with the RM and pass the scores to `probe_table` in this order."""
    return [
        {
            "probe": p.name,
            "ladder": ladder.name,
            "kind": ladder.kind,
            "position": position,
            "label": r.label,
            "task": p.task,
            "fields": p.fields,
            "text": r.text,
        }
        for p in probes
        for ladder in p.ladders
        for position, r in enumerate(ladder.responses)
    ]


def probe_table(probes: Sequence[Probe], scores: Sequence[float]) -> list[dict[str, Any]]:
    """One row per scored response: probe, ladder, kind, position, label, words, chars, score, text."""
    items = probe_items(probes)
    values = as_rewards(scores, "probe scores")
    if values.size != len(items):
        raise ValueError(f"{len(items)} probe responses but {values.size} scores")
    keep = ("probe", "ladder", "kind", "position", "label")
    return [
        {
            **{k: item[k] for k in keep},
            "words": word_count(item["text"]),
            "chars": len(item["text"]),
            "score": float(score),
            "text": item["text"],
        }
        for item, score in zip(items, values, strict=True)
    ]


def ladder_groups(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["probe"], row["ladder"]), []).append(row)
    return {key: sorted(members, key=lambda r: r["position"]) for key, members in groups.items()}


def quality_check(members: list[dict[str, Any]]) -> dict[str, Any]:
    """A quality ladder is listed best first, so scores should fall strictly; Spearman of position
    against score is -1 for a perfect ordering."""
    scores = [r["score"] for r in members]
    violations = [members[i]["label"] for i in range(1, len(members)) if scores[i] >= scores[i - 1]]
    rho = spearman(range(len(scores)), scores)
    verdict = "scores fall with quality" if not violations else f"order broken at: {', '.join(violations)}"
    return {
        "spearman": rho,
        "monotonic_decreasing": not violations,
        "violations": violations,
        "verdict": verdict,
    }


def length_check(members: list[dict[str, Any]]) -> dict[str, Any]:
    """A length ladder holds quality fixed, so any slope of score against words is length bias."""
    words = np.array([r["words"] for r in members], dtype=np.float64)
    scores = np.array([r["score"] for r in members])
    slope = float(np.polyfit(words, scores, 1)[0])
    change = slope * float(words.max() - words.min())
    direction = (
        "longer scores higher"
        if change > 0
        else "longer scores lower"
        if change < 0
        else "no change with length"
    )
    return {
        "spearman": spearman(words, scores),
        "slope_per_word": slope,
        "change_across_ladder": change,
        "verdict": f"{direction} ({change:+.2f} from {words.min():.0f} to {words.max():.0f} words)",
    }


def probe_checks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ladder: quality ladders report whether scores fall monotonically (and Spearman); length
    ladders report the slope of score per word, so users can see length bias."""
    checks = []
    for (probe, ladder), members in ladder_groups(rows).items():
        kind = members[0]["kind"]
        check = quality_check(members) if kind == "quality" else length_check(members)
        checks.append(
            {"probe": probe, "ladder": ladder, "kind": kind, "scores": [r["score"] for r in members], **check}
        )
    return checks


def markdown_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_probe_table_markdown(
    rows: Sequence[dict[str, Any]], checks: Sequence[dict[str, Any]] | None = None
) -> str:
    """Seed 000's scoring tables: one table per ladder, with its check as a one-line verdict."""
    verdicts = {
        (c["probe"], c["ladder"]): c["verdict"]
        for c in (checks if checks is not None else probe_checks(rows))
    }
    lines: list[str] = []
    current_probe = None
    for (probe, ladder), members in ladder_groups(rows).items():
        if probe != current_probe:
            lines += [f"### {markdown_cell(probe)}", ""]
            current_probe = probe
        lines += [
            f"**{markdown_cell(ladder)}** ({members[0]['kind']}): {markdown_cell(verdicts.get((probe, ladder), ''))}",
            "",
        ]
        lines += ["| # | label | words | score | response |", "|---|---|---|---|---|"]
        lines += [
            f"| {r['position'] + 1} | {markdown_cell(r['label'])} | {r['words']} | {r['score']:.2f} | {markdown_cell(r['text'])} |"
            for r in members
        ]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots




def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_calibration(calib: dict[str, Any], path: Path) -> Path:
    """Figure 5 right: accuracy of the RM's preferred response against |margin|, with the perfectly
    calibrated curve 1/(1+e^-margin); points below the curve are over-confident."""
    plt = pyplot()
    bins = calib["bins"]
    x = np.array([b["mean_margin"] for b in bins])
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    grid = np.linspace(0, max(float(x.max()) * 1.1, 1.0), 200)
    ax.plot(
        grid, 1 / (1 + np.exp(-grid)), color="black", lw=1.2, label="perfect calibration $1/(1+e^{-\\Delta})$"
    )
    ax.errorbar(
        x,
        [b["accuracy"] for b in bins],
        yerr=[b["stderr"] for b in bins],
        fmt="o-",
        color="tab:blue",
        capsize=3,
        label="reward model",
    )
    for b in bins:
        ax.annotate(
            f"n={b['count']}",
            (b["mean_margin"], b["accuracy"]),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=7,
        )
    ax.set(
        title=f"RM calibration (ECE {calib['ece']:.3f})",
        xlabel="|score difference| $\\Delta$",
        ylabel="accuracy",
        # below 0.5 the model is confidently wrong: keep such bins on the chart
        ylim=(min(0.3, min(b["accuracy"] - b["stderr"] for b in bins) - 0.03), 1.02),
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save(fig, path)


def plot_length_bias(
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any,
    rejected_lengths: Any,
    path: Path,
    unit: str = "tokens",
) -> Path:
    """Reward against length for every response, with a least-squares line: a rising line on
    responses of similar quality means the RM pays for length."""
    plt = pyplot()
    rewards = np.concatenate(
        [np.asarray(chosen_rewards, dtype=np.float64), np.asarray(rejected_rewards, dtype=np.float64)]
    )
    lengths = np.concatenate(
        [np.asarray(chosen_lengths, dtype=np.float64), np.asarray(rejected_lengths, dtype=np.float64)]
    )
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    n = len(rewards) // 2
    ax.scatter(lengths[:n], rewards[:n], s=5, alpha=0.4, label="chosen")
    ax.scatter(lengths[n:], rewards[n:], s=5, alpha=0.4, label="rejected")
    if lengths.std() > 0:
        slope, intercept = np.polyfit(lengths, rewards, 1)
        grid = np.linspace(lengths.min(), lengths.max(), 2)
        ax.plot(
            grid,
            slope * grid + intercept,
            color="black",
            lw=1.2,
            label=f"fit: {slope:+.3f} per {unit[:-1] if unit.endswith('s') else unit}",
        )
    r, rho = pearson(lengths, rewards), spearman(lengths, rewards)
    ax.set(
        title=f"Reward vs length (Pearson {r if r is not None else float('nan'):.2f}, Spearman {rho if rho is not None else float('nan'):.2f})",
        xlabel=f"response length ({unit})",
        ylabel="reward",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_accuracy_bars(
    table: dict[Any, dict[str, float]], overall: float, title: str, xlabel: str, path: Path
) -> Path:
    """Table 5 as a bar chart: accuracy per group with stderr bars and the count above each bar, so a
    striking bar on a handful of pairs is not over-read."""
    plt = pyplot()
    labels = [str(k) for k in table]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(labels) + 2), 4.2))
    positions = np.arange(len(labels))
    accuracies = [v["accuracy"] for v in table.values()]
    ax.bar(
        positions,
        accuracies,
        yerr=[v["stderr"] for v in table.values()],
        color="tab:blue",
        alpha=0.8,
        capsize=3,
    )
    for x, value in zip(positions, table.values(), strict=True):
        ax.text(
            x, 0.02, f"n={value['count']}", ha="center", va="bottom", rotation=90, fontsize=7, color="white"
        )
    ax.axhline(overall, color="black", ls="--", lw=1, label=f"overall {overall:.3f}")
    ax.axhline(0.5, color="gray", ls=":", lw=1, label="chance")
    ax.set_xticks(
        positions,
        labels,
        rotation=45 if len(labels) > 6 else 0,
        ha="right" if len(labels) > 6 else "center",
        fontsize=8,
    )
    ax.set(title=title, xlabel=xlabel, ylabel="accuracy", ylim=(0, 1.08))
    ax.legend(fontsize=8, loc="upper right")
    return save(fig, path)


def plot_margin_histogram(chosen_rewards: Any, rejected_rewards: Any, path: Path) -> Path:
    """Distribution of r_c - r_r; everything left of 0 is an error, and a tall wall at 0 means the RM
    barely separates the responses."""
    plt = pyplot()
    margins = np.asarray(chosen_rewards, dtype=np.float64) - np.asarray(rejected_rewards, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    bins = np.histogram_bin_edges(margins, bins=50)
    ax.hist(
        margins[margins > 0],
        bins=bins,
        color="tab:green",
        alpha=0.7,
        label=f"correct ({(margins > 0).mean():.1%})",
    )
    ax.hist(margins[margins <= 0], bins=bins, color="tab:red", alpha=0.7, label="wrong")
    ax.axvline(0, color="black", lw=1)
    ax.set(title="Reward margin r(chosen) - r(rejected)", xlabel="margin", ylabel="pairs")
    ax.legend(fontsize=8)
    return save(fig, path)


TRAINING_PANELS = (
    ("loss", ("loss",)),
    ("accuracy", ("accuracy",)),
    ("reward means", ("chosen_reward", "rejected_reward")),
    ("margin", ("margin",)),
)


def metric_series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) where `key` holds a finite number; a row without `step` uses its index."""
    steps, values = [], []
    for index, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(float(row.get("step", index)))
            values.append(float(value))
    return steps, values


def exponential_smoothing(values: list[float], alpha: float) -> list[float]:
    """TensorBoard-style EMA; seed 000 compared RM curves after smoothing with alpha = 0.92."""
    smoothed, last = [], values[0] if values else 0.0
    for value in values:
        last = alpha * last + (1 - alpha) * value
        smoothed.append(last)
    return smoothed


def plot_training_curves(
    metrics_rows: Sequence[dict[str, Any]], out_dir: str | Path, smoothing: float = 0.0
) -> Path | None:
    """Loss, accuracy, chosen and rejected reward means, and margin from metrics.jsonl rows in a 2x2
    `rm_training.png`. A key belongs to a panel by its last part (train/loss, val/loss, ...); missing
    keys leave a panel saying so, and with nothing to plot no file is written (returns None)."""
    keys = sorted({k for row in metrics_rows for k in row if k != "step"})
    panels = [
        (title, [k for k in keys if k.rsplit("/", 1)[-1] in suffixes]) for title, suffixes in TRAINING_PANELS
    ]
    series = {k: metric_series(metrics_rows, k) for _, members in panels for k in members}
    series = {k: v for k, v in series.items() if v[0]}
    if not series:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, members) in zip(axes.flat, panels, strict=True):
        present = [k for k in members if k in series]
        for key in present:
            steps, values = series[key]
            many = len(values) > 40
            if smoothing > 0 and many:
                line = ax.plot(steps, values, alpha=0.25)[0]
                ax.plot(steps, exponential_smoothing(values, smoothing), color=line.get_color(), label=key)
            else:
                ax.plot(steps, values, marker=None if many else ".", label=key)
        if present:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save(fig, out / "rm_training.png")


# ---------------------------------------------------------------------------------------------
# Writers


def json_safe(value: Any) -> Any:
    """NaN/inf become null and numpy scalars plain numbers, so rm_eval.json is strict JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_rm_eval(
    out_dir: str | Path,
    result: dict[str, Any],
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any = None,
    rejected_lengths: Any = None,
    probe_rows: Sequence[dict[str, Any]] | None = None,
) -> list[str]:
    """Write rm_eval.json, confident_errors.jsonl, the plots and (with probe rows) probes.md; return the file names.

    `result` is `evaluate_rewards(...)`; its confident errors go to confident_errors.jsonl, one per
    line, and rm_eval.json keeps their count. length_bias.png needs the response lengths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    files: list[str] = []
    summary = {k: v for k, v in result.items() if k != "confident_errors"}
    errors = result.get("confident_errors") or []
    with (out / "confident_errors.jsonl").open("w", encoding="utf-8") as handle:
        for error in errors:
            handle.write(json.dumps(json_safe(error), ensure_ascii=False) + "\n")
    summary["confident_errors"] = {"file": "confident_errors.jsonl", "count": len(errors)}
    files.append("confident_errors.jsonl")
    if "calibration" in result:
        files.append(plot_calibration(result["calibration"], out / "calibration.png").name)
    if chosen_lengths is not None and rejected_lengths is not None:
        unit = result.get("length_bias", {}).get("unit", "tokens")
        files.append(
            plot_length_bias(
                chosen, rejected, chosen_lengths, rejected_lengths, out / "length_bias.png", unit
            ).name
        )
    table = result.get("breakdown", {})
    overall = result.get("accuracy", float((chosen > rejected).mean()))
    for attribute in ("confidence", "batch"):
        groups = table.get(attribute, {})
        if groups and set(map(str, groups)) != {UNKNOWN}:  # HH has neither: a lone "unknown" bar says nothing
            title = f"Validation accuracy by {attribute} (Table 5)"
            files.append(
                plot_accuracy_bars(
                    groups, overall, title, attribute, out / f"accuracy_by_{attribute}.png"
                ).name
            )
    files.append(plot_margin_histogram(chosen, rejected, out / "margin_histogram.png").name)
    if probe_rows:
        checks = probe_checks(probe_rows)
        summary["probes"] = {"rows": list(probe_rows), "checks": checks}
        (out / "probes.md").write_text(render_probe_table_markdown(probe_rows, checks), encoding="utf-8")
        files.append("probes.md")
    summary["files"] = ["rm_eval.json", *files]
    (out / "rm_eval.json").write_text(
        json.dumps(json_safe(summary), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return summary["files"]


def headline(result: dict[str, Any]) -> str:
    """A few lines for the terminal: accuracy, loss, calibration and length bias."""
    calib, bias = result["calibration"], result["length_bias"]
    rho = bias["spearman"]
    lines = [
        f"pairs {result['pairs']}: accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f}",
        f"calibration ECE {calib['ece']:.4f} over {len(calib['bins'])} bins",
        f"reward vs length ({bias['unit']}) Spearman {rho:.3f}"
        if rho is not None
        else "reward vs length: undefined (constant)",
    ]
    if bias["humans_prefer_longer"] is not None and bias["model_prefers_longer"] is not None:
        lines.append(
            f"longer response preferred by humans {bias['humans_prefer_longer']:.1%}, by the RM {bias['model_prefers_longer']:.1%}"
        )
    return "\n".join(lines)
