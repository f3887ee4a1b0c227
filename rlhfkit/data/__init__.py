"""Data layer: upstream readers (TL;DR SFT, OpenAI comparisons, HH-RLHF, GSM8K), the ecosystem's generic
formats (`generic`), formats, padding, splits.

Each stage reads one role of data: SFT examples (`load_sft_data`), preference pairs (`load_pairs`) or
prompts (`load_prompts`), in a format named by its `data_format` / `prompt_format` option: a seed's
format (read as before), a generic kind, or `auto` (the options' default), detected from the first
record's columns; a seed's data detected is read by the seed's reader, as when named. The format read
is printed as one line; data in no format the role accepts fails naming its columns, and data in
another format fails naming the option (of this command or another) that reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import generic
from .formats import HH_TURN
from .generic import FieldNames
from .gsm8k import load_gsm8k, load_gsm8k_sft
from .hh import load_hh
from .records import DataFormatError, MissingColumns, Row, SkipLog, iter_rows
from .tldr import Comparison, SFTRecord, load_comparisons, load_sft

AUTO = "auto"
STANDARD_NAMES = FieldNames()


def hh_prompts(paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """HH-RLHF dialogues as prompts, one per distinct dialogue; the chosen response stands in for
    the reference summary that evaluations compare with."""
    comparisons, log = load_hh(paths, hf_split)
    unique = {c.prompt_id: SFTRecord(c.prompt_id, c.fields, c.chosen, c.where, c.task) for c in comparisons}
    return list(unique.values()), log


def is_hh_dialogue(record: dict[str, Any]) -> bool:
    """HH-RLHF's chosen response is a whole dialogue; a generic implicit-prompt pair's is not in its form."""
    return isinstance(record["chosen"], str) and record["chosen"].startswith(HH_TURN)


@dataclass(frozen=True)
class SeedFormat:
    """One of the seeds' upstream formats: the columns that identify it and its loader."""

    columns: tuple[str, ...]
    load: Callable[[list[str], str], tuple[list, SkipLog]]
    form: Callable[[dict[str, Any]], bool] = lambda record: True  # a check beyond the columns
    form_note: str = ""  # that check, as a message says it

    def fits(self, record: dict[str, Any]) -> bool:
        return all(c in record for c in self.columns) and self.form(record)

    def describe(self) -> str:
        return ", ".join(self.columns) + (f": {self.form_note}" if self.form_note else "")


TLDR_SFT = SeedFormat(("subreddit", "title", "post", "summary"), load_sft)
GSM8K_COLUMNS = ("question", "answer")  # SFT and the prompts read them, each with its own loader
HH_NOTE = "whole dialogues starting with \\n\\nHuman:"


@dataclass(frozen=True)
class Role:
    """What a stage reads: the seeds' formats by name, and the order `auto` tries them and the generic kinds in."""

    what: str  # in messages: "SFT", "comparison", "prompt"
    option: str  # the config option naming the format
    seeds: dict[str, SeedFormat]
    detection_order: tuple[str, ...]
    readers: str  # the commands that read it, as a message names them

    @property
    def names(self) -> list[str]:
        return [*self.seeds, AUTO, *(name for name in self.detection_order if name not in self.seeds)]


# Generic kinds whose prompt column none of the seeds has come first; HH before implicit-prompt
# preference, whose columns (chosen, rejected) it shares.
SFT = Role(
    "SFT",
    "data_format",
    {"tldr-sft": TLDR_SFT, "gsm8k": SeedFormat(GSM8K_COLUMNS, load_gsm8k_sft)},
    (generic.PROMPT_COMPLETION, "tldr-sft", "gsm8k", generic.LANGUAGE_MODELING),
    "rlhfkit sft",
)
PAIRS = Role(
    "comparison",
    "data_format",
    {
        "tldr-comparisons": SeedFormat(("info", "summaries", "choice"), load_comparisons),
        "hh": SeedFormat(("chosen", "rejected"), load_hh, is_hh_dialogue, HH_NOTE),
    },
    ("tldr-comparisons", "hh", generic.PREFERENCE),
    "rlhfkit rm, dpo, rm-eval and judge-eval",
)
PROMPTS = Role(
    "prompt",
    "prompt_format",
    {
        "tldr-sft": TLDR_SFT,
        "hh": SeedFormat(("chosen", "rejected"), hh_prompts, is_hh_dialogue, HH_NOTE),
        "gsm8k": SeedFormat(GSM8K_COLUMNS, load_gsm8k),
    },
    (generic.PROMPT_ONLY, "tldr-sft", "gsm8k", "hh"),
    "rlhfkit ppo, grpo, rloo, reinforce and generate",
)
ROLES = (SFT, PAIRS, PROMPTS)


def first_record(paths: list[str], hf_split: str) -> tuple[Row, dict[str, Any]]:
    """The data's first record, whose columns name its format. It is read again with the rest: cheap for
    JSON lines and the hub's cached datasets, a second parse of a JSON array or parquet file."""
    row = next(iter_rows(paths, hf_split))
    if not isinstance(row.data, dict):
        raise DataFormatError(
            f"{row.where}: expected a record with named columns (a JSON object), got {type(row.data).__name__}"
        )
    return row, {k: v for k, v in row.data.items() if k != generic.HUB_SPLIT}


def format_columns(role: Role, name: str, names: FieldNames) -> str:
    return role.seeds[name].describe() if name in role.seeds else generic.kind_columns(name, names)


def fits(role: Role, name: str, record: dict[str, Any], names: FieldNames) -> bool:
    return role.seeds[name].fits(record) if name in role.seeds else generic.layout_for(name, record, names) is not None


def detected(role: Role, record: dict[str, Any], names: FieldNames) -> str | None:
    """The first format in the role's detection order whose columns the record has (what `auto` reads)."""
    return next((name for name in role.detection_order if fits(role, name, record, names)), None)


def detect(role: Role, row: Row, record: dict[str, Any], names: FieldNames) -> str:
    found = detected(role, record, names)
    if found is None:
        accepted = "; ".join(f"{name} ({format_columns(role, name, names)})" for name in role.detection_order)
        raise MissingColumns(
            f"{row.where}: no {role.what} data format has the columns {', '.join(record) or '(none)'}; "
            f"accepted: {accepted} (see docs/data-formats.md)",
            record,
        )
    return found


def kind_of(role: Role, name: str, record: dict[str, Any], names: FieldNames) -> str:
    """A detected format as a message names it: a seed's, or a generic kind with its form."""
    if name in role.seeds:
        return f"{name} data"
    _, _, form = generic.layout_for(name, record, names).describe().partition(", ")
    return f"{name} data ({form})"


def reading_hint(role: Role, data_format: str, record: dict[str, Any], names: FieldNames) -> str:
    """What reads data whose first record is `record`, given `data_format` did not: the option of this
    command, or the commands of another role, with the format `auto` detects; "" when none does."""
    found = detected(role, record, names)
    if found is not None:
        return (
            ""
            if found == data_format
            else (
                f"; it looks like {kind_of(role, found, record, names)}: read it with "
                f"{role.option}={found} (or {role.option}={AUTO})"
            )
        )
    for other in ROLES:
        name = detected(other, record, names) if other is not role else None
        if name is not None:
            kind = kind_of(other, name, record, names)
            return f"; it looks like {kind}, which is read by {other.readers} ({other.option}={name})"
    return ""


def load_role(role: Role, data_format: str, paths: list[str], hf_split: str, names: FieldNames) -> tuple[list, SkipLog]:
    if data_format not in role.names:
        raise ValueError(f"unknown {role.what} format {data_format!r}; choose one of {', '.join(role.names)}")
    try:
        return read_role(role, data_format, paths, hf_split, names)
    except MissingColumns as e:
        raise MissingColumns(f"{e}{reading_hint(role, data_format, e.record, names)}", e.record) from None


def read_role(role: Role, data_format: str, paths: list[str], hf_split: str, names: FieldNames) -> tuple[list, SkipLog]:
    if data_format in role.seeds:  # named: read as it always was, unless it is another format's data
        require_seed_form(role, data_format, paths, hf_split, names)
        return role.seeds[data_format].load(paths, hf_split)
    row, record = first_record(paths, hf_split)
    name = detect(role, row, record, names) if data_format == AUTO else data_format
    how = "detected from" if data_format == AUTO else f"{role.option}={data_format},"
    if name in role.seeds:
        print(f"data format: {name} ({how} columns {format_columns(role, name, names)})")
        return role.seeds[name].load(paths, hf_split)
    layout = generic.layout_for(name, record, names)
    if layout is None:
        raise MissingColumns(
            f"{row.where}: {role.option}={name} reads the columns {format_columns(role, name, names)}; "
            f"the data has {', '.join(record) or '(none)'}",
            record,
        )
    print(f"data format: {layout.describe()} ({how} columns {', '.join(layout.read)})")
    return generic.read_generic(layout, paths, hf_split)


def require_seed_form(role: Role, name: str, paths: list[str], hf_split: str, names: FieldNames) -> None:
    """A named seed format whose columns another format shares (HH-RLHF's chosen and rejected) fails on a first
    record that has them in another form, as that format's data (preference pairs, whose every record the
    seed's reader would skip): `load_role` adds the option that reads it. Without another format that
    reads it, the seed's reader reads the data as it always did."""
    seed = role.seeds[name]
    if not seed.form_note:
        return
    row = next(iter_rows(paths, hf_split))
    record = row.data
    if not isinstance(record, dict) or not all(c in record for c in seed.columns) or seed.form(record):
        return
    if reading_hint(role, name, record, names):
        raise MissingColumns(
            f"{row.where}: {role.option}={name} reads {', '.join(seed.columns)} as {seed.form_note}; this record's are "
            "not",
            record,
        )


def resolved_format(role: Role, data_format: str, paths: list[str], hf_split: str, names: FieldNames) -> str:
    """The format `paths` are read in: `data_format`, or with `auto` the one detected from the first record's
    columns (what the run folder's resolved.yaml records)."""
    if data_format != AUTO:
        return data_format
    row, record = first_record(paths, hf_split)
    return detect(role, row, record, names)


def load_sft_data(
    data_format: str, paths: list[str], hf_split: str = "", names: FieldNames = STANDARD_NAMES
) -> tuple[list[SFTRecord], SkipLog]:
    """Prompts with the completion SFT trains on: TL;DR posts and summaries, GSM8K problems and solutions,
    prompt-completion or language-modeling data."""
    return load_role(SFT, data_format, paths, hf_split, names)


def load_pairs(
    data_format: str, paths: list[str], hf_split: str = "", names: FieldNames = STANDARD_NAMES
) -> tuple[list[Comparison], SkipLog]:
    """Preference pairs: OpenAI's comparisons, HH-RLHF, or preference data with an explicit or implicit prompt."""
    return load_role(PAIRS, data_format, paths, hf_split, names)


def load_prompts(
    prompt_format: str, paths: list[str], hf_split: str = "", names: FieldNames = STANDARD_NAMES
) -> tuple[list[SFTRecord], SkipLog]:
    """Prompts with a reference response: TL;DR posts with their summaries, HH-RLHF dialogues, GSM8K problems,
    prompt-only data (its completion column, when it has one, is the reference)."""
    return load_role(PROMPTS, prompt_format, paths, hf_split, names)


def usable(loaded: tuple[list, SkipLog], paths: list[str], what: str, option: str) -> tuple[list, SkipLog]:
    """`loaded` (records and their skip log) as a stage reads it; when every record was skipped, an error
    naming the data with the skip counts that say why (most often `option`, the format read, is not the data's)."""
    records, log = loaded
    if not records:
        raise DataFormatError(
            f"{', '.join(map(str, paths))}: no usable {what} ({log.summary(what)}); does {option} fit this data? "
            "(docs/data-formats.md)"
        )
    return loaded


__all__ = [
    "AUTO",
    "Comparison",
    "DataFormatError",
    "FieldNames",
    "SFTRecord",
    "SkipLog",
    "hh_prompts",
    "load_comparisons",
    "load_gsm8k",
    "load_gsm8k_sft",
    "load_hh",
    "load_pairs",
    "load_prompts",
    "load_sft",
    "load_sft_data",
    "usable",
]
