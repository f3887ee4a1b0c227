"""One run per folder: a run directory in use is refused, naming its process; a lock
left by a process that is gone is taken over; the lock goes when its process exits."""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from rlhfkit import runlock
from rlhfkit.cli import main as cli_main
from rlhfkit.errors import RunLockedError
from rlhfkit.runlock import LOCK_FILE, holder_record, lock_run_dir, release_run_dir

from ..support.processes import child_env, rlhfkit_command
from ..support.tiny import cli_args, stage_args


@pytest.fixture
def sleeper():
    """A running process that is not this one."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_lock(run_dir, record):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_FILE).write_text(json.dumps(record))


def test_a_folder_held_by_a_running_process_is_refused_in_one_line_naming_it(ppo_dirs, tmp_path, sleeper, capsys):
    out = tmp_path / "run"
    write_lock(out, holder_record(sleeper))
    (out / "config.yaml").write_text("the running run's config\n")
    assert cli_main(["sft", *cli_args(stage_args("sft", ppo_dirs, out, max_steps=1))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlhfkit: error: {out} is in use by process {sleeper} on ") and "\n" not in err, err
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == sleeper
    assert (out / "config.yaml").read_text() == "the running run's config\n"


def test_another_hosts_lock_counts_as_held(tmp_path, sleeper):
    write_lock(tmp_path, holder_record(sleeper) | {"host": "another-machine"})
    with pytest.raises(RunLockedError, match=f"in use by process {sleeper} on another-machine"):
        lock_run_dir(tmp_path)


def test_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path, sleeper, capsys):
    record = holder_record(sleeper)
    write_lock(tmp_path, record | {"process_start": record["process_start"] - 1})  # the pid was reused since
    lock_run_dir(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"left by process {sleeper}" in capsys.readouterr().err


def test_the_same_process_may_lock_its_folder_again(tmp_path, capsys):
    lock_run_dir(tmp_path)
    lock_run_dir(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert capsys.readouterr().err == ""


def test_a_stale_lock_is_reported_taken_over_and_released_when_the_run_ends(ppo_dirs, tmp_path):
    out, gone = tmp_path / "run", dead_pid()
    write_lock(out, holder_record(gone))
    proc = subprocess.run(
        rlhfkit_command("sft", *cli_args(stage_args("sft", ppo_dirs, out, max_steps=1))),
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("rlhfkit: warning:") and "lock" in line]
    assert len(warnings) == 1 and f"left by process {gone}" in warnings[0] and "taking the folder over" in warnings[0]
    assert not (out / LOCK_FILE).exists() and (out / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize("end", ["error", "sigterm"])
def test_the_lock_is_released_when_its_process_fails_or_is_terminated(tmp_path, end):
    script = (
        "import sys; from pathlib import Path; from rlhfkit.runlock import lock_run_dir\n"
        f"lock_run_dir(Path({str(tmp_path)!r})); print('locked', flush=True)\n"
        "sys.stdin.readline(); raise RuntimeError('boom')\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout.readline() == "locked\n"
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid
        if end == "sigterm":  # outside a training loop, which would first write a checkpoint
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.write("fail now\n")
            proc.stdin.flush()
        assert proc.wait(timeout=60) == (143 if end == "sigterm" else 1)
    assert not (tmp_path / LOCK_FILE).exists()


# ---------------------------------------------------------------- a lock left by a crash


def write_lock_bytes(folder, data: bytes, age: float = 60.0):
    path = folder / LOCK_FILE
    path.write_bytes(data)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("data", [b"", b'{"pid": 12', b'["not", "a", "lock"]'], ids=["empty", "cut", "not-a-record"])
def test_an_empty_or_unreadable_lock_left_by_a_crash_is_taken_over(tmp_path, data, capsys):
    path = write_lock_bytes(tmp_path, data)
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
        path = write_lock_bytes(tmp_path, b"", age=0)
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
    path = write_lock_bytes(tmp_path, taken)  # what the other process put there after it removed the stale one
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
