"""Damaged input: a damaged file fails with one line naming it, a damaged record is skipped and counted.

The property test mutates real records of the three upstream formats (fields removed, wrong types,
empty, huge and odd strings, lone surrogates, nested garbage, lines that are not JSON) and checks
that every line is either kept or counted as skipped, and that nothing but a one-line
`DataFormatError` (for a damaged first record, which decides the format) is ever raised.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import random
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfkit.data import load_comparisons, load_hh, load_pairs, load_sft
from rlhfkit.data.records import DataFormatError

from ..support.data import data_file, write_sft_csv

SOURCES = {
    "tldr-sft": ("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"),
    "tldr-comparisons": ("summarize-from-feedback-comparisons", "batch18.jsonl.gz"),
    "hh": ("hh-rlhf", "helpful-base", "test.jsonl.gz"),
}
SAMPLE_SIZE = 20


def raw_lines(fmt: str, n: int) -> list[str]:
    with gzip.open(data_file(*SOURCES[fmt]), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, tuple[list, set[int]]]:
    """Per format: the first real records, and the indexes of those the loader keeps as they are."""
    folder = tmp_path_factory.mktemp("samples")
    out = {}
    for fmt, loader in [("tldr-sft", load_sft), ("tldr-comparisons", load_comparisons), ("hh", load_hh)]:
        lines = raw_lines(fmt, SAMPLE_SIZE)
        path = folder / f"{fmt}.jsonl"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        kept, _ = loader([str(path)])
        out[fmt] = [json.loads(line) for line in lines], {line_number(r.where) - 1 for r in kept}
    return out


def line_number(where: str) -> int:
    return int(where.rsplit(":", 1)[1])


def assert_one_line_naming(error: Exception, path) -> None:
    message = str(error)
    assert message.startswith(f"{path}:") and "\n" not in message and "\r" not in message, message


def assert_usable(record) -> None:
    """Every text a kept record holds can be tokenised and written as UTF-8 (`cut_when_long`, the one flag a
    record carries, says how its format fits a long completion: it is no text)."""
    for name, value in vars(record).items():
        if name == "cut_when_long":
            assert isinstance(value, bool)
            continue
        texts = value.values() if isinstance(value, dict) else [value]
        for text in texts:
            if isinstance(text, str):
                text.encode("utf-8")
            else:
                assert text is None or isinstance(text, int) and not isinstance(text, bool), (name, text)


# ---------------------------------------------------------------- strategies for damaged records

# Control and format characters, lone surrogates, line and paragraph separators, a right-to-left
# override, a combining accent, a BOM, non-characters, the top code point and an emoji.
ODD_CHARS = [
    "\x00",
    "\x1b",
    "\r",
    "\t",
    "\x85",
    "\u2028",
    "\u2029",
    "\u202e",
    "\u0301",
    "\ufeff",
    "\uffff",
    "\U0010ffff",
    "\U0001f600",
    "\ud800",
    "\udbff",
    "\udc00",
    "\ud83d",
    "é",
    "a",
    "Z",
    "7",
    " ",
    "\n",
    '"',
    "\\",
]
odd_text = st.text(alphabet=st.sampled_from(ODD_CHARS), max_size=30)
huge_text = st.sampled_from(["x" * 300_000, "word " * 60_000, "\U0001f600" * 100_000, "\x00" * 200_000])
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.just(""),
    odd_text,
    huge_text,
)
junk = st.recursive(
    leaf, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(odd_text, kids, max_size=3), max_leaves=8
)
# Lines no JSON encoder writes: a stray "\r", bytes that are not JSON, nesting deeper than the parser's
# recursion limit, an integer past Python's 4300-digit limit.
RAW_LINES = [
    "[" * 50_000,
    '{"a": ' * 3_000 + "1" + "}" * 3_000,
    '{"post": ' + "9" * 5_000 + "}",
    "\x00\x00\x00",
    "{'single': 'quotes'}",
]
raw_alphabet = [c for c in ODD_CHARS if c != "\n" and not "\ud800" <= c <= "\udfff"] + list(
    "{}[]:,0123456789.etrufalsn"
)
raw_line = st.one_of(
    st.sampled_from(RAW_LINES),
    st.text(alphabet=st.sampled_from(raw_alphabet), min_size=1, max_size=60).filter(str.strip),
)


def paths_in(node, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a JSON value: ("info", "post"), ("summaries", 0, "text"), ..."""
    if isinstance(node, dict):
        children = list(node.items())
    elif isinstance(node, list):
        children = list(enumerate(node))
    else:
        return []
    return [p for key, child in children for p in [(*prefix, key), *paths_in(child, (*prefix, key))]]


def dumped(value, escape: bool) -> str:
    line = json.dumps(value, ensure_ascii=escape)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate can only be written as a \u escape
        line = json.dumps(value)
    return line


def damaged_line(record: dict, data) -> str:
    kind = data.draw(st.sampled_from(["drop", "replace", "replace", "whole", "cut", "raw"]))
    escape = data.draw(st.booleans())
    if kind == "whole":
        return dumped(data.draw(junk), escape)
    if kind == "raw":
        return data.draw(raw_line)
    text = dumped(record, escape)
    if kind == "cut":
        return text[: data.draw(st.integers(1, len(text) - 1))]
    record = copy.deepcopy(record)
    *parents, last = data.draw(st.sampled_from(paths_in(record)))
    node = record
    for key in parents:
        node = node[key]
    if kind == "drop":
        del node[last]
    else:
        node[last] = data.draw(junk)
    return dumped(record, escape)


LOADERS = {
    "load_sft": ("tldr-sft", load_sft),
    "load_comparisons": ("tldr-comparisons", load_comparisons),
    "load_pairs-tldr": ("tldr-comparisons", partial(load_pairs, "tldr-comparisons")),
    "load_hh": ("hh", load_hh),
    "load_pairs-hh": ("hh", partial(load_pairs, "hh")),
}


@pytest.mark.parametrize("loader_name", LOADERS)
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_line_of_damaged_records_is_kept_or_counted(samples, tmp_path, loader_name, data):
    fmt, loader = LOADERS[loader_name]
    records, keepable = samples[fmt]
    picks = data.draw(st.lists(st.tuples(st.integers(0, len(records) - 1), st.booleans()), min_size=1, max_size=8))
    lines = [damaged_line(records[i], data) if damage else dumped(records[i], True) for i, damage in picks]
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    try:
        kept, log = loader([str(path)])
    except DataFormatError as e:  # only the first record decides that the file is in the wrong format
        assert picks[0][1], str(e)
        assert_one_line_naming(e, path)
        return
    assert log.kept == len(kept)
    assert log.kept + log.skipped == len(lines), log.summary()
    intact = {number for number, (i, damage) in enumerate(picks, start=1) if not damage and i in keepable}
    assert intact <= {line_number(r.where) for r in kept}
    for record in kept:
        assert_usable(record)
    assert all(line_number(w) <= len(lines) for places in log.examples.values() for w in places)


# ---------------------------------------------------------------- damaged records, one of each


def test_each_damaged_record_is_one_skip_and_later_lines_keep_their_numbers(tmp_path, samples):
    records, _ = samples["tldr-comparisons"]
    first, good = json.dumps(records[0]), json.dumps(records[1])
    nan_confidence = json.dumps({**records[2], "extra": {"confidence": float("nan")}})
    lone_surrogate = json.dumps(
        {**records[3], "summaries": [{**s, "text": s["text"] + " \ud83d"} for s in records[3]["summaries"]]}
    )
    lines = [
        first,
        "[" * 50_000,
        '{"choice": ' + "1" * 5_000 + "}",
        good[:40] + "\r" + good[40:80],
        lone_surrogate,
        nan_confidence,
        good,
    ]
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    kept, log = load_comparisons([str(path)])
    assert dict(log.counts) == {"invalid_json": 3, "lone_surrogate:chosen": 1}
    assert [line_number(r.where) for r in kept] == [1, 6, 7]
    assert kept[1].confidence is None


def test_csv_field_over_the_size_limit_skips_that_row_only(tmp_path, samples):
    rows = [
        {k: str(v).replace("\n", " ") for k, v in row.items()} for row in samples["tldr-sft"][0][:3]
    ]  # one line each
    rows[1]["post"] = "word " * 40_000  # csv refuses fields over 128 KiB
    path = write_sft_csv(tmp_path / "posts.csv", rows)
    kept, log = load_sft([str(path)])
    assert dict(log.counts) == {"invalid_csv": 1} and log.examples["invalid_csv"] == [f"{path}:3"]
    assert [r.summary for r in kept] == [rows[0]["summary"], rows[2]["summary"]]
    assert kept[1].where == f"{path}:4"


# ---------------------------------------------------------------- damaged files


def jsonl_bytes() -> bytes:
    return "".join(line + "\n" for line in raw_lines("tldr-sft", 200)).encode("utf-8")


def parquet_bytes(tmp_path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([json.loads(line) for line in raw_lines("tldr-sft", 200)]), tmp_path / "whole.parquet"
    )
    return (tmp_path / "whole.parquet").read_bytes()


def flipped(data: bytes) -> bytes:
    """`data` with 8 bytes in its middle overwritten."""
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 8]) + data[middle + 8 :]


def latin1_in_line(line: int) -> bytes:
    lines = jsonl_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1].replace(b'"summary": "', b'"summary": "caf\xe9 ', 1)
    return b"\n".join(lines)


DAMAGED_FILES = {
    "not-gzip.jsonl.gz": lambda tmp: jsonl_bytes(),
    "not-gzip.json.gz": lambda tmp: jsonl_bytes(),
    "truncated.jsonl.gz": lambda tmp: gzip.compress(jsonl_bytes())[:5_000],
    "damaged.jsonl.gz": lambda tmp: flipped(gzip.compress(jsonl_bytes())),
    "truncated.csv.gz": lambda tmp: gzip.compress(b"subreddit,title,post,summary\n" + b"a,b,c,d\n" * 20_000)[:300],
    "garbage.parquet": lambda tmp: random.Random(0).randbytes(4_096),
    "truncated.parquet": lambda tmp: parquet_bytes(tmp)[:-100],
    "empty.jsonl": lambda tmp: b"",
    "blank-lines.jsonl": lambda tmp: b"\n\n  \n",
    "empty.jsonl.gz": lambda tmp: b"",
    "empty-gzip.jsonl.gz": lambda tmp: gzip.compress(b""),
    "empty.parquet": lambda tmp: b"",
    "empty-array.json": lambda tmp: b"[]",
    "header-only.csv": lambda tmp: b"subreddit,title,post,summary\n",
    "huge-header.csv": lambda tmp: b"subreddit,title,post," + b"x" * 200_000 + b"\na,b,c,d\n",
    "utf16.jsonl": lambda tmp: jsonl_bytes().decode("utf-8").encode("utf-16"),
    "latin1-at-line-150.jsonl": lambda tmp: latin1_in_line(150),
    "random-bytes.jsonl": lambda tmp: random.Random(1).randbytes(4_096),
    "random-bytes.csv": lambda tmp: random.Random(2).randbytes(4_096),
    "random-bytes.json": lambda tmp: b"[" + random.Random(3).randbytes(4_096),
}


@pytest.mark.parametrize("name", DAMAGED_FILES)
def test_damaged_file_fails_with_one_line_naming_it(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(DAMAGED_FILES[name](tmp_path))
    with pytest.raises(DataFormatError) as err:
        load_sft([str(path)])
    assert_one_line_naming(err.value, path)


def test_damaged_file_in_a_folder_is_named_not_the_folder(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes())
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes())[:5_000])
    with pytest.raises(DataFormatError, match=r"b\.jsonl\.gz: damaged or cut-short gzip data") as err:
        load_sft([str(tmp_path)])
    assert_one_line_naming(err.value, tmp_path / "b.jsonl.gz")


def test_cli_exits_2_with_one_line_for_a_file_that_is_not_gzip(tmp_path, capsys):
    from rlhfkit.cli import main

    path = tmp_path / "comparisons.jsonl.gz"
    path.write_text("\n".join(raw_lines("tldr-comparisons", 5)) + "\n", encoding="utf-8")
    code = main(["rm", f"data={path}", "data_format=tldr-comparisons", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"rlhfkit: error: {path}: not readable as gzip"), err


@pytest.mark.parametrize("name", ["posts.jsonl", "posts.jsonl.gz", "posts.json"])
def test_a_byte_that_is_not_utf8_is_named_by_its_line_and_offset(ppo_dirs, tmp_path, name):
    lines = ppo_dirs["posts"].read_bytes().split(b"\n")[:6]
    if name.endswith(".json"):  # a JSON array, one record a line
        lines = [b"[" + lines[0] + b","] + [line + b"," for line in lines[1:-1]] + [lines[-1] + b"]"]
    lines[3] = lines[3].replace(b"the", b"th\xff\xfe", 1)
    raw = b"\n".join(lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    offset = raw.index(b"\xff")
    with pytest.raises(DataFormatError) as raised:
        load_sft([str(path)])
    assert (
        str(raised.value)
        == f"{path}:4: not UTF-8 text (invalid start byte 0xff at byte {offset} of the file); convert it to UTF-8"
    )
