"""Ordinary user mistakes: each ends with exit code 2 and one line on stderr naming the file, folder or
key and what to do, with nothing written: no run folder made, no file of an earlier run touched."""

from __future__ import annotations

import errno
import json
import pathlib
import re
import shutil

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.config import to_yaml
from rlhfkit.models import check_model_source
from rlhfkit.stages import resolve

from .helpers import cli_args, files_of, one_error_line, stage_args


def command(stage: str, inputs: dict, out: pathlib.Path, **extra) -> list[str]:
    return [stage, *cli_args(stage_args(stage, inputs, out, **{"max_steps": 1} | extra))]


def write_rows(path: pathlib.Path, rows: list[dict]) -> pathlib.Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- 1, 2: models


def test_a_model_folder_without_tokenizer_files_says_so_and_how_to_add_them(ppo_dirs, tmp_path, capsys):
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ppo_dirs["policy"] / name, weights_only / name)
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, model=weights_only), capsys)
    assert f"model={weights_only}: the folder has no tokenizer files" in line and "tokenizer.save_pretrained" in line, (
        line
    )
    assert not out.exists()


@pytest.mark.parametrize("missing", ["./no-such-model", "/tmp/does/not/exist", "{tmp}/models/policy"])
def test_a_missing_local_model_folder_is_named_as_such(ppo_dirs, tmp_path, monkeypatch, capsys, missing):
    monkeypatch.chdir(tmp_path)
    missing = missing.format(tmp=tmp_path)
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, model=missing), capsys)
    assert f"model={missing}: no such folder" in line and "Repo id" not in line, line
    assert not out.exists()


def test_a_hub_id_is_left_to_the_hub():
    check_model_source("EleutherAI/pythia-1b-deduped", "model")  # no local folder by that name: not refused here


# ---------------------------------------------------------------- 3: output_dir


@pytest.mark.parametrize(
    "where, reason", [("/proc/rlhfkit-run", "No such file or directory"), ("{tmp}/file.txt/run", "Not a directory")]
)
def test_an_output_dir_that_cannot_be_made_is_refused_before_anything_loads(ppo_dirs, tmp_path, capsys, where, reason):
    (tmp_path / "file.txt").write_text("a file, not a folder\n")
    out = where.format(tmp=tmp_path)
    line = one_error_line(
        command("sft", ppo_dirs, tmp_path, output_dir=out, data=tmp_path / "never-read.jsonl"), capsys
    )
    assert line == f"rlhfkit: error: cannot create output_dir={out}: {reason}; choose a writable folder"


def test_a_read_only_file_system_is_named(ppo_dirs, tmp_path, monkeypatch, capsys):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only)
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out), capsys)
    assert line == f"rlhfkit: error: cannot create output_dir={out}: Read-only file system; choose a writable folder"


# ---------------------------------------------------------------- 4: eval's sample files


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


# ---------------------------------------------------------------- 5, 6, 7: options


def test_no_steps_and_no_epochs_is_refused_naming_both(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, max_steps=0, num_epochs=0), capsys)
    assert "max_steps=0" in line and "num_epochs=0" in line, line
    assert not out.exists()


@pytest.mark.parametrize("stage, preset", [("sft", None), ("sft", "tldr-sft"), ("ppo", "tldr-ppo")])
def test_resume_from_a_path_that_does_not_exist_says_so(ppo_dirs, tmp_path, capsys, stage, preset):
    missing, out = tmp_path / "no-such-run", tmp_path / "run"
    argv = [
        stage,
        *(["--preset", preset, *cli_args(stage_args(stage, ppo_dirs, out))] if preset else []),
        f"resume={missing}",
    ]
    line = one_error_line(argv, capsys)
    assert f"resume={missing}: no such run folder or checkpoint" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "stage, options, expected",
    [
        (
            "sft",
            {"total_batch_size": 6, "micro_batch_size": 4},
            "total_batch_size=6 must be a multiple of micro_batch_size",
        ),
        (
            "rm",
            {"total_batch_size": 8, "micro_batch_size": 3},
            "total_batch_size=8 must be a multiple of micro_batch_size",
        ),
        (
            "dpo",
            {"total_batch_size": 8, "micro_batch_size": 3},
            "total_batch_size=8 must be a multiple of micro_batch_size",
        ),
        ("ppo", {"num_minibatches": 3}, "total_batch_size=8 must be a multiple of num_minibatches=3"),
        ("grpo", {"samples_per_prompt": 3}, "total_batch_size=8 must be a multiple of samples_per_prompt=3"),
    ],
)
def test_a_batch_that_does_not_divide_fails_before_any_data_is_read(
    ppo_dirs, tmp_path, capsys, stage, options, expected
):
    out = tmp_path / "run"
    line = one_error_line(command(stage, ppo_dirs, out, data=tmp_path / "never-read.jsonl", **options), capsys)
    assert expected in line, line
    assert not out.exists()


# ---------------------------------------------------------------- 8: a folder holding another run


def test_a_finished_run_is_never_overwritten_and_overwrite_moves_it_aside(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()  # an empty folder is fine to use
    argv = command("sft", ppo_dirs, out, report_to="tensorboard")
    assert cli_main(argv) == 0
    finished = files_of(out)
    (old_events,) = [name for name in finished if name.startswith("tb/")]

    for extra in ({}, {"learning_rate": 0.01}):
        line = one_error_line(argv + cli_args(extra), capsys)
        assert line == (
            f"rlhfkit: error: output_dir={out} holds a finished run; pass resume={out} to continue it, "
            "choose a new output_dir, or set overwrite=true to move it aside"
        )
        assert files_of(out) == finished

    capsys.readouterr()
    assert cli_main(argv + ["overwrite=true"]) == 0
    (aside,) = tmp_path.glob("run.old-*")
    assert f"moved the run in {out} aside to {aside}" in capsys.readouterr().out
    assert files_of(aside) == finished
    (new_events,) = [p.name for p in (out / "tb").iterdir()]
    assert f"tb/{new_events}" != old_events


def test_a_folder_holding_a_run_with_other_options_is_refused_naming_them(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    other = resolve("sft", None, None, stage_args("sft", ppo_dirs, out, max_steps=1, learning_rate=0.5))
    (out / "config.yaml").write_text(to_yaml(other, "sft"))
    (out / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    before = files_of(out)
    line = one_error_line(command("sft", ppo_dirs, out), capsys)
    assert line.startswith(
        f"rlhfkit: error: output_dir={out} holds another run (its config.yaml differs in learning_rate)"
    ), line
    assert "overwrite=true" in line and "resume=" not in line  # nothing saved there to resume
    assert files_of(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_pipeline_restarts_an_interrupted_stage_that_saved_nothing_and_moves_aside_one_with_other_options(tmp_path):
    from rlhfkit.pipeline_command import stage_config
    from rlhfkit.stages import pipeline_commands

    cfg = resolve("pipeline", "quickstart", None, {"output_dir": str(tmp_path)})
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.yaml").write_text(
        to_yaml(stage_config("sft", cfg, tmp_path, pipeline_commands()), "sft")
    )
    sft = stage_config("sft", cfg, tmp_path, pipeline_commands())
    assert not sft.overwrite and not sft.resume  # the same stage: it starts again in its folder
    changed = resolve("pipeline", "quickstart", None, {"output_dir": str(tmp_path), "sft": "{learning_rate: 0.5}"})
    assert stage_config(
        "sft", changed, tmp_path, pipeline_commands()
    ).overwrite  # the attempt with the old options is moved aside first
    assert not stage_config("rm", changed, tmp_path, pipeline_commands()).overwrite  # no earlier attempt there


def test_the_same_run_stopped_before_it_saved_anything_starts_again_in_its_folder(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = command("sft", ppo_dirs, out, report_to="tensorboard")
    out.mkdir()
    (out / "config.yaml").write_text(
        to_yaml(resolve("sft", None, None, dict(arg.split("=", 1) for arg in argv[1:])), "sft")
    )
    (out / "tb").mkdir()
    (out / "tb" / "events.out.tfevents.0.earlier-start").write_bytes(b"")
    assert cli_main(argv) == 0
    assert (out / "model").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing moved aside


# ---------------------------------------------------------------- 9, 10: every record skipped


PLAIN_PAIRS = [
    {"chosen": f"\n\nHuman: A good question {i}?", "rejected": f"\n\nHuman: A bad one {i}?"} for i in range(6)
]  # HH-RLHF dialogues without an assistant turn (pairs in another format fail naming it: test_data_mistakes.py)
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


# ---------------------------------------------------------------- review 2026-11c: 5.2, ENhangR, the split's counts


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


def test_resume_of_a_run_stopped_before_its_first_checkpoint_says_how_to_start_it_again(ppo_dirs, tmp_path, capsys):
    """ENhangR: the folder holds the run's config.yaml and no checkpoint; the same command starts it again
    (test_the_same_run_stopped_before_it_saved_anything_starts_again_in_its_folder)."""
    out = tmp_path / "run"
    argv = command("sft", ppo_dirs, out)
    out.mkdir()
    (out / "config.yaml").write_text(
        to_yaml(resolve("sft", None, None, dict(arg.split("=", 1) for arg in argv[1:])), "sft")
    )
    line = one_error_line(["sft", f"resume={out}"], capsys)
    assert line == (
        f"rlhfkit: error: resume={out}: no complete checkpoint there (looked for checkpoints/latest); the run there "
        "stopped before its first checkpoint: run the command that started it again, or "
        f"`rlhfkit <command> --config {out / 'config.yaml'}`, which starts the same run again in its folder"
    )


def test_the_split_line_counts_the_prompts_the_tokenization_line_then_keeps_or_skips(ppo_dirs, tokenizer):
    """Cosmetic: with queries too long for max_query_length, the split's training count is the tokenization's kept
    plus skipped, not already the kept count."""
    from rlhfkit.config import GRPOConfig
    from rlhfkit.onpolicy.evaluation import split_posts

    cfg = GRPOConfig(data=[str(ppo_dirs["posts"])], validation_posts=2, max_query_length=64)
    train, held_out, notes = split_posts(cfg, tokenizer)
    split = re.search(r"split by prompt \(seed \d+\): (\d+) training prompts, (\d+) held-out prompts", "\n".join(notes))
    kept, skipped = map(int, re.search(r"training kept (\d+) prompts, skipped (\d+)", "\n".join(notes)).groups())
    assert skipped > 0 and kept == len(train)
    assert (int(split[1]), int(split[2])) == (kept + skipped, 2)
