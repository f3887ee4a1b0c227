"""`rlhfkit data analyze` on small real slices, every number checked against an independent recount; the generic
formats detected and printed, or named when none fits."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter

import numpy as np
import pytest

from rlhfkit.cli import main
from rlhfkit.data.analyze import run_analysis

from ..support.data import data_file
from ..support.mistakes import refusal_line

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TLDR = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
CNNDM = "Article:\n{article}\n\nTL;DR:"


def raw_lines(path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def response_tokens(tokenizer, text: str) -> int:
    """Detail 3 completion length without EOS: one leading space + stripped text."""
    return n_tokens(tokenizer, " " + text.strip())


def has_text(text) -> bool:
    return isinstance(text, str) and any(c.isalnum() for c in text)


def check_plots(folder, plots: list[str], expected: set[str]) -> None:
    assert expected <= set(plots)
    for name in plots:
        assert (folder / name).read_bytes()[:8] == PNG_MAGIC, name


@pytest.fixture(scope="module")
def comparisons_slice(tmp_path_factory):
    """First 200 TL;DR comparisons of batch13 (which include the `*` post) and 30 CNN/DM ones."""
    lines = raw_lines(data_file("summarize-from-feedback-comparisons", "batch13.jsonl.gz"), 200)
    lines += raw_lines(data_file("summarize-from-feedback-comparisons", "cnndm0.jsonl.gz"), 30)
    path = tmp_path_factory.mktemp("slice") / "comparisons.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def comparisons_analysis(comparisons_slice, tokenizer, tmp_path_factory):
    path, _ = comparisons_slice
    out = tmp_path_factory.mktemp("analysis")
    result = run_analysis("tldr-comparisons", [str(path)], tokenizer, str(out), 256, 400)
    return out, result


def kept_rows(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        body = row["info"].get("article") or row["info"].get("post")
        texts = [s["text"] for s in row["summaries"]]
        if has_text(body) and all(has_text(t) for t in texts) and texts[0].strip() != texts[1].strip():
            out.append(row)
    return out


def test_analysis_json_matches_the_returned_result(comparisons_analysis):
    out, result = comparisons_analysis
    assert json.loads((out / "analysis.json").read_text()) == json.loads(json.dumps(result))
    assert result["dataset"] == "tldr-comparisons"
    assert result["max_query_length"] == 256 and result["max_article_query_length"] == 400


def test_records_and_skips(comparisons_analysis, comparisons_slice):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)
    records = result["records"]
    assert records["kept"] == len(kept)
    assert records["kept"] + records["skipped"] == len(rows) == 230
    assert records["by_reason"]["empty_post"] == 1  # the `*` post, line 177 of batch13
    assert records["by_reason"].get("empty_summary", 0) == sum(
        not all(has_text(s["text"]) for s in row["summaries"]) for row in rows
    )


def test_detail1_detail6_counts_by_split_batch_confidence_policy_pair(comparisons_analysis, comparisons_slice):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)
    counts = result["counts"]
    assert counts["split"] == dict(Counter(r["split"] for r in kept))
    assert counts["batch"] == dict(Counter(r["batch"] for r in kept))
    assert counts["confidence"] == {str(k): v for k, v in Counter(r["extra"]["confidence"] for r in kept).items()}
    pairs = Counter(" vs ".join(sorted(s["policy"] for s in r["summaries"])) for r in kept)
    assert counts["policy_pair"] == dict(pairs)
    assert counts["task"] == {
        "tldr": sum("post" in r["info"] for r in kept),
        "cnndm": sum("article" in r["info"] for r in kept),
    }
    assert counts["distinct_prompts"] == len({r["info"]["id"] for r in kept})
    for split, n in counts["policy_pairs_distinct_by_split"].items():
        assert n == len({" vs ".join(sorted(s["policy"] for s in r["summaries"])) for r in kept if r["split"] == split})


def test_detail4_token_length_stats(comparisons_analysis, comparisons_slice, tokenizer):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)
    chosen = [response_tokens(tokenizer, r["summaries"][r["choice"]]["text"]) for r in kept]
    rejected = [response_tokens(tokenizer, r["summaries"][1 - r["choice"]]["text"]) for r in kept]
    lengths = result["token_lengths"]
    for name, values in (("chosen", chosen), ("rejected", rejected)):
        stats = lengths[name]
        assert stats["count"] == len(kept)
        assert (stats["min"], stats["max"]) == (min(values), max(values))
        assert stats["median"] == float(np.median(values))
        assert stats["mean"] == round(float(np.mean(values)), 2)
    assert lengths["query"]["max"] <= 400
    assert lengths["query_before_truncation"]["max"] > 400


def test_detail2_truncation_counts(comparisons_analysis, comparisons_slice, tokenizer):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)

    def over_budget(task: str, limit: int) -> int:
        template = TLDR if task == "tldr" else CNNDM
        key = "post" if task == "tldr" else "article"
        return sum(n_tokens(tokenizer, template.format(**r["info"])) > limit for r in kept if key in r["info"])

    by_task = result["truncation_by_task"]
    assert by_task["tldr"]["truncated"] == over_budget("tldr", 256) > 0
    assert by_task["cnndm"]["truncated"] == over_budget("cnndm", 400) > 0
    assert result["truncation"]["truncated"] == by_task["tldr"]["truncated"] + by_task["cnndm"]["truncated"]
    assert result["truncation"]["queries"] == len(kept)
    assert result["truncation"]["paragraphs_dropped"]["min"] >= 0


def test_length_bias_recomputed_independently(comparisons_analysis, comparisons_slice, tokenizer):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)
    chosen = np.array([response_tokens(tokenizer, r["summaries"][r["choice"]]["text"]) for r in kept])
    rejected = np.array([response_tokens(tokenizer, r["summaries"][1 - r["choice"]]["text"]) for r in kept])
    bias = result["length_bias"]["all"]
    assert bias["chosen_longer_fraction"] == round(float((chosen > rejected).mean()), 4)
    assert bias["chosen_shorter_fraction"] == round(float((chosen < rejected).mean()), 4)
    assert bias["equal_length_fraction"] == round(float((chosen == rejected).mean()), 4)
    assert bias["chosen_median"] == float(np.median(chosen))
    tldr = np.array(["post" in r["info"] for r in kept])
    assert result["length_bias"]["task=tldr"]["chosen_longer_fraction"] == round(
        float((chosen[tldr] > rejected[tldr]).mean()), 4
    )
    assert set(result["length_bias"]) >= {"all", "task=tldr", "task=cnndm", "split=valid1", "split=valid2"}


def test_edge_cases_table(comparisons_analysis, comparisons_slice, tokenizer):
    _, rows = comparisons_slice
    _, result = comparisons_analysis
    kept = kept_rows(rows)
    table = {row["condition"]: row for row in result["edge_cases"]}
    assert table["valid pairs"]["count"] == len(kept)
    assert table["valid pairs"]["percent"] == round(100 * len(kept) / len(rows), 2)
    assert table["ties (identical responses)"]["count"] == 0  # none in the OpenAI comparisons
    short = sum(response_tokens(tokenizer, r["summaries"][r["choice"]]["text"]) < 3 for r in kept)
    assert table["chosen too short (< 3 tokens)"]["count"] == short


def test_plots_are_png_files(comparisons_analysis):
    out, result = comparisons_analysis
    check_plots(
        out,
        result["plots"],
        {"query_lengths.png", "response_lengths.png", "length_bias.png", "counts_split.png", "counts_policy_pair.png"},
    )


@pytest.fixture(scope="module")
def hh_slice(tmp_path_factory):
    """First 260 pairs of helpful-rejection-sampled: they include a tie (line 201)."""
    lines = raw_lines(data_file("hh-rlhf", "helpful-rejection-sampled", "test.jsonl.gz"), 260)
    folder = tmp_path_factory.mktemp("hh") / "helpful-rejection-sampled"
    folder.mkdir()
    (folder / "test.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "test.jsonl", [json.loads(line) for line in lines]


def test_hh_analysis_counts_ties(hh_slice, tokenizer, tmp_path):
    path, rows = hh_slice
    result = run_analysis("hh", [str(path)], tokenizer, str(tmp_path), 512, 2047)
    ties = sum(r["chosen"] == r["rejected"] for r in rows)
    assert ties >= 1
    assert result["records"]["by_reason"]["tie"] == ties
    table = {row["condition"]: row["count"] for row in result["edge_cases"]}
    assert table["ties (identical responses)"] == ties
    assert table["valid pairs"] == result["records"]["kept"]
    assert result["counts"]["split"] == {"helpful-rejection-sampled": result["records"]["kept"]}
    assert (tmp_path / "analysis.json").is_file()
    check_plots(tmp_path, result["plots"], {"query_lengths.png", "response_lengths.png", "length_bias.png"})


def test_sft_analysis(tokenizer, tmp_path):
    lines = raw_lines(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"), 80)
    (tmp_path / "sft.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = [json.loads(line) for line in lines]
    result = run_analysis("tldr-sft", [str(tmp_path / "sft.jsonl")], tokenizer, str(tmp_path / "out"), 512, 2047)
    assert result["records"]["kept"] == 80
    assert result["counts"]["subreddit"] == dict(Counter(r["subreddit"] for r in rows))
    reference = [response_tokens(tokenizer, r["summary"]) for r in rows]
    assert result["token_lengths"]["reference"]["max"] == max(reference)
    assert result["token_lengths"]["reference"]["median"] == float(np.median(reference))
    assert "length_bias" not in result
    check_plots(
        tmp_path / "out", result["plots"], {"query_lengths.png", "response_lengths.png", "counts_subreddit.png"}
    )


def test_cli_data_analyze_prints_the_skip_summary(hh_slice, tmp_path, capsys):
    path, rows = hh_slice
    out = tmp_path / "cli-out"
    assert main(["data", "analyze", "--dataset", "hh", "--path", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "analysis.json").read_text())
    kept, skipped = result["records"]["kept"], result["records"]["skipped"]
    assert kept + skipped == len(rows)
    assert f"kept {kept} records, skipped {skipped}: " in printed
    assert "tie: " in printed and f"{path}:201" in printed
    assert f"queries truncated: {result['truncation']['truncated']} of {kept}" in printed
    assert (
        f"chosen longer than rejected in {100 * result['length_bias']['all']['chosen_longer_fraction']:.1f}%" in printed
    )
    (wrote,) = [line for line in printed.splitlines() if line.startswith("wrote ")]
    assert wrote.startswith(f"wrote {out}/analysis.json") and wrote.endswith(f" {len(result['plots'])} plots")


def test_cli_data_analyze_needs_a_path(capsys):
    assert main(["data", "analyze", "--dataset", "hh"]) == 2
    assert "needs --path" in capsys.readouterr().err


CHAT = [{"role": "user", "content": "What colour is the sky?"}]


GENERIC = [  # (records, the line `data format:` starts with, what they are read as)
    (
        [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}],
        "preference, explicit prompt, standard",
        "comparison",
    ),
    (
        [{"chosen": "Q: sky? A: blue.", "rejected": "Q: sky? A: green."}],
        "preference, implicit prompt, standard",
        "comparison",
    ),
    ([{"prompt": "The sky is", "completion": " blue."}], "prompt-completion, standard", "SFT"),
    (
        [{"prompt": CHAT, "completion": [{"role": "assistant", "content": "Blue."}]}],
        "prompt-completion, conversational",
        "SFT",
    ),
    ([{"text": "The sky is blue."}], "language-modeling, standard", "SFT"),
    ([{"prompt": "The sky is"}], "prompt-only, standard", "prompt"),
    ([{"prompt": CHAT, "answer": "blue"}], "prompt-only, conversational", "prompt"),
    ([{"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}], "gsm8k", "SFT"),  # SFT's first, as tldr-sft
]


@pytest.mark.parametrize("records, detected, read_as", GENERIC, ids=[g[1] for g in GENERIC])
def test_data_analyze_detects_and_prints_every_generic_format(
    records, detected, read_as, tiny_model_dir, tmp_path, capsys
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records * 3))
    out = tmp_path / "analysis"
    assert main(["data", "analyze", "--path", str(data), "--out", str(out), "--model", str(tiny_model_dir)]) == 0
    printed = capsys.readouterr().out
    assert f"data format: {detected}" in printed and "kept 3 records, skipped none" in printed
    result = json.loads((out / "analysis.json").read_text())
    assert result["dataset"] == "auto" and result["read_as"] == f"{read_as} data" and result["records"]["kept"] == 3


def test_data_analyze_names_the_formats_it_knows_when_none_fits(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"title": "no format has only this"}\n')
    assert (
        main(
            ["data", "analyze", "--path", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny_model_dir)]
        )
        == 2
    )
    line = refusal_line(capsys.readouterr().err)
    assert f"{data}:1: no data format has the columns title" in line and "prompt-only (prompt)" in line
    assert line.count("tldr-sft (") == 1


def test_data_analyze_help_lists_auto(capsys):
    assert main(["data", "analyze", "--help"]) == 0
    assert "default: auto" in capsys.readouterr().out
