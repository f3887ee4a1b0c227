"""Reading rows from local files or the Hugging Face hub, and accounting for every skipped record.

A file in the wrong format, or a damaged one (not gzip despite its name, cut short, not UTF-8, not
parquet, empty), fails with one line (`DataFormatError` names the file, and the line and field where
known). A usable file with some bad records skips them and counts each by reason in a `SkipLog`,
which every stage prints and every analysis stores: nothing is dropped silently.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import DataFormatError

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".csv", ".csv.gz")
LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")  # json.loads joins real pairs, so any left is half of one
T = TypeVar("T")


@dataclass
class SkipLog:
    """Counts of skipped records by reason, with the first few locations of each."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    kept: int = 0
    cut: int = 0  # kept records whose completion was cut to fit max_response_length (`examples.fitted_completion`)

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
        kept = f"kept {self.kept} {what}"
        if self.cut:
            kept += f" ({self.cut} cut to fit max_response_length, without their EOS)"
        if not self.counts:
            return f"{kept}, skipped none"
        parts = ", ".join(f"{reason}: {n} (e.g. {self.examples[reason][0]})" for reason, n in self.counts.most_common())
        return f"{kept}, skipped {self.skipped}: {parts}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "cut": self.cut,
            "skipped": self.skipped,
            "by_reason": dict(self.counts.most_common()),
            "examples": self.examples,
        }


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
    """UTF-8 text; a byte-order mark (as some Windows tools write) is dropped, not read as data.

    Damage shows only when the reading gets to it (a cut-short gzip at its end, a bad byte in line
    9000), so callers read inside `reading(path)`, not just open there."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline=newline)
    return open(path, encoding="utf-8-sig", newline=newline)


@contextlib.contextmanager
def reading(path: str) -> Iterator[None]:
    """A damaged or unreadable file fails with one line naming it instead of a traceback."""
    try:
        yield
    except gzip.BadGzipFile as e:
        raise DataFormatError(f"{path}: not readable as gzip ({e}); a .gz file must be complete gzip data") from None
    except (EOFError, zlib.error) as e:
        raise DataFormatError(f"{path}: damaged or cut-short gzip data ({e}); copy or download it again") from None
    except UnicodeDecodeError as e:
        raise DataFormatError(
            f"{first_bad_utf8(path) or f'{path}: not UTF-8 text ({e.reason})'}; convert it to UTF-8"
        ) from None
    except OSError as e:
        raise DataFormatError(f"{path}: cannot read it ({e.strerror or e})") from None


def first_bad_utf8(path: str) -> str:
    """Where the first byte that is not UTF-8 is, as `file:line: not UTF-8 text (...)`: the text decoder
    reads in blocks, so its error knows neither. No UTF-8 character holds a newline byte, so each line
    decodes alone."""
    offset = 0
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                byte = f"0x{line[e.start]:02x} at byte {offset + e.start}"
                return f"{path}:{number}: not UTF-8 text ({e.reason} {byte} of the file)"
            offset += len(line)
    return ""


def decode_json(text: str) -> Any:
    """`json.loads`, with the two other ways a damaged record fails to parse (nesting deeper than
    Python's recursion limit, an integer of more than 4300 digits) raised as a JSONDecodeError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except ValueError as e:
        raise json.JSONDecodeError(str(e), text, 0) from None


@dataclass
class Unparsable:
    """Placeholder for a record that cannot be parsed in an otherwise readable file."""

    reason: str  # the SkipLog reason: invalid_json or invalid_csv
    message: str


def iter_jsonl(path: str) -> Iterator[Row]:
    first = True
    # Only "\n" ends a line: a stray "\r" in a damaged record must not split it into two.
    with reading(path), open_text(path, newline="\n") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                data = decode_json(line)
            except json.JSONDecodeError as e:
                if first:
                    raise DataFormatError(
                        f"{where}: not JSON lines ({e.msg}); expected one JSON object per line"
                    ) from None
                data = Unparsable("invalid_json", e.msg)
            yield Row(data, where, first)
            first = False


def iter_json_array(path: str) -> Iterator[Row]:
    with reading(path), open_text(path) as f:
        text = f.read()
    try:
        data = decode_json(text)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise DataFormatError(f"{path}:1: expected a JSON array of records, got {type(data).__name__}")
    for i, item in enumerate(data):
        yield Row(item, f"{path}[{i}]", i == 0)


def iter_csv(path: str) -> Iterator[Row]:
    """Rows of a CSV file; `where` is the line a row starts on (quoted fields may span lines)."""
    with reading(path), open_text(path, newline="") as f:
        reader = csv.DictReader(f)
        try:
            header = reader.fieldnames
        except csv.Error as e:
            raise DataFormatError(f"{path}:1: not a CSV header ({e})") from None
        if header is None:  # an empty file
            return
        start, first = 2, True  # the header is line 1
        while True:
            try:
                item = next(reader)
            except StopIteration:
                return
            except csv.Error as e:  # a field over csv's size limit; the reader goes on at the next row
                item = Unparsable("invalid_csv", str(e))
            yield Row(item, f"{path}:{start}", first)
            # the underlying reader's count: DictReader updates its own only after a row parses
            start, first = reader.reader.line_num + 1, False


def iter_parquet(path: str) -> Iterator[Row]:
    import pyarrow
    import pyarrow.parquet as pq

    with reading(path):
        try:
            table = pq.read_table(path)
        except pyarrow.ArrowException as e:
            raise DataFormatError(f"{path}: not a readable parquet file ({first_line(str(e))})") from None
    for i, item in enumerate(table.to_pylist()):
        yield Row(item, f"{path}[{i}]", i == 0)


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else "no message"


HUB_CONFIGS = {"openai/summarize_from_feedback": "comparisons"}


def iter_hub(dataset_id: str, split: str) -> Iterator[Row]:
    """Rows of a hub dataset (needs network or the local HF cache)."""
    import datasets

    try:
        loaded = datasets.load_dataset(dataset_id, HUB_CONFIGS.get(dataset_id), split=split or None)
    except Exception as e:  # offline, a typo, or a local path that does not exist
        raise DataFormatError(
            f"{dataset_id}: no such local file or folder, and loading it as a Hugging Face dataset failed "
            f"({type(e).__name__}: {first_line(str(e))})"
        ) from e
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(split, loaded)]
    for split_name, ds in splits:
        for i, item in enumerate(ds):
            yield Row({**item, "_hub_split": split_name}, f"{dataset_id}[{split_name}]#{i}", i == 0)


def iter_rows(paths: list[str], hf_split: str = "") -> Iterator[Row]:
    """Rows of every source in turn; a source with no records at all is an error, not a silent zero."""
    for p in expand_paths(paths):
        empty = True
        for row in source_rows(p, hf_split):
            empty = False
            yield row
        if empty:
            raise DataFormatError(f"{p}: holds no records (an empty file?)")


def source_rows(path: str, hf_split: str) -> Iterator[Row]:
    if path.endswith((".jsonl", ".jsonl.gz")):
        return iter_jsonl(path)
    if path.endswith((".json", ".json.gz")):
        return sniff_json(path)
    if path.endswith(".parquet"):
        return iter_parquet(path)
    if path.endswith((".csv", ".csv.gz")):
        return iter_csv(path)
    return iter_hub(path, hf_split)


def sniff_json(path: str) -> Iterator[Row]:
    """`.json` files are JSON arrays or, as OpenAI's comparison files are, JSON lines."""
    with reading(path), open_text(path) as f:
        head = f.read(4096).lstrip()
    return iter_json_array(path) if head.startswith("[") else iter_jsonl(path)


class MissingColumns(DataFormatError):
    """A source whose first record lacks a column of the format it is read in: most often data in another
    format, which `record` (that first record) tells."""

    def __init__(self, message: str, record: dict[str, Any]):
        super().__init__(message)
        self.record = record


def require_fields(row: Row, fields: list[str], format_name: str) -> None:
    """Fail on the first record of a source when it does not have the format's fields."""
    if not isinstance(row.data, dict):
        raise DataFormatError(f"{row.where}: expected a JSON object for {format_name}, got {type(row.data).__name__}")
    for name in fields:
        node: Any = row.data
        for part in name.split("."):
            if not isinstance(node, dict) or part not in node:
                raise MissingColumns(
                    f"{row.where}: field {name!r} missing; {format_name} records need: {', '.join(fields)}", row.data
                )
            node = node[part]


def has_text(value: Any) -> bool:
    """True for a string with at least one letter or digit (a post that is just `*` has none)."""
    return isinstance(value, str) and any(ch.isalnum() for ch in value)


def unless_lone_surrogate(record: T, where: str, log: SkipLog) -> T | None:
    """The parsed record, or None (skip counted) when a text field holds half a UTF-16 surrogate pair
    (a `\\ud83d` escape without its partner): no tokenizer and no UTF-8 file can take that text."""
    for name, value in vars(record).items():
        for key, text in value.items() if isinstance(value, dict) else [(name, value)]:
            if isinstance(text, str) and LONE_SURROGATE.search(text):
                log.skip(f"lone_surrogate:{key}", where)
                return None
    return record
