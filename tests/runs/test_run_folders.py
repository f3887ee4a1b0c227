"""A run's folder: an output_dir that cannot be made, a folder holding another run or someone else's files,
resuming a finished, moved or unfinished run. Each mistake is one line with exit code 2 and nothing written
or lost; overwrite=true moves the old folder aside."""

from __future__ import annotations

import errno
import json
import pathlib
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlhfkit.cli import main as cli_main
from rlhfkit.config import to_yaml
from rlhfkit.stages import resolve

from ..support.mistakes import files_of, one_error_line
from ..support.tiny import cli_args, command, stage_args


@pytest.fixture
def finished_run(ppo_dirs, tmp_path) -> Path:
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out, max_steps=2, save_every=1, keep_checkpoints=0)) == 0
    return out



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



def test_resume_of_a_run_stopped_before_its_first_checkpoint_says_how_to_start_it_again(ppo_dirs, tmp_path, capsys):
    """The folder holds the run's config.yaml and no checkpoint; the same command starts it again
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
        f"`rlhfkit sft --config {out / 'config.yaml'}`, which starts the same run again in its folder"
    )



def test_a_run_folder_given_for_its_model_names_the_model_folder_to_give(finished_run, ppo_dirs, tmp_path, capsys):
    out = tmp_path / "grpo"
    line = one_error_line(command("grpo", ppo_dirs | {"rm": finished_run}, out), capsys)
    assert (
        line
        == f"rlhfkit: error: reward_model={finished_run} is a run folder; give the model it wrote: "
           f"reward_model={finished_run}/model"
    )
    assert not out.exists()



def test_a_folder_of_someone_elses_files_is_refused_and_overwrite_moves_it_aside(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "notes"
    (out / "model").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"my": "metrics"}\n')
    (out / "report.html").write_text("notes\n")
    before = files_of(out)
    line = one_error_line(command("sft", ppo_dirs, out), capsys)
    assert f"output_dir={out} is not empty (metrics.jsonl, model, report.html) and holds no rlhfkit run" in line, line
    assert files_of(out) == before and sorted(p.name for p in out.iterdir()) == [
        "metrics.jsonl",
        "model",
        "report.html",
    ]
    assert cli_main(command("sft", ppo_dirs, out, overwrite="true")) == 0
    (aside,) = tmp_path.glob("notes.old-*")
    assert files_of(aside) == before and (out / "config.yaml").is_file()



@pytest.mark.parametrize(
    "changed, named",
    [
        (["learning_rate=0.5"], "learning_rate=0.5 (the run has 0.001)"),
        (
            ["learning_rate=0.5", "total_batch_size=2"],
            "learning_rate=0.5 (the run has 0.001); total_batch_size=2 (the run has 4)",
        ),
        (["model={other}"], "model={other} (the run has {policy})"),
    ],
)
def test_resume_refuses_options_that_could_not_take_effect_naming_each(
    changed, named, finished_run, ppo_dirs, pad_is_eos_policy, capsys
):
    fill = {"other": pad_is_eos_policy, "policy": ppo_dirs["policy"]}
    before = files_of(finished_run)
    line = one_error_line(["sft", f"resume={finished_run}", *(c.format(**fill) for c in changed)], capsys)
    assert named.format(**fill) in line and "a resumed run may change only max_steps" in line, line
    assert files_of(finished_run) == before


def test_resume_with_a_larger_max_steps_trains_on_the_recomputed_schedule(finished_run, capsys):
    at_two = load_file(finished_run / "model" / "model.safetensors")
    capsys.readouterr()
    assert cli_main(["sft", f"resume={finished_run}", "max_steps=3"]) == 0
    assert "rlhfkit: resume: max_steps 2 -> 3: the learning-rate schedule is recomputed" in capsys.readouterr().out
    at_three = load_file(finished_run / "model" / "model.safetensors")
    # the cosine schedule of 2 steps had reached 0; recomputed for 3 it is lr x 0.25 at step 3
    assert max(float((at_three[k] - at_two[k]).abs().max()) for k in at_two) > 1e-5
    assert "max_steps: 3" in (finished_run / "config.yaml").read_text()


def test_a_moved_run_resumes_where_it_is(finished_run, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(finished_run, moved)
    shutil.rmtree(finished_run)
    shutil.rmtree(moved / "model")
    shutil.rmtree(moved / "checkpoints" / "step-000002")
    (moved / "checkpoints" / "latest").write_text(json.dumps({"checkpoint": "step-000001", "step": 1}))
    assert cli_main(["sft", f"resume={moved}"]) == 0
    assert (moved / "model").is_dir() and not finished_run.exists()
    assert f"output_dir: {moved}" in (moved / "config.yaml").read_text()



def test_an_unfinished_run_with_checkpoints_is_refused_before_any_data_is_read(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out, max_steps=2, save_every=1)) == 0
    shutil.rmtree(out / "model")  # as if stopped after its first checkpoint
    before = files_of(out)
    line = one_error_line(command("sft", ppo_dirs, out, data=tmp_path / "never-read.jsonl"), capsys)
    assert line == (
        f"rlhfkit: error: output_dir={out} holds an unfinished run with checkpoints; pass resume={out} to continue "
        "it, choose a new output_dir, or set overwrite=true to move it aside"
    )
    assert files_of(out) == before


def test_a_run_that_fails_before_it_starts_puts_back_the_run_it_moved_aside(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out)) == 0
    before = files_of(out)
    unusable = tmp_path / "empty-posts.jsonl"
    unusable.write_text(json.dumps({"subreddit": "a", "title": "b", "post": "", "summary": "c"}) + "\n")
    one_error_line(command("sft", ppo_dirs, out, data=unusable, overwrite="true"), capsys)
    assert files_of(out) == before and not list(tmp_path.glob("run.old-*"))
