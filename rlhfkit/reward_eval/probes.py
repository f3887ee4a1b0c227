"""Probes: hand-written ladders of responses to one prompt, scored by a reward model (seed 000's
scoring examples).

A probe file (YAML, `DEFAULT_PROBES` ships TL;DR posts) lists prompts, each with ladders of responses:
a "quality" ladder is written best first, so its scores should fall; a "length" ladder holds quality
fixed and varies length, so any slope of score against words is length bias. This module parses and
validates the file (`load_probes`), lists the responses to score (`probe_items`), turns scores into a
table (`probe_table`), checks each ladder (`probe_checks`) and renders the tables as Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..errors import UserError
from .calibration import spearman
from .metrics import as_rewards

DEFAULT_PROBES = Path(__file__).resolve().parents[1] / "probes" / "tldr-probes.yaml"
PROBE_KINDS = ("quality", "length")
PROBE_TASK_FIELDS = {"tldr": ("subreddit", "title", "post"), "cnndm": ("article",), "hh": ("dialogue",)}


# ---------------------------------------------------------------------------------------------
# Probe files: parsing and validation


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
            f"{source}: {where} must be a mapping with fields {', '.join(required)} "
            f"(got {type(value).__name__})"
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
    """Read and validate a probe YAML file: a list of
    {name, task, fields, ladders: [{name, kind, responses: [{label, text}]}]}."""
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


# ---------------------------------------------------------------------------------------------
# Scores: tables, ladder checks and Markdown


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
            f"**{markdown_cell(ladder)}** ({members[0]['kind']}): "
            f"{markdown_cell(verdicts.get((probe, ladder), ''))}",
            "",
        ]
        lines += ["| # | label | words | score | response |", "|---|---|---|---|---|"]
        lines += [
            f"| {r['position'] + 1} | {markdown_cell(r['label'])} | {r['words']} | {r['score']:.2f} "
            f"| {markdown_cell(r['text'])} |"
            for r in members
        ]
        lines.append("")
    return "\n".join(lines)
