"""An output is never overwritten silently: a command whose out= exists (or is a folder where a file is
written, or a file where a folder is) is refused in one line before anything is read, and keeps what is there;
overwrite=true replaces it."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli import main as cli_main

from ..support.mistakes import refusal_line

# (command and its options besides out=, what out= must be): each refused before any model or data is read
WRITERS = [
    (["generate", "model=policy-never-loaded", "data=posts-never-read"], "file"),
    (["rm-eval", "model=rm-never-loaded", "data=pairs-never-read"], "folder"),
    (["judge-eval", "judge=rm:never-loaded", "data=pairs-never-read"], "folder"),
    (["eval", "samples=p=never-read.jsonl"], "folder"),
    (["data", "analyze", "--path", "never-read.jsonl"], "folder"),
]


@pytest.mark.parametrize("argv, kind", WRITERS, ids=[" ".join(a[:2]) for a, _ in WRITERS])
def test_an_output_that_exists_is_refused_in_one_line_and_kept(argv, kind, tmp_path, capsys):
    existing = tmp_path / "samples.jsonl" if kind == "file" else tmp_path / "results"
    kept = existing if kind == "file" else existing / "notes.txt"
    kept.parent.mkdir(exist_ok=True)
    kept.write_text('{"precious": 1}\n')
    assert cli_main([*argv, f"out={existing}"]) == 2
    line = refusal_line(capsys.readouterr().err)
    assert f"out={existing} already" in line and "overwrite=true" in line, line
    assert kept.read_text() == '{"precious": 1}\n'
    wrong = tmp_path / ("a-folder" if kind == "file" else "a-file")
    wrong.mkdir() if kind == "file" else wrong.write_text("x")
    assert cli_main([*argv, f"out={wrong}"]) == 2
    assert f"out={wrong} is a {'folder' if kind == 'file' else 'file'}" in refusal_line(capsys.readouterr().err)


def test_generate_overwrite_true_replaces_the_file(ppo_dirs, tmp_path):
    out = tmp_path / "samples.jsonl"
    out.write_text('{"precious": 1}\n')
    args = [
        f"model={ppo_dirs['policy']}",
        f"data={ppo_dirs['posts']}",
        "validation_posts=4",
        "num_samples=2",
        "max_new_tokens=3",
        "max_query_length=128",
        f"out={out}",
        "overwrite=true",
    ]
    assert cli_main(["generate", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all("prompt_id" in row and "precious" not in row for row in rows)
