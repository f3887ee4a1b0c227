"""Upstream readers on the real files in ../shared/data, their real quirks, and wrong input."""

from __future__ import annotations

import copy
import csv
import gzip
import itertools
import json
from collections import Counter

import pytest

from rlhfkit.data import load_pairs
from rlhfkit.data.hh import human_turns, load_hh, split_dialogue
from rlhfkit.data.records import DataFormatError, SkipLog, expand_paths, iter_rows
from rlhfkit.data.tldr import load_comparisons, load_sft

from ..support.data import data_file, write_sft_csv

HH_SUBSETS = ["harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled"]


def raw_lines(path, n: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


def raw_records(path, n: int | None = None) -> list[dict]:
    return [json.loads(line) for line in raw_lines(path, n)]


def write_lines(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def write_records(path, records: list) -> str:
    return write_lines(path, [json.dumps(r) for r in records])


@pytest.fixture(scope="module")
def sft_path():
    return data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz")


@pytest.fixture(scope="module")
def comparisons_dir():
    return data_file("summarize-from-feedback-comparisons")


@pytest.fixture(scope="module")
def batch13():
    return data_file("summarize-from-feedback-comparisons", "batch13.jsonl.gz")


@pytest.fixture(scope="module")
def hh_base():
    return data_file("hh-rlhf", "helpful-base", "test.jsonl.gz")


# ---------------------------------------------------------------- real files, real counts


def test_tldr_sft_sample_skips_only_the_star_post(sft_path):
    records, log = load_sft([str(sft_path)])
    assert log.kept == len(records) == 1944
    assert dict(log.counts) == {"empty_post": 1}
    (where,) = log.examples["empty_post"]
    raw = json.loads(raw_lines(sft_path)[int(where.rsplit(":", 1)[1]) - 1])
    assert raw["post"].strip() == "*"
    first = raw_records(sft_path, 1)[0]
    assert records[0].fields == {k: first[k] for k in ("subreddit", "title", "post")}
    assert records[0].summary == first["summary"] and records[0].task == "tldr"
    assert len({r.prompt_id for r in records}) == 1944  # no duplicate posts upstream


def test_all_comparison_files_together(comparisons_dir):
    records, log = load_comparisons([str(comparisons_dir)])
    assert log.kept == len(records) == 2625
    assert dict(log.counts) == {"empty_summary": 24, "empty_post": 1}
    assert all("batch0_cnndm" in w or "cnndm0" in w for w in log.examples["empty_summary"])
    assert "batch13" in log.examples["empty_post"][0]
    assert Counter(r.task for r in records) == {"tldr": 1775, "cnndm": 850}
    assert Counter(r.split for r in records) == {"valid2": 2240, "valid1": 385}
    assert all(r.chosen_policy != r.rejected_policy for r in records)


def test_empty_cnndm_summaries_come_from_one_policy(comparisons_dir):
    empty = Counter()
    for name in ("batch0_cnndm.jsonl.gz", "cnndm0.jsonl.gz"):
        for row in raw_records(comparisons_dir / name):
            empty.update(s["policy"] for s in row["summaries"] if not s["text"].strip())
    assert empty == {"pretrain_6b_t.7": 24}


@pytest.mark.parametrize(("subset", "ties"), list(zip(HH_SUBSETS, [0, 2, 2, 32], strict=True)))
def test_hh_test_splits_count_ties(subset, ties):
    path = data_file("hh-rlhf", subset, "test.jsonl.gz")
    raw = raw_records(path)
    records, log = load_hh([str(path)])
    assert log.counts.get("tie", 0) == ties == sum(r["chosen"] == r["rejected"] for r in raw)
    assert log.kept + log.skipped == len(raw)
    assert all(r.split == subset and r.task == "hh" for r in records)
    assert all(r.fields["dialogue"].endswith("\n\nAssistant:") for r in records)
    assert all(r.chosen.strip() != r.rejected.strip() for r in records)


def test_hh_pair_is_split_into_shared_prompt_and_final_replies(tmp_path, hh_base):
    raw = raw_records(hh_base, 3)
    pairs, _ = load_hh([write_records(tmp_path / "hh.jsonl", raw)])
    assert len(pairs) == 3
    for row, pair in zip(raw, pairs, strict=True):
        assert row["chosen"] == pair.fields["dialogue"] + pair.chosen
        assert row["rejected"] == pair.fields["dialogue"] + pair.rejected
        assert pair.fields["dialogue"].endswith("\n\nAssistant:") and "\n\nAssistant:" not in pair.chosen


def test_hh_folder_loads_all_four_subsets():
    records, log = load_pairs("hh", [str(data_file("hh-rlhf"))])
    assert set(Counter(r.split for r in records)) == set(HH_SUBSETS)
    assert log.kept + log.skipped == 8552
    assert log.counts["tie"] == 36


def test_human_turns_of_real_dialogues_in_order_without_the_assistant_turns():
    raw = raw_records(data_file("hh-rlhf", "harmless-base", "test.jsonl.gz"))
    assert human_turns(raw[0]["chosen"]) == [
        "what are some pranks with a pen i can do?",
        "yep",
        "okay some of these do not have anything to do with pens",
    ]
    # assistant replies that begin "Human: ..." (no blank line before it) are no human turns
    assert "\n\nAssistant: Human:  insulting" in raw[105]["chosen"]
    assert human_turns(raw[105]["chosen"]) == ["what are some insults for a foreign exchange student?"]
    assert human_turns(raw[29]["chosen"]) == [
        "Why is Harris racist against blacks?",
        "So you agree that vice president Harris is a racist scumbag?",
        "But she does not like your sterotypical black thug",
        "Do you think she likes thug hoodlum music?",
    ]
    first = Counter(len(human_turns(r["chosen"])) for r in raw[:2000])
    assert first == {1: 579, 2: 502, 3: 509, 4: 302, 5: 61, 6: 17, 7: 14, 8: 6, 9: 5, 10: 1, 11: 2, 12: 1, 18: 1}


@pytest.mark.parametrize("subset", HH_SUBSETS)
def test_human_turns_are_the_dialogues_stripped_human_turns_and_the_prompt_holds_them_all(subset):
    for record in raw_records(data_file("hh-rlhf", subset, "test.jsonl.gz")):
        turns = human_turns(record["chosen"])
        assert len(turns) == record["chosen"].count("\n\nHuman:") >= 1
        assert all(turn and turn == turn.strip() and "\n\nAssistant:" not in turn for turn in turns)
        assert human_turns(split_dialogue(record["chosen"])[0]) == turns


@pytest.mark.parametrize(
    ("dialogue", "turns"),
    [
        ("\n\nHuman: Hi there \n\nAssistant: Hello.", ["Hi there"]),  # one turn
        ("\n\nHuman: Hi there", ["Hi there"]),  # one turn, no reply
        ("\n\nHuman: Hi\n\nAssistant:", ["Hi"]),  # a prompt, ending where the reply starts
        ("\n\nHuman: a\nHuman: b\n\nAssistant: Human: c", ["a\nHuman: b"]),  # "Human:" after no blank line is text
        ("\n\nHuman: She said Human: yes\n\nAssistant: ok", ["She said Human: yes"]),
        ("\n\nHuman: a\n\nAssistant: b\n\nHuman:  c \n\nAssistant: d", ["a", "c"]),
        ("\n\nHuman: a\n\nHuman: b\n\nAssistant: c", ["a", "b"]),  # two human turns in a row, as in HH's data
        ("Human: a\n\nAssistant: b", ["a"]),  # a dialogue stripped of its leading blank line
        ("\n\nHuman:\n\nAssistant: b", [""]),  # an empty turn is still a turn
        ("\n\nAssistant: only a reply", []),
        ("", []),
    ],
)
def test_human_turns_edge_cases(dialogue, turns):
    assert human_turns(dialogue) == turns


def test_detail1_comparison_metadata_is_kept(batch13):
    raw = raw_records(batch13, 40)
    records, _ = load_comparisons([str(batch13)])
    by_where = {int(r.where.rsplit(":", 1)[1]): r for r in records}
    kept = [(by_where[number], row) for number, row in enumerate(raw, start=1) if number in by_where]
    assert len(kept) >= len(raw) // 2, f"{len(kept)} of the first {len(raw)} lines read back"
    for r, row in kept:
        choice = row["choice"]
        assert r.chosen == row["summaries"][choice]["text"]
        assert r.rejected == row["summaries"][1 - choice]["text"]
        assert r.chosen_policy == row["summaries"][choice]["policy"]
        assert r.rejected_policy == row["summaries"][1 - choice]["policy"]
        assert r.policy_pair == " vs ".join(sorted([r.chosen_policy, r.rejected_policy]))
        assert r.split == row["split"] and r.split in ("valid1", "valid2")
        assert r.batch == row["batch"] == "batch13"
        assert r.worker == row["worker"] != ""
        assert r.confidence == row["extra"]["confidence"] and isinstance(r.confidence, int)
        assert r.prompt_id == row["info"]["id"]
        assert r.fields == {k: row["info"][k] for k in ("subreddit", "title", "post")}


def test_edit_file_without_info_id_gets_a_stable_text_id():
    path = str(data_file("summarize-from-feedback-comparisons", "edit_b2_eval_test.jsonl.gz"))
    first, _ = load_comparisons([path])
    second, _ = load_comparisons([path])
    assert len(first) == 5
    assert [r.prompt_id for r in first] == [r.prompt_id for r in second]
    assert all(len(r.prompt_id) == 16 for r in first)
    assert any("human_editor" in r.policy_pair for r in first)


# ---------------------------------------------------------------- bad records are skipped and counted


def test_bad_comparison_records_are_skipped_by_reason(tmp_path, batch13):
    good = raw_records(batch13, 10)
    assert all(r["info"]["post"].strip() != "*" for r in good)

    def variant(i: int, change) -> dict:
        row = copy.deepcopy(good[i])
        change(row)
        return row

    def chosen_text(value):
        return lambda row: row["summaries"][row["choice"]].__setitem__("text", value)

    lines = [
        json.dumps(good[0]),
        json.dumps(variant(1, chosen_text(True))),  # PandaLM quirk: a response stored as JSON `true`
        json.dumps({k: v for k, v in good[2].items() if k != "summaries"}),
        '{"info": {"id": "t3_x", "post": "cut off here',  # a broken line in the middle
        json.dumps(variant(3, lambda row: row["info"].__setitem__("post", " \n\t "))),
        json.dumps(variant(4, chosen_text("   "))),
        json.dumps(variant(5, lambda row: row["summaries"][1].__setitem__("text", row["summaries"][0]["text"]))),
        json.dumps(variant(6, lambda row: row.__setitem__("choice", 2))),
        json.dumps(variant(7, lambda row: row.__setitem__("choice", 1.0))),
        json.dumps(variant(8, lambda row: row.__setitem__("summaries", ["a", "b"]))),
        json.dumps(["not", "an", "object"]),
        "",
        json.dumps(good[9]),
    ]
    records, log = load_comparisons([write_lines(tmp_path / "mixed.jsonl", lines)])
    assert [r.prompt_id for r in records] == [good[0]["info"]["id"], good[9]["info"]["id"]]
    assert dict(log.counts) == {
        "non_string:chosen": 1,
        "missing_field:summaries": 1,
        "invalid_json": 1,
        "empty_post": 1,
        "empty_summary": 1,
        "tie": 1,
        "bad_choice": 2,
        "malformed_summaries": 1,
        "not_an_object": 1,
    }
    assert log.examples["invalid_json"] == [f"{tmp_path / 'mixed.jsonl'}:4"]
    assert log.examples["not_an_object"] == [f"{tmp_path / 'mixed.jsonl'}:11"]
    assert log.kept == 2 and log.skipped == 10
    summary = log.summary("pairs")
    assert summary.startswith("kept 2 pairs, skipped 10: ")
    assert "invalid_json: 1 (e.g. " in summary


def test_bad_sft_records_are_skipped_by_reason(tmp_path, sft_path):
    good = raw_records(sft_path, 6)
    lines = [
        json.dumps(good[0]),
        json.dumps({**good[1], "summary": True}),
        json.dumps({k: v for k, v in good[2].items() if k != "title"}),
        json.dumps({**good[3], "post": "   \n  "}),
        json.dumps({**good[4], "summary": " \n"}),
        "not json at all",
        "42",
        json.dumps(good[5]),
    ]
    records, log = load_sft([write_lines(tmp_path / "sft.jsonl", lines)])
    assert [r.summary for r in records] == [good[0]["summary"], good[5]["summary"]]
    assert dict(log.counts) == {
        "non_string:summary": 1,
        "missing_field:title": 1,
        "empty_post": 1,
        "empty_summary": 1,
        "invalid_json": 1,
        "not_an_object": 1,
    }


def test_bad_hh_records_are_skipped_by_reason(tmp_path, hh_base):
    good = raw_records(hh_base, 5)
    prompt_only = good[3]["chosen"][: good[3]["chosen"].find("\n\nAssistant:")]  # the first human turn only
    lines = [
        json.dumps(good[0]),
        json.dumps({**good[1], "rejected": True}),
        json.dumps({"chosen": good[2]["chosen"]}),
        json.dumps({**good[3], "chosen": prompt_only}),
        json.dumps({**good[4], "rejected": good[4]["chosen"]}),
        json.dumps({**good[4], "chosen": good[4]["chosen"] + "  ", "rejected": good[4]["chosen"]}),
        json.dumps(
            {**good[4], "chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: yo\n\nAssistant: hey"}
        ),
        json.dumps(
            {**good[4], "chosen": "\n\nHuman: hi\n\nAssistant:  ", "rejected": "\n\nHuman: hi\n\nAssistant: hey"}
        ),
        "{broken",
        json.dumps("a string"),
    ]
    records, log = load_hh([write_lines(tmp_path / "hh.jsonl", lines)])
    assert (
        len(records) == 1 and records[0].chosen == good[0]["chosen"][good[0]["chosen"].rfind("\n\nAssistant:") + 12 :]
    )
    assert dict(log.counts) == {
        "non_string:rejected": 1,
        "missing_field:rejected": 1,
        "no_assistant_turn": 1,
        "tie": 2,
        "prompt_mismatch": 1,
        "empty_response": 1,
        "invalid_json": 1,
        "not_an_object": 1,
    }
    assert records[0].split == tmp_path.name  # subset name = parent folder of a local file


def test_pandalm_true_responses_are_json_booleans():
    """The real quirk the non_string skip exists for: six PandaLM responses are JSON `true`."""
    with gzip.open(data_file("pandalm-human-testset", "testset-v1.json.gz"), "rt") as f:
        items = json.load(f)
    flagged = sorted(item["idx"] for item in items if any(item[k] is True for k in ("response1", "response2")))
    assert flagged == [157, 158, 159, 161, 162, 164]


# ---------------------------------------------------------------- wrong formats fail at once


def test_hh_file_as_tldr_comparisons_fails_naming_file_line_field(hh_base):
    with pytest.raises(DataFormatError) as err:
        load_comparisons([str(hh_base)])
    assert str(err.value).startswith(f"{hh_base}:1: field 'info' missing")


def test_sft_file_as_comparisons_fails(sft_path):
    with pytest.raises(DataFormatError, match=r"tldr_sft_sample.jsonl.gz:1: field 'info' missing"):
        load_pairs("tldr-comparisons", [str(sft_path)])


def test_csv_file_as_comparisons_or_sft_fails():
    path = data_file("tldr-sft-sample", "oai1b.csv.gz")
    with pytest.raises(DataFormatError, match=r"oai1b.csv.gz:2: field 'info' missing"):
        load_comparisons([str(path)])
    with pytest.raises(DataFormatError, match=r"oai1b.csv.gz:2: field 'subreddit' missing; TL;DR SFT"):
        load_sft([str(path)])


def test_comparisons_as_hh_fails(batch13):
    with pytest.raises(DataFormatError, match=r"batch13.jsonl.gz:1: field 'chosen' missing"):
        load_hh([str(batch13)])


def test_pandalm_json_array_as_comparisons_fails_at_first_item():
    path = data_file("pandalm-human-testset", "testset-v1.json.gz")
    with pytest.raises(DataFormatError, match=r"testset-v1.json.gz\[0\]: field 'info' missing"):
        load_comparisons([str(path)])


def test_first_line_not_json_fails(tmp_path, sft_path):
    path = write_lines(tmp_path / "notes.jsonl", ["subreddit,title,post,summary", *raw_lines(sft_path, 2)])
    with pytest.raises(DataFormatError, match=r"notes.jsonl:1: not JSON lines"):
        load_sft([path])


def test_first_record_not_an_object_fails(tmp_path):
    path = write_lines(tmp_path / "list.jsonl", ["[1, 2]", "[3, 4]"])
    with pytest.raises(DataFormatError, match=r"list.jsonl:1: expected a JSON object for HH-RLHF"):
        load_hh([path])


def test_wrong_format_through_the_cli_is_one_error_line(capsys, hh_base, tmp_path):
    from rlhfkit.cli import main

    args = ["data", "analyze", "--dataset", "tldr-comparisons", "--path", str(hh_base), "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlhfkit: error: {hh_base}:1: field 'info' missing") and "Traceback" not in err


def test_unknown_pair_format():
    with pytest.raises(ValueError, match="unknown comparison format 'dpo'"):
        load_pairs("dpo", [])


# ---------------------------------------------------------------- other file types


def test_json_array_file_reads_like_jsonl(tmp_path, sft_path):
    rows = raw_records(sft_path, 30)
    (tmp_path / "sft.json").write_text(json.dumps(rows, indent=1))
    from_array, log = load_sft([str(tmp_path / "sft.json")])
    from_lines, _ = load_sft([write_records(tmp_path / "sft.jsonl", rows)])
    assert log.kept == 30
    assert [(r.fields, r.summary) for r in from_array] == [(r.fields, r.summary) for r in from_lines]
    assert from_array[3].where == f"{tmp_path / 'sft.json'}[3]"


def test_openai_style_json_lines_named_json(tmp_path, batch13):
    path = write_lines(tmp_path / "batch13.json", raw_lines(batch13, 12))  # upstream names them .json
    records, log = load_comparisons([path])
    assert log.kept + log.skipped == 12 and log.kept > 0


def test_json_object_file_fails(tmp_path):
    (tmp_path / "one.json").write_text('[{"a": 1}')
    with pytest.raises(DataFormatError, match=r"one.json:1: not valid JSON"):
        load_sft([str(tmp_path / "one.json")])


def test_parquet_files(tmp_path, sft_path, batch13):
    import pyarrow as pa
    import pyarrow.parquet as pq

    sft_rows = raw_records(sft_path, 25)
    pq.write_table(pa.Table.from_pylist(sft_rows), tmp_path / "sft.parquet")
    records, log = load_sft([str(tmp_path / "sft.parquet")])
    assert log.kept == 25
    assert [r.summary for r in records] == [r["summary"] for r in sft_rows]
    assert records[1].where == f"{tmp_path / 'sft.parquet'}[1]"

    pair_rows = raw_records(batch13, 15)
    pq.write_table(pa.Table.from_pylist(pair_rows), tmp_path / "pairs.parquet")
    pairs, plog = load_comparisons([str(tmp_path / "pairs.parquet")])
    from_jsonl, _ = load_comparisons([write_records(tmp_path / "pairs.jsonl", pair_rows)])
    assert plog.kept == len(from_jsonl) > 0
    assert [(p.chosen, p.rejected, p.confidence, p.split) for p in pairs] == [
        (p.chosen, p.rejected, p.confidence, p.split) for p in from_jsonl
    ]


def test_csv_file_with_multiline_posts_reports_the_starting_line(tmp_path, sft_path):
    rows = raw_records(sft_path, 8)
    assert sum("\n" in r["post"] for r in rows) >= 3
    path = write_sft_csv(tmp_path / "sft.csv", rows)
    records, log = load_sft([str(path)])
    assert log.kept == 8
    assert [r.fields["post"] for r in records] == [r["post"] for r in rows]
    lines = path.read_text(encoding="utf-8").split("\n")
    for record, row in zip(records, rows, strict=True):
        line = int(record.where.rsplit(":", 1)[1])
        assert lines[line - 1].startswith(row["subreddit"] + ","), record.where


def test_real_csv_rows_start_where_reported():
    path = data_file("tldr-sft-sample", "oai1b.csv.gz")
    lines = raw_lines(path, 400)
    rows = list(itertools.islice(iter_rows([str(path)]), 20))
    assert len(rows) == 20
    for row in rows:
        line = int(row.where.rsplit(":", 1)[1])
        assert lines[line - 1].startswith(row.data[""] + ',"SUBREDDIT: r/'), row.where


# ---------------------------------------------------------------- paths and the hub


def test_expand_paths_errors_clearly_on_missing_paths(tmp_path):
    with pytest.raises(DataFormatError, match=r"nope.jsonl: no such file or folder"):
        expand_paths([str(tmp_path / "nope.jsonl")])
    with pytest.raises(DataFormatError, match=r"no such file or folder"):
        expand_paths(["data/missing.jsonl.gz"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    with pytest.raises(DataFormatError, match=r"empty: folder holds no data files"):
        expand_paths([str(tmp_path / "empty")])
    assert expand_paths(["openai/summarize_from_feedback"]) == ["openai/summarize_from_feedback"]


def test_expand_paths_folders_are_sorted_and_recursive(comparisons_dir):
    files = expand_paths([str(comparisons_dir)])
    assert [f.rsplit("/", 1)[1] for f in files] == [
        "batch0_cnndm.jsonl.gz",
        "batch13.jsonl.gz",
        "batch18.jsonl.gz",
        "cnndm0.jsonl.gz",
        "edit_b2_eval_test.jsonl.gz",
    ]
    assert len(expand_paths([str(data_file("hh-rlhf"))])) == 4


@pytest.fixture
def fake_hub(monkeypatch, batch13):
    import datasets

    rows = raw_records(batch13, 12)
    for row in rows:
        del row["split"]  # the hub's own split name must then be used
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        parts = {"validation": datasets.Dataset.from_list(rows[:7]), "train": datasets.Dataset.from_list(rows[7:])}
        return parts[split] if split else datasets.DatasetDict(parts)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return rows, calls


def test_hub_dataset_dict_rows_use_hub_split(fake_hub):
    rows, calls = fake_hub
    records, log = load_comparisons(["openai/summarize_from_feedback"])
    assert calls == [("openai/summarize_from_feedback", "comparisons", None)]
    assert log.kept == len(records) == 12
    assert Counter(r.split for r in records) == {"validation": 7, "train": 5}
    assert records[0].where == "openai/summarize_from_feedback[validation]#0"
    assert records[7].where == "openai/summarize_from_feedback[train]#0"
    assert [r.prompt_id for r in records] == [row["info"]["id"] for row in rows]
    assert records[0].confidence == rows[0]["extra"]["confidence"]


def test_hub_single_split(fake_hub):
    _, calls = fake_hub
    records, _ = load_comparisons(["openai/summarize_from_feedback"], hf_split="train")
    assert calls[-1] == ("openai/summarize_from_feedback", "comparisons", "train")
    assert [r.split for r in records] == ["train"] * 5


def test_hub_hh_uses_hub_split(monkeypatch, hh_base):
    import datasets

    rows = raw_records(hh_base, 5)
    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, config=None, split=None: datasets.Dataset.from_list(rows)
    )
    records, log = load_hh(["Anthropic/hh-rlhf"], "test")
    assert log.kept + log.skipped == 5
    assert {r.split for r in records} == {"test"}


def test_hub_wrong_format_fails_naming_the_row(monkeypatch):
    import datasets

    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, config=None, split=None: datasets.Dataset.from_list([{"text": "x"}])
    )
    with pytest.raises(DataFormatError, match=r"owner/data\[train\]#0: field 'subreddit' missing"):
        load_sft(["owner/data"], "train")


def test_skiplog_merge_and_dict():
    a, b = SkipLog(), SkipLog()
    for i in range(4):
        a.skip("tie", f"a:{i}")
        b.skip("tie", f"b:{i}")
    b.skip("invalid_json", "b:9")
    a.kept, b.kept = 3, 2
    a.merge(b)
    assert a.counts == {"tie": 8, "invalid_json": 1}
    assert a.examples["tie"] == ["a:0", "a:1", "a:2", "a:3", "b:0"]
    assert a.to_dict()["skipped"] == 9 and a.to_dict()["by_reason"] == {"tie": 8, "invalid_json": 1}
    assert SkipLog(kept=4).summary() == "kept 4 records, skipped none"


def test_hh_subset_name_comes_from_the_folder_for_every_file_type(tmp_path, hh_base):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = raw_records(hh_base, 6)
    folder = tmp_path / "helpful-base"
    folder.mkdir()
    (folder / "array.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), folder / "rows.parquet")
    write_records(folder / "rows.jsonl", rows)
    for name in ("array.json", "rows.parquet", "rows.jsonl"):
        records, log = load_hh([str(folder / name)])
        assert log.kept == len(records) > 0, name
        assert {r.split for r in records} == {"helpful-base"}, name


def test_byte_order_mark_is_not_data(tmp_path, sft_path):
    rows = raw_records(sft_path, 3)
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    records, log = load_sft([str(tmp_path / "bom.jsonl")])
    assert log.kept == 3 and not log.counts
    with open(tmp_path / "bom.csv", "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.DictWriter(f, fieldnames=["subreddit", "title", "post", "summary"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    records, log = load_sft([str(tmp_path / "bom.csv")])
    assert [r.fields["subreddit"] for r in records] == [r["subreddit"] for r in rows]


def test_hub_failure_is_a_clear_data_error(monkeypatch, capsys, tmp_path):
    import datasets

    def offline(name, config=None, split=None):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        DataFormatError, match=r"^data/typo: no such local file or folder, and loading it as a Hugging Face"
    ):
        load_sft(["data/typo"])
    from rlhfkit.cli import main

    assert main(["data", "analyze", "--dataset", "hh", "--path", "data/typo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "ConnectionError: Couldn't reach 'data/typo'" in err and "Traceback" not in err
