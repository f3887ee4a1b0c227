"""Multi-process launches: processes marked by rank, killed and resumed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .processes import launcher_env, rlhfkit_command
from .tiny import PRESETS, cli_args


def marked_processes(mark: str) -> dict[int, str]:
    """pid -> RANK ("" for none) of every process whose environment carries RLHFKIT_TEST_RUN=`mark`."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            variables = dict(v.partition("=")[::2] for v in environ.read_bytes().decode(errors="replace").split("\0"))
            if variables.get("RLHFKIT_TEST_RUN") == mark:
                found[int(environ.parent.name)] = variables.get("RANK", "")
    return found


def process_of_rank(mark: str, rank: int) -> int:
    [pid] = [pid for pid, r in marked_processes(mark).items() if r == str(rank)]
    return pid


def kill_marked(mark: str) -> None:
    """After a failed test: a launch's processes are not children of the test, so none may be left behind."""
    for pid in marked_processes(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path | None = None) -> None:
    """Until metrics.jsonl shows step `step` or later (step 0 is logged before the loop)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if metrics.exists() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise AssertionError(f"step {step} never logged: {log.read_text()[-3000:] if log else ''}")


@contextlib.contextmanager
def launched(stage: str, args: dict[str, Any], log: Path, processes: int = 2):
    """`rlhfkit <stage> --preset <its preset> ARGS --num-processes N` started with its output in `log`;
    yields (the launch, the mark its processes carry, for `process_of_rank`). No process of it outlives
    the block: they are not children of the test, so a failed test would leave them running."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    command = rlhfkit_command(stage, "--preset", PRESETS[stage], *cli_args(args), "--num-processes", str(processes))
    with log.open("w") as output:
        proc = subprocess.Popen(
            command, env=launcher_env() | {"RLHFKIT_TEST_RUN": mark}, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            yield proc, mark
        finally:
            kill_marked(mark)
            if proc.poll() is None:
                proc.kill()


def run_in_this_process(stage: str, args: dict[str, Any]) -> Path:
    """`rlhfkit <stage> --preset <its preset> ARGS` on one process, in this one: a reference run needs no
    child process (and none of the seconds a child spends importing torch). Returns the run folder."""
    from rlhfkit.cli import main

    assert main([stage, "--preset", PRESETS[stage], *cli_args(args)]) == 0, f"{stage} {args}"
    return Path(args["output_dir"])


def launch(
    stage: str, args: dict[str, Any], processes: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`rlhfkit <stage> --preset <its preset> ARGS`, under `--num-processes N` when N > 1, run to the end. A
    launch past its time limit takes its processes with it, as `launched` does."""
    launcher = ["--num-processes", str(processes)] if processes > 1 else []
    mark = f"{os.getpid()}-{time.time_ns()}"
    try:
        return subprocess.run(
            rlhfkit_command(stage, "--preset", PRESETS[stage], *cli_args(args), *launcher),
            env=(env or launcher_env()) | {"RLHFKIT_TEST_RUN": mark},
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        kill_marked(mark)


def launched_straight_and_resumed(
    stage: str, args: dict[str, Any], tmp_path: Path, kill_after: int
) -> tuple[Path, Path]:
    """A 2-process `stage` run straight through (in args' output_dir), and the same SIGKILLed and resumed
    (`launched_killed_and_resumed`); returns both run directories for comparison."""
    done = launch(stage, args, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(args["output_dir"]), launched_killed_and_resumed(stage, args, tmp_path, kill_after)


def launched_killed_and_resumed(stage: str, args: dict[str, Any], tmp_path: Path, kill_after: int) -> Path:
    """A 2-process `stage` run with `args` in tmp_path/killed, SIGKILLed in the process that writes the
    checkpoints once step `kill_after` is logged, then resumed on 2 processes; returns its run directory."""
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    with launched(stage, args | {"output_dir": str(killed), "save_every": 1}, log) as (proc, mark):
        wait_for_step(proc, killed, kill_after, log)
        os.kill(process_of_rank(mark, 0), signal.SIGKILL)
        assert proc.wait(timeout=60) != 0
    resumed = subprocess.run(
        rlhfkit_command(stage, f"resume={killed}", "--num-processes", "2"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return killed
