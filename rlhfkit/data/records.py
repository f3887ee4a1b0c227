"""Reading rows from local files or the Hugging Face hub, and accounting for every skipped record.

A file in the wrong format fails at once (`DataFormatError` names the file, line and field).
A usable file with some bad records skips them and counts each by reason in a `SkipLog`, which
every stage prints and every analysis stores: nothing is dropped silently.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataFormatError

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".csv", ".csv.gz")




@dataclass
class SkipLog:
    """Counts of skipped records by reason, with the first few locations of each."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    kept: int = 0

    def skip(self, reason: str, where: str) -> None:
        self.counts[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 5:
            self.examples[reason].append(where)

    def merge(self, other: SkipLog) -> None:
        self.counts.update(other.counts)
        for reason, places in other.examples.items():
            self.examples.setdefault(reason, [])
            self.examples[reason].extend(places[: 5 - len(self.examples[reason])])

    @property
    def skipped(self) -> int:
        return sum(self.counts.values())

    def summary(self, what: str = "records") -> str:
        if not self.counts:
            return f"kept {self.kept} {what}, skipped none"
        parts = ", ".join(f"{reason}: {n} (e.g. {self.examples[reason][0]})" for reason, n in self.counts.most_common())
        return f"kept {self.kept} {what}, skipped {self.skipped}: {parts}"

    def to_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "skipped": self.skipped, "by_reason": dict(self.counts.most_common()), "examples": self.examples}


@dataclass
class Row:
    """One raw record and where it came from (`file:line` or `hub-id[split]#index`)."""

    data: Any
    where: str
    first_in_source: bool


def expand_paths(paths: list[str]) -> list[str]:
    """Files and folders (searched recursively for supported suffixes); other strings are hub ids."""
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
            if not found:
                raise DataFormatError(f"{p}: folder holds no data files ({', '.join(SUFFIXES)})")
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        elif looks_like_hub_id(p):
            out.append(p)
        else:
            raise DataFormatError(f"{p}: no such file or folder (and not a Hugging Face dataset id like owner/name)")
    return out


def looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.endswith(SUFFIXES) and not text.startswith((".", "/"))


def open_text(path: str, newline: str | None = None) -> io.TextIOBase:
    """UTF-8 text; a byte-order mark (as some Windows tools write) is dropped, not read as data."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline=newline)
    return open(path, encoding="utf-8-sig", newline=newline)


def iter_jsonl(path: str) -> Iterator[Row]:
    first = True
    with open_text(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                if first:
                    raise DataFormatError(f"{where}: not JSON lines ({e.msg}); expected one JSON object per line") from None
                data = InvalidJSON(str(e.msg))
            yield Row(data, where, first)
            first = False


@dataclass
class InvalidJSON:
    """Placeholder for a line that is not JSON in an otherwise valid JSON-lines file."""

    message: str


def iter_json_array(path: str) -> Iterator[Row]:
    with open_text(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise DataFormatError(f"{path}:1: expected a JSON array of records, got {type(data).__name__}")
    for i, item in enumerate(data):
        yield Row(item, f"{path}[{i}]", i == 0)


def iter_csv(path: str) -> Iterator[Row]:
    """Rows of a CSV file; `where` is the line a row starts on (quoted fields may span lines)."""
    with open_text(path, newline="") as f:
        reader = csv.DictReader(f)
        start = 2  # the header is line 1 (fieldnames are read lazily, before the first row)
        for i, item in enumerate(reader):
            yield Row(item, f"{path}:{start}", i == 0)
            start = reader.line_num + 1


def iter_parquet(path: str) -> Iterator[Row]:
    import pyarrow.parquet as pq

    for i, item in enumerate(pq.read_table(path).to_pylist()):
        yield Row(item, f"{path}[{i}]", i == 0)


HUB_CONFIGS = {"openai/summarize_from_feedback": "comparisons"}


def iter_hub(dataset_id: str, split: str) -> Iterator[Row]:
    """Rows of a hub dataset (needs network or the local HF cache)."""
    import datasets

    try:
        loaded = datasets.load_dataset(dataset_id, HUB_CONFIGS.get(dataset_id), split=split or None)
    except Exception as e:  # offline, a typo, or a local path that does not exist
        raise DataFormatError(
            f"{dataset_id}: no such local file or folder, and loading it as a Hugging Face dataset failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'})"
        ) from e
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(split, loaded)]
    for split_name, ds in splits:
        for i, item in enumerate(ds):
            yield Row({**item, "_hub_split": split_name}, f"{dataset_id}[{split_name}]#{i}", i == 0)


def iter_rows(paths: list[str], hf_split: str = "") -> Iterator[Row]:
    for p in expand_paths(paths):
        if p.endswith((".jsonl", ".jsonl.gz")):
            yield from iter_jsonl(p)
        elif p.endswith((".json", ".json.gz")):
            yield from sniff_json(p)
        elif p.endswith(".parquet"):
            yield from iter_parquet(p)
        elif p.endswith((".csv", ".csv.gz")):
            yield from iter_csv(p)
        else:
            yield from iter_hub(p, hf_split)


def sniff_json(path: str) -> Iterator[Row]:
    """`.json` files are JSON arrays or, as OpenAI's comparison files are, JSON lines."""
    with open_text(path) as f:
        head = f.read(4096).lstrip()
    return iter_json_array(path) if head.startswith("[") else iter_jsonl(path)


def require_fields(row: Row, fields: list[str], format_name: str) -> None:
    """Fail on the first record of a source when it does not have the format's fields."""
    if not isinstance(row.data, dict):
        raise DataFormatError(f"{row.where}: expected a JSON object for {format_name}, got {type(row.data).__name__}")
    for name in fields:
        node: Any = row.data
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise DataFormatError(
                    f"{row.where}: field {name!r} missing; {format_name} records need: {', '.join(fields)}"
                )
            node = node[part]


def has_text(value: Any) -> bool:
    """True for a string with at least one letter or digit (a post that is just `*` has none)."""
    return isinstance(value, str) and any(ch.isalnum() for ch in value)
