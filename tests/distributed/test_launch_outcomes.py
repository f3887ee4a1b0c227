"""How a launch ends: under `--num-processes 2` a user error is printed once, with no torch-elastic report, and
the launch exits with the code its processes agreed on."""

import json
import logging
import os
import subprocess
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from rlhfkit import launch
from rlhfkit.launch import ProcessStatus, launch_outcome, launched_process_status, say_once

from ..support.processes import launcher_env, rlhfkit_command
from ..support.tiny import cli_args, stage_args


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
