"""Preemption: SIGTERM (SLURM, Kubernetes) or SIGINT (Ctrl-C) during training ends the run at the next
step boundary with a checkpoint, so a preempted run loses no work.

The training loops run inside `StopSignal()`, which only records the signal. After each optimizer
step (or on-policy update) they check it, write a checkpoint through their usual path (which resumes
exactly) and call `exit_after_checkpoint`: one line says how to resume, and the process exits with
the code a shell reports for a process the signal ended (143, 130). Further signals are ignored, so
a second one cannot cut the checkpoint short.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """While inside, SIGTERM and SIGINT set `signum` instead of ending the process; the handlers that
    were there come back on leaving. Only the main thread may set handlers, so elsewhere it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self.record) for signum in SIGNALS}
        return self

    def __exit__(self, *_exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def record(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
            # os.write, not print: print raises when the signal lands while the interrupted code prints
            os.write(2, f"\nrlhfkit: {signal.Signals(signum).name} received; finishing the current step, then writing a "
                        "checkpoint and stopping\n".encode())


def exit_code(signum: int) -> int:
    """128 + the signal's number: what a shell reports for a process the signal ended (SIGTERM 143, SIGINT 130)."""
    return 128 + signum


def resume_command(command: str, run_dir: Path, processes: int = 1) -> str:
    """How to continue: the same pipeline command line (the pipeline resumes an interrupted stage itself),
    or `rlhfkit <command>` on the run folder, whose config.yaml holds every option of the run."""
    if sys.argv[1:2] == ["pipeline"]:
        return shlex.join(["rlhfkit", *sys.argv[1:]])
    launcher = ["--num-processes", str(processes)] if processes > 1 else []
    return shlex.join(["rlhfkit", command, f"resume={run_dir}", *launcher])


def exit_after_checkpoint(signum: int, step: str, run_dir: Path, resume: str, announce: bool = True) -> NoReturn:
    """Stop after `step` (e.g. "step 12"), whose checkpoint the loop has written; `announce` on the
    process that speaks for the run."""
    if announce:
        print(f"rlhfkit: stopped by {signal.Signals(signum).name} after {step}; checkpoint written to "
              f"{run_dir / 'checkpoints'}; resume with: {resume}", file=sys.stderr, flush=True)
    raise SystemExit(exit_code(signum))
