"""Multi-process launch through `accelerate`: `rlhfkit <stage> ... --num-processes N` re-runs the same
command under `accelerate launch` (CPU processes talk over gloo, GPUs over NCCL); `accelerate launch
-m rlhfkit <stage> ...` works too. Kept free of torch so that the command line starts fast (the
launcher, `python -m rlhfkit.launch`, imports it in a process of its own).

A launch ends like a single process: its processes record their exit codes in a status folder, and
the launch exits with the code they agree on. What they print that all of them would print (the same
user error) is printed once, and torch elastic's report of a failed process (a ChildFailedError
traceback) is left out: the launch names the processes that died or failed itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .faults import write_text_atomic


def inside_launcher() -> bool:
    return "LOCAL_RANK" in os.environ or "ACCELERATE_PROCESS_ID" in os.environ


def launch_command(argv: list[str], num_processes: int) -> list[str]:
    """The `accelerate launch` command (through `run_launcher`) that runs `rlhfkit <argv>` on `num_processes`
    (>= 2) processes."""
    cmd = [sys.executable, "-m", "rlhfkit.launch", "--num_processes", str(num_processes)]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", os.environ.get("RLHFKIT_PORT", "29517")]
    # accelerate's torchrun-based launcher also serves CPU processes: each process then builds
    # `Accelerator(cpu=True)`, which joins a gloo process group (`--cpu` alone would start only one).
    cmd += ["--multi_gpu", "--num_cpu_threads_per_process", str(max(1, (os.cpu_count() or 1) // num_processes))]
    return [*cmd, "-m", "rlhfkit", *argv]


STATUS_DIR = "RLHFKIT_LAUNCH_STATUS"  # where each launched process records its pid, then its exit code
RUN_STAMP = "RLHFKIT_RUN_STAMP"  # one timestamp for the default run folder of every process
AGREEMENT_WAIT = 10.0  # seconds a process ending non-zero waits for the others to end alike


def run_launcher(args: list[str]) -> int:
    """`accelerate launch ARGS` in this process, the one `relaunch` starts. When a process fails, torch
    elastic's agent logs it and raises ChildFailedError, whose traceback and report would bury the
    processes' own lines; `relaunch` names the process instead, so here it ends quietly."""
    import logging

    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logging.disable(logging.ERROR)  # the agent's lines on stopping and failed processes
    try:
        accelerate_launch(launch_command_parser().parse_args(args))
    except ChildFailedError:
        return 1
    return 0


def relaunch(argv: list[str], num_processes: int) -> int:
    """Run `rlhfkit <argv>` on `num_processes` processes and return the launch's exit code: the code the
    processes agreed on (143/130 after SIGTERM/SIGINT, like a single process), or non-zero with a line
    naming the process that died or failed. The launcher stops the other processes when one dies, so
    no launch outlives its first failure by more than the launcher's grace period (30 s)."""
    with tempfile.TemporaryDirectory(prefix="rlhfkit-launch-") as status:
        env = os.environ | {
            STATUS_DIR: status,
            RUN_STAMP: os.environ.get(RUN_STAMP) or f"{datetime.now():%Y%m%d-%H%M%S}",
        }
        # its own session: a Ctrl-C in the terminal reaches this process alone, which hands it to the
        # training processes so they checkpoint; the launcher would give them 30 s, then SIGKILL them
        launcher = subprocess.Popen(launch_command(argv, num_processes), env=env, start_new_session=True)
        with forward_stop_signals(launcher, Path(status)):
            code = launcher.wait()
        return launch_outcome(code, read_launch_status(Path(status), num_processes))


@contextlib.contextmanager
def forward_stop_signals(launcher: subprocess.Popen, status: Path):
    """SIGTERM/SIGINT to this process go to every training process (or, before they started, to the
    launcher), which stop together after the current step."""

    def forward(signum: int, _frame) -> None:
        pids = [int(p.read_text()) for p in status.glob("rank-*.pid")]
        for pid in pids or [launcher.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class ProcessStatus:
    rank: int
    pid: int | None  # None: never started
    exit_code: int | None  # None: ended without exiting (killed) or still running when the launch ended


def read_launch_status(status: Path, num_processes: int) -> list[ProcessStatus]:
    return [
        ProcessStatus(rank, read_number(status / f"rank-{rank}.pid"), read_number(status / f"rank-{rank}.exit"))
        for rank in range(num_processes)
    ]


def read_number(path: Path) -> int | None:
    return int(path.read_text()) if path.is_file() else None


def write_number(path: Path, number: int) -> None:
    """Whole or not at all, for a process reading `path` meanwhile."""
    write_text_atomic(path, str(number))


def launch_outcome(launcher_code: int, processes: list[ProcessStatus]) -> int:
    """The launch's exit code, after one line per process that died or failed (on stderr)."""
    codes = {p.exit_code for p in processes}
    if len(codes) == 1 and None not in codes:
        return codes.pop()  # all agreed: 0, a user error, or a preemption
    for p in sorted(processes, key=lambda p: p.exit_code is not None):  # the dead first: they are the cause
        if p.pid is None:
            report(f"process {p.rank} never started")
        elif p.exit_code is None:
            report(
                f"process {p.rank} (pid {p.pid}) died without exiting (killed by a signal, e.g. SIGKILL or the "
                "out-of-memory killer); the launch stopped the other processes"
            )
        elif p.exit_code:
            report(f"process {p.rank} (pid {p.pid}) exited with code {p.exit_code}")
    return next((p.exit_code for p in processes if p.exit_code), None) or launcher_code or 1


def report(line: str) -> None:
    print(f"rlhfkit: {line}", file=sys.stderr, flush=True)


def say_once(line: str) -> None:
    """`line` on stderr, once per launch: of the processes `relaunch` started, which meet a user error
    together, only the first to say it does. Elsewhere it is printed."""
    folder = os.environ.get(STATUS_DIR)
    if folder and "RANK" in os.environ:
        try:  # creating the mark succeeds in one process only
            (Path(folder) / f"said-{hashlib.sha256(line.encode()).hexdigest()[:16]}").open("x").close()
        except FileExistsError:
            return
    print(line, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    code: int = 1  # until the command returns: a traceback counts as 1


@contextlib.contextmanager
def launched_process_status():
    """Around a command: in a process started by `relaunch`, record its pid on entry and its exit code
    (`outcome.code`, or the SystemExit's) on leaving, so the launch can name a process that died or failed.

    A process that ends non-zero as every process of the launch does (the same user error, a stop they
    agreed on) then exits 0: torch elastic's agent would stop the processes still ending (SIGTERM, which
    kills one in its exit) and report a failure, where `relaunch` returns the code they recorded.

    An error raised after another process failed or died (its connections closed in the middle of a
    collective) follows from that failure: one line says so instead of its traceback."""
    outcome = Outcome()
    folder, rank = os.environ.get(STATUS_DIR), os.environ.get("RANK")
    if not folder or rank is None:
        yield outcome
        return
    status = Path(folder)
    write_number(status / f"rank-{rank}.pid", os.getpid())
    try:
        yield outcome
    except SystemExit as e:
        outcome.code = e.code if isinstance(e.code, int) else 1
    except Exception as e:
        cause = failed_peer(status, int(rank))
        if cause is None:
            raise
        report(f"process {rank} stopped: process {cause} failed or died first ({type(e).__name__} in this one)")
    finally:
        write_number(status / f"rank-{rank}.exit", outcome.code)
    if outcome.code and not all_ended_alike(status, outcome.code):
        raise SystemExit(outcome.code)  # alone: the agent stops the others
    outcome.code = 0


def failed_peer(status: Path, rank: int) -> int | None:
    """Another process of the launch that recorded a non-zero exit code, or that ended without recording one."""
    others = [other for other in range(int(os.environ.get("WORLD_SIZE", "1"))) if other != rank]
    return next((other for other in others if read_number(status / f"rank-{other}.exit") or died(status, other)), None)


def died(status: Path, rank: int) -> bool:
    """Whether process `rank` started and ended without recording its exit code (killed)."""
    pid = read_number(status / f"rank-{rank}.pid")
    return pid is not None and not running(pid) and read_number(status / f"rank-{rank}.exit") is None


def running(pid: int) -> bool:
    """Whether `pid` runs: neither gone nor a zombie (dead, not yet reaped by the launcher)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: whether it can be signalled
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 0)
            return True
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def all_ended_alike(status: Path, code: int) -> bool:
    """Whether every process of the launch records `code`, waiting up to AGREEMENT_WAIT seconds for them
    (not for one that died)."""
    ranks = range(int(os.environ.get("WORLD_SIZE", "1")))
    deadline = time.monotonic() + AGREEMENT_WAIT
    while True:
        codes = {read_number(status / f"rank-{rank}.exit") for rank in ranks}
        if codes - {code, None} or any(died(status, rank) for rank in ranks) or time.monotonic() > deadline:
            return False
        if codes == {code}:
            return True
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(run_launcher(sys.argv[1:]))
