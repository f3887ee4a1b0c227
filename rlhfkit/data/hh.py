"""Anthropic HH-RLHF: each chosen/rejected dialogue split into the shared prompt and two final replies; a
dialogue's human turns (`human_turns`)."""

from __future__ import annotations

import re
from pathlib import Path

from .formats import HH_ASSISTANT
from .records import Row, SkipLog, Unparsable, has_text, iter_rows, require_fields, unless_lone_surrogate
from .tldr import Comparison, non_string, text_id

# a turn starts at a blank line and its speaker (formats.HH_TURN, HH_ASSISTANT), or at the dialogue's start
TURN_START = re.compile(r"(?:\A|\n\n)(Human|Assistant):")


def human_turns(dialogue: str) -> list[str]:
    """The human turns of a dialogue, in order and stripped; its assistant turns are dropped. A turn starts at
    `\\n\\nHuman:` or `\\n\\nAssistant:` (or at the dialogue's start): "Human:" anywhere else is text of the turn it
    stands in, as in the assistant replies of the test splits that begin "Human: ..."."""
    parts = TURN_START.split(dialogue)  # [text before the first turn, speaker, text, speaker, text, ...]
    return [text.strip() for speaker, text in zip(parts[1::2], parts[2::2], strict=True) if speaker == "Human"]


def split_dialogue(dialogue: str) -> tuple[str, str] | None:
    """(prompt ending in "\\n\\nAssistant:", final assistant reply), or None without an assistant turn."""
    index = dialogue.rfind(HH_ASSISTANT)
    if index < 0:
        return None
    cut = index + len(HH_ASSISTANT)
    return dialogue[:cut], dialogue[cut:]


def subset_of(where: str) -> str:
    """The HH subset (harmless-base, helpful-online, ...): the folder of a local file, else ""."""
    path = re.sub(r"(:\d+|\[\d+\])$", "", where)  # file:line (JSON lines, CSV) or file[index] (array, parquet)
    return Path(path).parent.name if Path(path).is_file() else ""


def parse_hh_row(row: Row, log: SkipLog) -> Comparison | None:
    if isinstance(row.data, Unparsable):
        log.skip(row.data.reason, row.where)
        return None
    if row.first_in_source:
        require_fields(row, ["chosen", "rejected"], "HH-RLHF (chosen, rejected dialogues)")
    data = row.data
    if not isinstance(data, dict):
        log.skip("not_an_object", row.where)
        return None
    missing = next((k for k in ("chosen", "rejected") if k not in data), None)
    if missing:
        log.skip(f"missing_field:{missing}", row.where)
        return None
    bad = non_string({"chosen": data["chosen"], "rejected": data["rejected"]})
    if bad:
        log.skip(f"non_string:{bad}", row.where)
        return None
    chosen, rejected = split_dialogue(data["chosen"]), split_dialogue(data["rejected"])
    if chosen is None or rejected is None:
        log.skip("no_assistant_turn", row.where)
        return None
    if chosen[0] != rejected[0]:
        log.skip("prompt_mismatch", row.where)
        return None
    if not has_text(chosen[1]) or not has_text(rejected[1]):
        log.skip("empty_response", row.where)
        return None
    if chosen[1].strip() == rejected[1].strip():
        log.skip("tie", row.where)
        return None
    record = Comparison(
        prompt_id=text_id(chosen[0]),
        task="hh",
        fields={"dialogue": chosen[0]},
        chosen=chosen[1],
        rejected=rejected[1],
        where=row.where,
        split=str(data.get("_hub_split") or subset_of(row.where)),
        cut_when_long=True,
    )
    return unless_lone_surrogate(record, row.where, log)


def load_hh(paths: list[str], hf_split: str = "") -> tuple[list[Comparison], SkipLog]:
    """HH-RLHF pairs from `Anthropic/hh-rlhf` or its jsonl.gz files."""
    log = SkipLog()
    records = [r for row in iter_rows(paths, hf_split) if (r := parse_hh_row(row, log)) is not None]
    log.kept = len(records)
    return records, log
