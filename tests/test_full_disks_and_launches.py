"""Cases 16 and 19 of the 2026-11 bad-inputs review: full disks and launches.

16: a full disk (no space left, or the quota used up) while a run writes a checkpoint, its final model,
its metrics, its report or its lock is one `rlhfkit: error:` line naming the folder and about the size
needed (exit 2); it leaves no temporary checkpoint and no lock behind, and the last complete checkpoint
stays resumable. A lock that is empty or unreadable, left by a crash, is taken over like a stale one.
19: under `--num-processes 2` a user error is printed once, with no torch-elastic report, and the
launch exits with the code its processes agreed on.
"""

import errno
import json
import logging
import os
import re
import subprocess
import threading
import time

import pytest
import torch
from safetensors import SafetensorError
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from rlhfkit import launch, runlock
from rlhfkit.checkpoint import find_checkpoint
from rlhfkit.cli import main
from rlhfkit.errors import DiskFullError, RunLockedError
from rlhfkit.faults import disk_full_reason, readable_size
from rlhfkit.launch import ProcessStatus, launch_outcome, launched_process_status, say_once
from rlhfkit.runlock import LOCK_FILE, holder_record, lock_run_dir, release_run_dir
from rlhfkit.tracking import Tracker, append_jsonl, read_jsonl, read_metrics

from .helpers import cli_args, launcher_env, rlhfkit_command, stage_args

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
NO_QUOTA = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


# ---------------------------------------------------------------- case 16: where the disk fills up, what is written


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


# case: (the write that fails, the start of the error line after "rlhfkit: error: ", the run's steps (a checkpoint
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


# ---------------------------------------------------------------- case 16: a lock left by a crash


def write_lock(folder, data: bytes, age: float = 60.0):
    path = folder / LOCK_FILE
    path.write_bytes(data)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("data", [b"", b'{"pid": 12', b'["not", "a", "lock"]'], ids=["empty", "cut", "not-a-record"])
def test_an_empty_or_unreadable_lock_left_by_a_crash_is_taken_over(tmp_path, data, capsys):
    path = write_lock(tmp_path, data)
    lock_run_dir(tmp_path)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert warning == (
        f"rlhfkit: warning: {path} was left by a process that died while writing it (it is empty or "
        "unreadable); taking the folder over"
    )
    release_run_dir(tmp_path)


def test_a_lock_still_being_written_is_not_taken_over(tmp_path):
    """Where a lock cannot be linked into place whole (no hard links), its record follows its creation."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        path = write_lock(tmp_path, b"", age=0)
        writer = threading.Timer(0.3, lambda: path.write_text(json.dumps(holder_record(sleeper.pid))))
        writer.start()
        with pytest.raises(RunLockedError, match=f"in use by process {sleeper.pid}"):
            lock_run_dir(tmp_path)
        writer.join()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_stale_lock_another_process_took_over_meanwhile_is_left_to_it(tmp_path):
    stale = json.dumps(holder_record(os.getpid()) | {"pid": 1, "process_start": -1}).encode()
    taken = (json.dumps(holder_record(os.getpid())) + "\n").encode()
    path = write_lock(tmp_path, taken)  # what the other process put there after it removed the stale one
    runlock.remove_stale(path, stale)
    assert path.read_bytes() == taken and os.listdir(tmp_path) == [LOCK_FILE]


def test_without_hard_links_the_lock_is_created_in_place(tmp_path, monkeypatch):
    def no_links(*_args):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    lock_run_dir(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert os.listdir(tmp_path) == [LOCK_FILE]
    release_run_dir(tmp_path)


def test_a_full_disk_while_locking_leaves_no_lock(tmp_path, monkeypatch):
    def full(*_args):
        raise NO_QUOTA

    monkeypatch.setattr(runlock, "put_in_place", full)
    with pytest.raises(DiskFullError, match=f"disk quota exceeded in {tmp_path} while writing its lock file"):
        lock_run_dir(tmp_path)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- case 19: a launch ends like one process


@pytest.fixture
def launched_rank(tmp_path, monkeypatch):
    """This process as rank 0 of a 2-process launch whose status folder is `tmp_path`."""
    monkeypatch.setenv(launch.STATUS_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    return tmp_path


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_processes_ending_alike_exit_0_to_the_launcher_and_record_their_code(launched_rank, ending):
    (launched_rank / "rank-1.exit").write_text("143")
    with launched_process_status() as outcome:
        if ending == "raise":
            raise SystemExit(143)  # a stop both processes agreed on
        outcome.code = 143
    assert outcome.code == 0 and (launched_rank / "rank-0.exit").read_text() == "143"
    assert launch_outcome(0, launch.read_launch_status(launched_rank, 2)) == 143


def test_a_process_ending_unlike_the_others_exits_with_its_code(launched_rank, monkeypatch):
    monkeypatch.setattr(launch, "AGREEMENT_WAIT", 0.2)
    (launched_rank / "rank-1.exit").write_text("0")
    with pytest.raises(SystemExit) as exit_, launched_process_status() as outcome:
        outcome.code = 2
    assert exit_.value.code == 2
    (launched_rank / "rank-1.exit").unlink()  # the other is still running: it is waited for, then left to the agent
    started = time.monotonic()
    with pytest.raises(SystemExit), launched_process_status() as outcome:
        outcome.code = 2
    assert 0.2 <= time.monotonic() - started < 5


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("peer", ["failed", "died"])
def test_an_error_after_another_process_failed_or_died_is_one_line(launched_rank, peer, capsys):
    if peer == "failed":
        (launched_rank / "rank-1.exit").write_text("2")  # e.g. a full disk while it wrote the checkpoint
    else:
        (launched_rank / "rank-1.pid").write_text(str(dead_pid()))  # SIGKILLed: no exit code
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_, launched_process_status():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert exit_.value.code == 1 and time.monotonic() - started < launch.AGREEMENT_WAIT  # not waiting for the dead
    assert (
        capsys.readouterr().err
        == "rlhfkit: process 0 stopped: process 1 failed or died first (RuntimeError in this one)\n"
    )


def test_an_error_while_the_others_run_keeps_its_traceback(launched_rank):
    (launched_rank / "rank-1.pid").write_text(str(os.getpid()))
    with pytest.raises(RuntimeError, match="a bug"), launched_process_status():
        raise RuntimeError("a bug")
    assert (launched_rank / "rank-0.exit").read_text() == "1"


def test_a_line_every_process_says_is_printed_once(launched_rank, capsys):
    say_once("rlhfkit: error: bad data")
    say_once("rlhfkit: error: bad data")  # the other process
    say_once("rlhfkit: error: other")
    assert capsys.readouterr().err.splitlines() == ["rlhfkit: error: bad data", "rlhfkit: error: other"]


def test_a_failed_process_ends_the_launcher_quietly(monkeypatch, capsys):
    import accelerate.commands.launch

    def failing(_args):
        raise ChildFailedError("rlhfkit", {1: ProcessFailure(local_rank=1, pid=5, exitcode=2, error_file="")})

    monkeypatch.setattr(accelerate.commands.launch, "launch_command", failing)
    try:
        assert launch.run_launcher(["--num_processes", "2", "-m", "rlhfkit", "sft"]) == 1
    finally:
        logging.disable(logging.NOTSET)
    assert capsys.readouterr() == ("", "")


def test_an_agreed_code_is_the_launchs_whatever_the_launcher_says():
    status = [ProcessStatus(0, 100, 143), ProcessStatus(1, 101, 143)]
    assert launch_outcome(0, status) == launch_outcome(1, status) == 143


@pytest.mark.slow  # one real 2-process launch
def test_a_data_error_under_two_processes_is_one_line_and_exit_2(ppo_dirs, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(json.dumps({"subreddit": "x", "title": "t", "post": "", "summary": "s"}) + "\n" for _ in range(8))
    )
    out = tmp_path / "run"
    args = cli_args(stage_args("sft", ppo_dirs, out, data=str(bad), max_steps=1))
    proc = subprocess.run(
        rlhfkit_command("sft", *args, "--num-processes", "2"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlhfkit: error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and f"{bad}: no usable examples" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr and "FAILED" not in proc.stderr
    assert not out.exists()
