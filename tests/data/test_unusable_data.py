"""Data with nothing to train on: every record skipped, or none at all. Training, evaluation and `data analyze`
each say why in one line with exit code 2, before anything is written; no examples left after
tokenization names the reason and the length option to raise."""

from __future__ import annotations

import re

import pytest

from ..support.data import write_rows
from ..support.mistakes import one_error_line
from ..support.tiny import cli_args, command, stage_args

PLAIN_PAIRS = [
    {"chosen": f"\n\nHuman: A good question {i}?", "rejected": f"\n\nHuman: A bad one {i}?"} for i in range(6)
]  # HH-RLHF dialogues without an assistant turn (pairs in another format fail naming it: test_format_options.py)
STARS = [{"subreddit": "a", "title": "t", "post": "*", "summary": "s"} for _ in range(6)]  # posts with no text


@pytest.mark.parametrize(
    "stage, data, options, expected",
    [
        ("sft", STARS, {}, "no usable examples (kept 0 examples, skipped 6: empty_post: 6"),
        ("rm", PLAIN_PAIRS, {"data_format": "hh"}, "no usable pairs (kept 0 pairs, skipped 6: no_assistant_turn: 6"),
        ("dpo", PLAIN_PAIRS, {"data_format": "hh"}, "no usable pairs (kept 0 pairs, skipped 6: no_assistant_turn: 6"),
        (
            "ppo",
            PLAIN_PAIRS,
            {"prompt_format": "hh"},
            "no usable prompts (kept 0 prompts, skipped 6: no_assistant_turn: 6",
        ),
        (
            "rloo",
            PLAIN_PAIRS,
            {"prompt_format": "hh"},
            "no usable prompts (kept 0 prompts, skipped 6: no_assistant_turn: 6",
        ),
    ],
)
def test_training_on_data_whose_every_record_is_skipped_says_why(
    ppo_dirs, tmp_path, capsys, stage, data, options, expected
):
    path = write_rows(tmp_path / "data.jsonl", data)
    out = tmp_path / "run"
    line = one_error_line(command(stage, ppo_dirs, out, data=path, **options), capsys)
    assert line.startswith(f"rlhfkit: error: {path}: {expected}"), line
    assert not out.exists()


def test_evaluating_on_data_whose_every_record_is_skipped_says_why(ppo_dirs, tmp_path, capsys):
    path = write_rows(tmp_path / "pairs.jsonl", PLAIN_PAIRS)
    expected = f"rlhfkit: error: {path}: no usable pairs (kept 0 pairs, skipped 6: no_assistant_turn: 6"
    for argv in (
        ["rm-eval", f"model={ppo_dirs['rm']}", f"out={tmp_path / 'out'}"],
        ["judge-eval", f"judge=rm:{ppo_dirs['rm']}", f"out={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}"],
    ):
        assert one_error_line([*argv, f"data={path}", "data_format=hh"], capsys).startswith(expected)
    line = one_error_line(
        [
            "generate",
            f"model={ppo_dirs['policy']}",
            f"data={path}",
            "prompt_format=hh",
            f"out={tmp_path / 'out' / 's.jsonl'}",
        ],
        capsys,
    )
    assert line.startswith(f"rlhfkit: error: {path}: no usable prompts (kept 0 prompts, skipped 6"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_analyze_exits_2_when_no_record_is_usable(ppo_dirs, tmp_path, capsys):
    path = write_rows(tmp_path / "pairs.jsonl", PLAIN_PAIRS)
    out = tmp_path / "analysis"
    line = one_error_line(
        [
            "data",
            "analyze",
            "--path",
            str(path),
            "--dataset",
            "hh",
            "--model",
            str(ppo_dirs["policy"]),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert line.startswith(f"rlhfkit: error: {path}: no usable pairs (kept 0 pairs, skipped 6: no_assistant_turn: 6"), (
        line
    )
    assert not out.exists()



@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_an_empty_data_is_refused_before_anything_is_written(ppo_dirs, tmp_path, capsys, stage):
    """5.2: `data=$UNSET` on the command line, `data=[]` from Python; nothing is left to block the corrected command."""
    import rlhfkit
    from rlhfkit.errors import ConfigError

    out = tmp_path / "run"
    expected = "data= is empty: give a file, folder, hub id or in-memory data (was it an unset shell variable?)"
    assert one_error_line(command(stage, ppo_dirs, out, data=""), capsys) == f"rlhfkit: error: {expected}"
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        getattr(rlhfkit, stage)(**stage_args(stage, ppo_dirs, out, max_steps=1, data=[]))
    assert not out.exists()


NOTHING_LEFT = [  # (stage, options that let no example in, what is left, the reason, the option to raise)
    ("sft", {"max_response_length": 4}, "training examples", "response_too_long", "max_response_length"),
    ("rm", {"max_response_length": 2}, "training pairs", "response_too_long", "max_response_length"),
    (
        "dpo",
        {"max_query_length": 24},
        "training pairs",
        "query_too_long",
        "max_query_length",
    ),  # the template alone is 23
    ("grpo", {"max_query_length": 24}, "training prompts", "query_too_long", "max_query_length"),
]


@pytest.mark.parametrize(
    ("stage", "options", "what", "reason", "option"), NOTHING_LEFT, ids=[c[0] for c in NOTHING_LEFT]
)
def test_no_examples_left_names_the_reason_and_the_option_to_raise(
    ppo_dirs, tmp_path, capsys, stage, options, what, reason, option
):
    args = stage_args(stage, ppo_dirs, tmp_path / "run", max_steps=1, **options)
    line = one_error_line([stage, *cli_args(args)], capsys)
    assert re.fullmatch(
        rf"rlhfkit: error: no {what} left to train on \(kept 0 {what}, skipped (\d+): {reason}: \1 \(e\.g\. .+\)\); "
        rf"raise {option}",
        line,
    ), line
