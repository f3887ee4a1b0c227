"""TL;DR SFT posts and OpenAI's TL;DR / CNN-DM human comparisons, in their upstream formats.

Detail 1: comparisons keep all their metadata (policies, batch, split, worker, confidence) so that
evaluation can break results down by each.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from .records import Row, SkipLog, Unparsable, has_text, iter_rows, require_fields, unless_lone_surrogate

SFT_FIELDS = ["subreddit", "title", "post", "summary"]
COMPARISON_FIELDS = ["info", "summaries", "choice"]


def text_id(*parts: str) -> str:
    # surrogatepass: a record with a lone surrogate gets an id too, and is skipped once parsed
    return hashlib.sha1("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass
class SFTRecord:
    """A prompt with its reference completion (TL;DR: a post and its summary)."""

    prompt_id: str
    fields: dict[str, str]  # the query template's fields (tldr: subreddit, title, post)
    summary: str  # the reference completion
    where: str
    task: str = "tldr"
    columns: dict[str, Any] = field(
        default_factory=dict
    )  # the record's other dataset columns, passed to reward functions
    cut_when_long: bool = False  # see Comparison.cut_when_long


@dataclass
class Comparison:
    """One human comparison: a prompt, the chosen and the rejected response, and its metadata."""

    prompt_id: str
    task: str  # "tldr", "cnndm" or "hh": selects the query format
    fields: dict[str, str]
    chosen: str
    rejected: str
    where: str
    chosen_policy: str = ""
    rejected_policy: str = ""
    split: str = ""
    batch: str = ""
    worker: str = ""
    confidence: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Free text whose end means nothing more than "the text ended" (the ecosystem's generic formats, HH-RLHF):
    # longer than max_response_length, SFT and DPO cut it as TRL does. A TL;DR summary stays whole or is skipped
    # (the paper's data keeps summaries within the limit, Detail 4), and so does a GSM8K solution, whose last
    # line is the answer.
    cut_when_long: bool = False

    @property
    def policy_pair(self) -> str:
        return " vs ".join(sorted([self.chosen_policy or "?", self.rejected_policy or "?"]))


def non_string(values: dict[str, Any]) -> str | None:
    """Name of the first field that is not a string (upstream quirk: a response stored as JSON `true`)."""
    return next((k for k, v in values.items() if not isinstance(v, str)), None)


def parse_sft_row(row: Row, log: SkipLog) -> SFTRecord | None:
    if isinstance(row.data, Unparsable):
        log.skip(row.data.reason, row.where)
        return None
    if row.first_in_source:
        require_fields(row, SFT_FIELDS, "TL;DR SFT (subreddit, title, post, summary)")
    data = row.data
    if not isinstance(data, dict):
        log.skip("not_an_object", row.where)
        return None
    missing = [k for k in SFT_FIELDS if k not in data]
    if missing:
        log.skip(f"missing_field:{missing[0]}", row.where)
        return None
    values = {k: data[k] for k in SFT_FIELDS}
    bad = non_string(values)
    if bad:
        log.skip(f"non_string:{bad}", row.where)
        return None
    if not has_text(values["post"]):
        log.skip("empty_post", row.where)
        return None
    if not has_text(values["summary"]):
        log.skip("empty_summary", row.where)
        return None
    prompt_id = str(data.get("id") or text_id(values["title"], values["post"]))
    record = SFTRecord(prompt_id, {k: values[k] for k in ("subreddit", "title", "post")}, values["summary"], row.where)
    return unless_lone_surrogate(record, row.where, log)


def load_sft(paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """TL;DR SFT posts from `vwxyzjn/summarize_from_feedback_tldr_3_filtered` or jsonl/parquet files."""
    log = SkipLog()
    records = [r for row in iter_rows(paths, hf_split) if (r := parse_sft_row(row, log)) is not None]
    log.kept = len(records)
    return records, log


def comparison_task(info: dict[str, Any]) -> str:
    return "cnndm" if "article" in info and info.get("article") is not None else "tldr"


def parse_comparison_row(row: Row, log: SkipLog) -> Comparison | None:
    if isinstance(row.data, Unparsable):
        log.skip(row.data.reason, row.where)
        return None
    if row.first_in_source:
        require_fields(row, COMPARISON_FIELDS, "OpenAI comparison (info, summaries[text, policy], choice, ...)")
    data = row.data
    if not isinstance(data, dict):
        log.skip("not_an_object", row.where)
        return None
    missing = next((k for k in COMPARISON_FIELDS if k not in data), None)
    if missing:
        log.skip(f"missing_field:{missing}", row.where)
        return None
    info, summaries, choice = data["info"], data["summaries"], data["choice"]
    if (
        not isinstance(info, dict)
        or not isinstance(summaries, list)
        or len(summaries) != 2
        or not all(isinstance(s, dict) for s in summaries)
    ):
        log.skip("malformed_summaries", row.where)
        return None
    if not isinstance(choice, int) or isinstance(choice, bool) or choice not in (0, 1):
        log.skip("bad_choice", row.where)
        return None
    task = comparison_task(info)
    body_key = "article" if task == "cnndm" else "post"
    fields = (
        {"article": info.get("article")}
        if task == "cnndm"
        else {k: info.get(k) for k in ("subreddit", "title", "post")}
    )
    if task == "tldr" and fields["subreddit"] is None:
        fields["subreddit"] = ""
    texts = {"chosen": summaries[choice].get("text"), "rejected": summaries[1 - choice].get("text")}
    bad = non_string({**fields, **texts})
    if bad:
        log.skip(f"non_string:{bad}", row.where)
        return None
    if not has_text(fields[body_key]):
        log.skip(f"empty_{body_key}", row.where)
        return None
    if not has_text(texts["chosen"]) or not has_text(texts["rejected"]):
        log.skip("empty_summary", row.where)
        return None
    if texts["chosen"].strip() == texts["rejected"].strip():
        log.skip("tie", row.where)
        return None
    extra = data.get("extra") or {}
    confidence = extra.get("confidence") if isinstance(extra, dict) else None
    record = Comparison(
        prompt_id=str(info.get("id") or text_id(*(fields[k] for k in sorted(fields)))),
        task=task,
        fields=fields,
        chosen=texts["chosen"],
        rejected=texts["rejected"],
        where=row.where,
        chosen_policy=str(summaries[choice].get("policy") or ""),
        rejected_policy=str(summaries[1 - choice].get("policy") or ""),
        split=str(data.get("split") or data.get("_hub_split") or ""),
        batch=str(data.get("batch") or ""),
        worker=str(data.get("worker") or ""),
        confidence=int(confidence) if is_finite_number(confidence) else None,
    )
    return unless_lone_surrogate(record, row.where, log)


def is_finite_number(value: Any) -> bool:
    """A JSON number that converts to int: not a bool, not NaN or Infinity (which json.loads accepts)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_comparisons(paths: list[str], hf_split: str = "") -> tuple[list[Comparison], SkipLog]:
    """OpenAI comparisons from `openai/summarize_from_feedback` or the upstream JSON-lines files."""
    log = SkipLog()
    records = [r for row in iter_rows(paths, hf_split) if (r := parse_comparison_row(row, log)) is not None]
    log.kept = len(records)
    return records, log
