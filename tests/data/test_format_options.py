"""The options that choose a data format (data_format, prompt_format): data in another format fails in one
line naming the option, and the value, that reads it; each option's help names every other format."""

from __future__ import annotations

import json
import re

import pytest

from rlhfkit.cli import main as cli_main

from ..support.mistakes import one_error_line
from ..support.tiny import cli_args, stage_args

POST = (
    "My roommate keeps eating my food even though we agreed on separate shelves in the fridge. I labelled "
    "everything and talked to him twice, but nothing changed and now I am buying groceries twice a week."
)


def write_rows(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def pref_rows(n=8):
    return [
        {"prompt": f"Post {i}\nTL;DR:", "chosen": f" short {i}", "rejected": f" long summary {i}"} for i in range(n)
    ]


def user_turn(i):
    return [{"role": "user", "content": f"Summarize post {i}"}]


def implicit_pref_rows(n=8):
    return [
        {"chosen": f"Post {i}\nTL;DR: short {i}", "rejected": f"Post {i}\nTL;DR: long summary {i}"} for i in range(n)
    ]


def tldr_posts(n=8):
    return [{"subreddit": "tifu", "title": f"Title {i}", "post": POST, "summary": f"Summary {i}"} for i in range(n)]


# a seed format named for data in another: the seed reader's error ends naming the option that reads the data
FORMAT_ERRORS = [  # (stage, the format option, rows, fragment the one error line holds)
    (
        "rm",
        {"data_format": "tldr-comparisons"},
        pref_rows(),
        "field 'info' missing; OpenAI comparison (info, summaries[text, policy], choice, ...) records need: info, "
        "summaries, choice; it looks like preference data (explicit prompt, standard): read it with "
        "data_format=preference (or data_format=auto)",
    ),
    (
        "dpo",
        {"data_format": "hh"},
        implicit_pref_rows(),
        "data_format=hh reads chosen, rejected as whole dialogues starting with \\n\\nHuman:; this record's are not; "
        "it looks like preference data (implicit prompt, standard): read it with data_format=preference (or "
        "data_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"prompt": f"Post {i}\nTL;DR:"} for i in range(8)],
        "it looks like prompt-only data (standard): read it with prompt_format=prompt-only (or prompt_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"prompt": user_turn(i)} for i in range(8)],
        "it looks like prompt-only data (conversational): read it with prompt_format=prompt-only (or "
        "prompt_format=auto)",
    ),
    (
        "ppo",
        {"prompt_format": "gsm8k"},
        tldr_posts(),
        "field 'question' missing; gsm8k records need: question, answer; it looks like tldr-sft data: read it with "
        "prompt_format=tldr-sft (or prompt_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(8)],
        "it looks like gsm8k data: read it with prompt_format=gsm8k (or prompt_format=auto)",
    ),
    (
        "rloo",
        {"prompt_format": "hh"},
        implicit_pref_rows(),
        "prompt_format=hh reads chosen, rejected as whole dialogues starting with \\n\\nHuman:; this record's are "
        "not; it looks like preference data (implicit prompt, standard), which is read by rlhfkit rm, dpo, rm-eval and "
        "judge-eval (data_format=preference)",
    ),
    (
        "sft",
        {"data_format": "tldr-sft"},
        [{"prompt": user_turn(i), "completion": [{"role": "assistant", "content": "ok"}]} for i in range(8)],
        "field 'subreddit' missing; TL;DR SFT (subreddit, title, post, summary) records need: subreddit, title, post, "
        "summary; it looks like prompt-completion data (conversational): read it with data_format=prompt-completion "
        "(or data_format=auto)",
    ),
    (
        "sft",
        {"data_format": "tldr-sft"},
        pref_rows(),
        "it looks like preference data (explicit prompt, standard), which is read by rlhfkit rm, dpo, rm-eval and "
        "judge-eval (data_format=preference)",
    ),
    (
        "sft",
        {},  # auto, the default
        pref_rows(),
        "(see docs/data-formats.md); it looks like preference data (explicit prompt, standard), which is read by "
        "rlhfkit rm, dpo, rm-eval and judge-eval (data_format=preference)",
    ),
]


@pytest.mark.parametrize(
    ("stage", "options", "rows", "fragment"), FORMAT_ERRORS, ids=[f"{c[0]}-{i}" for i, c in enumerate(FORMAT_ERRORS)]
)
def test_data_in_another_format_fails_naming_the_option_that_reads_it(
    ppo_dirs, tmp_path, capsys, stage, options, rows, fragment
):
    data = write_rows(tmp_path / "data.jsonl", rows)
    before = data.read_bytes()
    args = stage_args(stage, ppo_dirs, tmp_path / "run", data=str(data), **options)
    line = one_error_line([stage, *cli_args(args)], capsys)
    assert line.startswith(f"rlhfkit: error: {data}:1: ") and line.endswith(fragment)
    assert data.read_bytes() == before


@pytest.mark.parametrize(
    ("stage", "option"),
    [
        ("sft", "data_format"),
        ("rm", "data_format"),
        ("dpo", "data_format"),
        ("rm-eval", "data_format"),
        ("judge-eval", "data_format"),
        ("grpo", "prompt_format"),
        ("ppo", "prompt_format"),
        ("generate", "prompt_format"),
    ],
)
def test_the_help_of_the_format_option_names_every_other_format(stage, option, capsys):
    assert cli_main([stage, "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.split()[:1] == [option])
    default, choices = re.search(r"default: (\S+)\s+type: \{([^}]*)\}", lines[index + 1]).groups()
    others = [choice for choice in choices.split(",") if choice != default]
    assert len(others) >= 3 and all(choice in lines[index] for choice in others), lines[index]
    assert "one option away" in lines[index]
