"""A full disk (no space left, or the quota used up) while a run writes a checkpoint, its final model, its
metrics, its report or its lock is one `rlhfkit: error:` line naming the folder and about the size needed
(exit 2); it leaves no temporary checkpoint and no lock behind, and the last complete checkpoint stays
resumable."""

import errno
import json
import os
import re

import pytest
import torch
from safetensors import SafetensorError

from rlhfkit import runlock
from rlhfkit.checkpoint import find_checkpoint
from rlhfkit.cli import main
from rlhfkit.errors import DiskFullError
from rlhfkit.faults import disk_full_reason, readable_size
from rlhfkit.runlock import LOCK_FILE, lock_run_dir, release_run_dir
from rlhfkit.tracking import Tracker, append_jsonl, read_jsonl, read_metrics

from ..support.tiny import cli_args, stage_args

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
NO_QUOTA = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))



def fail_second_state_save(monkeypatch, out):
    """The second checkpoint's state.pt: half written, then the disk is full."""
    real, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            f.write(b"\0" * 100)
            raise NO_SPACE
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def fail_final_model(monkeypatch, out):
    """safetensors keeps only the text of the OSError."""
    import transformers.modeling_utils

    real = transformers.modeling_utils.safe_save_file

    def save_file(tensors, filename, *args, **kwargs):
        if os.path.dirname(filename) == str(out / "model"):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)


def fail_metrics_of_step_1(monkeypatch, out):
    import rlhfkit.tracking

    real = rlhfkit.tracking.append_jsonl

    def append(path, rows):
        if path.name == "metrics.jsonl" and rows[0]["step"] == 1:
            raise NO_QUOTA
        return real(path, rows)

    monkeypatch.setattr(rlhfkit.tracking, "append_jsonl", append)


def fail_report(monkeypatch, out):
    import rlhfkit.report.report

    def write_page(*_args):
        raise NO_SPACE

    monkeypatch.setattr(rlhfkit.report.report, "write_page", write_page)


# name: (the write that fails, the start of the error line after "rlhfkit: error: ", the run's steps (a checkpoint
# after each), the checkpoint then resumed); a checkpoint's write: in the resume test below
FULL_DISK = {
    "final model": (
        fail_final_model,
        "no space left on device in {out} while writing the final model model/",
        1,
        "step-000001",
    ),
    "metrics": (fail_metrics_of_step_1, "disk quota exceeded in {out} while writing the metrics of step 1", 1, None),
    "report": (
        fail_report,
        "no space left on device in {out} while writing report.html and report.json",
        1,
        "step-000001",
    ),
}


def sft_run(ppo_dirs, out, steps):
    return ["sft", *cli_args(stage_args("sft", ppo_dirs, out, max_steps=steps, save_every=1))]


def error_line(code, err):
    """The one error line of a run that exited 2 without a traceback."""
    errors = [line for line in err.splitlines() if line.startswith("rlhfkit: error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0].removeprefix("rlhfkit: error: ")


@pytest.mark.parametrize("case", sorted(FULL_DISK))
def test_a_full_disk_is_one_line_naming_the_folder_and_size_and_loses_nothing(
    case, ppo_dirs, tmp_path, monkeypatch, capsys
):
    fail, start, steps, resumable = FULL_DISK[case]
    out = tmp_path / "run"
    fail(monkeypatch, out)
    line = error_line(main(sft_run(ppo_dirs, out, steps)), capsys.readouterr().err)
    assert re.match(re.escape(start.format(out=out)) + r" \(about \d+ [kMG]?B(; \d+ [kMGT]?B free there)?\): ", line), (
        line
    )
    assert ("free there" in line) == line.startswith("no space left"), line  # a quota is not what the disk has free
    assert line.endswith(
        f"free space or raise the quota, then continue with resume={out} (from its last complete checkpoint)"
    ) or line.endswith(f"(a training stage: with resume={out})"), line
    assert_nothing_lost(out, resumable)


def assert_nothing_lost(out, resumable):
    assert not list(out.glob("checkpoints/.tmp-step-*")) and not list(out.glob("checkpoints/.latest.tmp"))
    read_metrics(out)  # whole rows only
    found = find_checkpoint(out)
    assert (found.name if found else None) == resumable


def test_resume_on_a_still_full_disk_is_one_line_leaving_no_lock_and_resumes_once_there_is_room(
    ppo_dirs, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    fail_second_state_save(monkeypatch, out)
    line = error_line(main(sft_run(ppo_dirs, out, 2)), capsys.readouterr().err)
    monkeypatch.undo()
    kept = [f for f in (out / "checkpoints" / "step-000001").rglob("*") if f.is_file() and "tokenizer" not in f.name]
    size = readable_size(sum(f.stat().st_size for f in kept))  # a checkpoint of this run, its tokenizer aside
    assert line.startswith(
        f"no space left on device in {out}/checkpoints while writing checkpoint step-000002 (about {size};"
    )
    assert_nothing_lost(out, "step-000001")
    release_run_dir(out)  # as when the failed run's process ended
    real_fdopen = os.fdopen

    def full_fdopen(fd, *args, **kwargs):  # the lock's record cannot be written
        if LOCK_FILE in os.readlink(f"/proc/self/fd/{fd}"):
            os.close(fd)
            raise NO_SPACE
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", full_fdopen)
    capsys.readouterr()
    line = error_line(main(["sft", f"resume={out}"]), capsys.readouterr().err)
    assert line.startswith(f"no space left on device in {out} while writing its lock file {LOCK_FILE} (about ")
    assert line.endswith("then run the command again")
    assert not [p.name for p in out.iterdir() if p.name.startswith(LOCK_FILE)]
    monkeypatch.undo()
    assert main(["sft", f"resume={out}"]) == 0
    assert json.loads((out / "checkpoints" / "latest").read_text())["step"] == 2


def test_a_disk_full_error_is_found_in_what_libraries_raise():
    try:
        try:
            raise NO_QUOTA
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as torch_save_error:  # torch.save's error while handling the file's OSError
        assert disk_full_reason(torch_save_error) == "Disk quota exceeded"
    assert (
        disk_full_reason(SafetensorError("I/O error: No space left on device (os error 28)"))
        == "No space left on device"
    )
    assert disk_full_reason(OSError(errno.EACCES, "Permission denied")) is None


def test_a_metrics_row_the_disk_cannot_take_whole_is_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, [{"step": 0, "loss": 1.0}])
    real_open = type(path).open

    class HalfThenFull:  # the first write takes half of the row, the next finds the disk full
        def __init__(self, f):
            self.f, self.writes = f, 0

        def write(self, data):
            self.writes += 1
            if self.writes > 1:
                raise NO_SPACE
            return self.f.write(data[: len(data) // 2])

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(type(path), "open", lambda self, *a, **k: HalfThenFull(real_open(self, *a, **k)))
    with pytest.raises(OSError):
        append_jsonl(path, [{"step": 1, "loss": 0.5}])
    monkeypatch.undo()
    assert read_jsonl(path) == [{"step": 0, "loss": 1.0}]


def test_rewriting_the_metrics_on_a_full_disk_keeps_them_and_says_so(tmp_path, monkeypatch):
    rows = [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]
    append_jsonl(tmp_path / "metrics.jsonl", rows)
    real_write_text = type(tmp_path).write_text

    def half_then_full(path, text, *args, **kwargs):
        real_write_text(path, text[: len(text) // 2], *args, **kwargs)
        raise NO_SPACE

    monkeypatch.setattr(type(tmp_path), "write_text", half_then_full)
    with pytest.raises(DiskFullError, match=f"no space left on device in {tmp_path} while writing metrics.jsonl again"):
        Tracker(tmp_path, [], {}, resume_step=0)  # a run starting again: its rows go
    monkeypatch.undo()
    assert read_jsonl(tmp_path / "metrics.jsonl") == rows and os.listdir(tmp_path) == ["metrics.jsonl"]



def test_a_full_disk_while_locking_leaves_no_lock(tmp_path, monkeypatch):
    def full(*_args):
        raise NO_QUOTA

    monkeypatch.setattr(runlock, "put_in_place", full)
    with pytest.raises(DiskFullError, match=f"disk quota exceeded in {tmp_path} while writing its lock file"):
        lock_run_dir(tmp_path)
    assert os.listdir(tmp_path) == []
