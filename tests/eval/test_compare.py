"""`rlhfkit eval`: policies compared through their samples; reward-hacking alarms."""

from __future__ import annotations

import gzip
import json

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.eval import alarms

from ..support.data import data_file
from ..support.judge_server import ProtocolServer
from ..support.mistakes import one_error_line


def test_alarm_measures_hand_values():
    assert alarms.copy_share("The cat sat on the mat", "yesterday the cat sat on the mat, again") == 1.0
    assert alarms.copy_share("a b c d e", "a b c d x") == 0.5  # (a b c d) found, (b c d e) not
    assert alarms.copy_share("too short", "too short") == 0.0  # no 4-gram at all
    assert alarms.repeated_share("a b c a b c") == 0.25  # abc bca cab abc: one repeat in four
    result = alarms.alarms(
        ["x y z w v " * 4, "fine summary here"], ["p", "q"], ["one two three", "four five six"], [True, False]
    )
    assert result["eos_rate"] == 0.5 and result["length_ratio"] == pytest.approx(23 / 6)
    assert set(result["flags"]) == {"repeated_3gram_share", "length_ratio", "eos_rate"}


@pytest.fixture(scope="module")
def posts():
    rows = []
    with gzip.open(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"), "rt") as f:
        for _, line in zip(range(12), f, strict=False):
            record = json.loads(line)
            rows.append(
                {
                    "prompt_id": str(record["row"]),
                    "query": f"TITLE: {record['title']}\n\nPOST: {record['post']}\n\nTL;DR:",
                    "reference": record["summary"].strip(),
                    "post": record["post"],
                }
            )
    return rows


def write_samples(path, posts, text_of, skip=()):
    rows = [
        {
            "prompt_id": p["prompt_id"],
            "query": p["query"],
            "reference": p["reference"],
            "text": text_of(p),
            "tokens": 10,
            "has_eos": True,
        }
        for i, p in enumerate(posts)
        if i not in skip
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prefer_best(prompt: str) -> str:
    """The judge's reply: prefers whichever shown summary is marked [best]."""
    return "Preferred: " + (
        "A" if "[best]" in prompt.split("Summary A:\n", 1)[1].split("\n\nSummary B:", 1)[0] else "B"
    )


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-eval")
    srv = ProtocolServer("openai", reply=prefer_best)
    yield srv
    srv.close()


def test_eval_win_rates_head_to_head_and_alarms(server, posts, tmp_path, capsys):
    best = write_samples(tmp_path / "best.jsonl", posts, lambda p: "[best] " + p["reference"])
    plain = write_samples(tmp_path / "plain.jsonl", posts, lambda p: p["reference"], skip={0})
    copy = write_samples(tmp_path / "copy.jsonl", posts, lambda p: " ".join(p["post"].split()[:40]))
    out = tmp_path / "eval"
    args = [
        f"samples=best={best},plain={plain},copy={copy}",
        f"judge=openai:judge-model@{server.url}",
        f"out={out}",
        f"cache_dir={tmp_path / 'cache'}",
        "timeout=5",
    ]
    assert cli_main(["eval", *args]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["prompts"] == 11  # the prompt missing from one file is left out of every comparison
    policies = result["policies"]
    assert policies["best"]["win_rate"]["rate"] == 1.0
    # without "[best]" on either side the scripted judge picks the response shown second: the same
    # seeded A/B order for plain and copy gives both the same coin-flip win rate
    assert 0 < policies["copy"]["win_rate"]["rate"] == policies["plain"]["win_rate"]["rate"] < 1
    assert policies["plain"]["rouge_l"] == pytest.approx(1.0)
    assert "copy_4gram_share" in policies["copy"]["alarms"]["flags"] and not policies["plain"]["alarms"]["flags"]
    matrix = result["head_to_head"]
    assert matrix["best"]["plain"]["rate"] == 1.0 and matrix["plain"]["best"]["rate"] == 0.0
    assert matrix["best"]["copy"]["wins"] == matrix["copy"]["best"]["losses"] == 11
    assert (
        len(policies["best"]["length_bins"]) == 6 and "win_rate_at_equal_length" in policies["best"]["length_adjusted"]
    )
    assert "win rate vs references 1.000" in capsys.readouterr().out
    assert (out / "report.html").is_file()
    calls = len(server.bodies)
    assert (
        cli_main(["eval", *args[:-2], f"cache_dir={tmp_path / 'cache'}", f"out={tmp_path / 'again'}", "timeout=5"]) == 0
    )
    assert len(server.bodies) == calls  # a repeated evaluation is served from the verdict cache


def test_eval_rejects_bad_sample_specs(tmp_path, capsys):
    assert cli_main(["eval", "samples=nonsense"]) == 2
    assert "must be name=path" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_id": "1", "text": "x"}) + "\n")
    assert cli_main(["eval", f"samples=a={bad}"]) == 2
    assert "lacks query, reference" in capsys.readouterr().err


def test_builtin_hh_suite_loads_and_bad_suites_fail_naming_the_entry(tmp_path):
    from rlhfkit.errors import ConfigError
    from rlhfkit.eval.prompt_suite import load_suite

    suite = load_suite("builtin-hh")
    assert {p.category for p in suite} == {"sycophancy", "out-of-distribution", "capability"}
    capital = next(p for p in suite if p.id == "capital-france")
    assert capital.passes("It is Paris.") and not capital.passes("Lyon") and suite[0].passes("anything") is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {id: a, category: capability, prompt: 'What is 2+2?'}\n")
    with pytest.raises(ConfigError, match="entry 1 \\(a\\): capability prompts, and only they"):
        load_suite(str(bad))


def test_prompt_suite_answers_are_compared_by_category(tiny_model_dir, tmp_path):
    import torch

    from rlhfkit.models import load_policy
    from rlhfkit.reward_models import ScalarModel

    policy, tok = load_policy(str(tiny_model_dir))
    torch.manual_seed(2)
    ScalarModel.from_policy(policy).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    answers = tmp_path / "answers.jsonl"
    assert (
        cli_main(
            [
                "generate",
                f"model={tiny_model_dir}",
                "prompt_suite=builtin-hh",
                "max_new_tokens=6",
                "temperature=0",
                f"out={answers}",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    assert (
        len(rows) == 16 and rows[0]["query"].startswith("\n\nHuman: ") and rows[0]["query"].endswith("\n\nAssistant:")
    )
    assert {r["capability_pass"] for r in rows if r["category"] != "capability"} == {None}
    out = tmp_path / "eval"
    assert cli_main(["eval", f"samples=tiny={answers}", f"reward_model={tmp_path / 'rm'}", f"out={out}"]) == 0
    result = json.loads((out / "eval.json").read_text())["policies"]["tiny"]
    assert set(result["by_category"]) == {"sycophancy", "out-of-distribution", "capability"}
    assert (
        result["by_category"]["capability"]["prompts"] == 5
        and result["by_category"]["sycophancy"]["rm_score"] is not None
    )
    assert "rouge_l" not in result and "length_ratio" not in result["alarms"]



@pytest.mark.parametrize(
    "text, line_number",
    [
        ("prompt_id,text\np1,hello\n", 1),
        ("just some notes\n", 1),
        ('{"prompt_id": "p", "query": "q", "reference": "r", "text": "t"}\nnot json\n', 2),
    ],
)
def test_eval_samples_that_are_not_json_lines_name_the_file_and_line(tmp_path, capsys, text, line_number):
    samples = tmp_path / "samples.csv"
    samples.write_text(text)
    out = tmp_path / "eval"
    line = one_error_line(["eval", f"samples=sft={samples}", f"out={out}"], capsys)
    assert f"{samples}:{line_number}: not JSON lines" in line and "rlhfkit generate" in line, line
    assert not out.exists()
