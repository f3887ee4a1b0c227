"""Preemption: SIGTERM (SLURM, Kubernetes) or SIGINT (Ctrl-C) during training ends the run at the next
step boundary with a checkpoint, so a preempted run loses no work.

The training loops run inside `StopSignal()`, which only records the signal. After each optimizer
step (or on-policy update) they check it, write a checkpoint through their usual path (which resumes
exactly) and call `exit_after_checkpoint`: one line says how to resume, and the process exits with
the code a shell reports for a process the signal ended (143, 130). Further signals are ignored, so
a second one cannot cut the checkpoint short.

Waiting for the step to end is wrong where the work in hand may never end or can simply be done
again: a reward function's call (user code in the main thread, which a handler that only records
never interrupts), an evaluation, DPO's reference pass. There the signal raises `Interrupted` at
once: inside `interruptible()` (a region within a step) or `StopSignal(at_once=True)` (work outside
the steps), and `stopping_at_once` turns it into the same one line and exit code.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from .errors import say

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# set by the Python API for the length of a call: how that call is continued or started again from Python, which
# the stop lines name instead of a command line (a command line cannot supply the call's Python objects)
PYTHON_CALLS: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "rlhfkit_python_calls", default=None
)


@contextlib.contextmanager
def continued_from_python(resume: str, restart: str):
    """Within the block, a stop line says `resume` (the call that continues the run) or, before the first
    checkpoint, `restart` (the call that starts it again)."""
    token = PYTHON_CALLS.set((resume, restart))
    try:
        yield
    finally:
        PYTHON_CALLS.reset(token)


class Interrupted(BaseException):
    """A stop signal raised where the work in hand is dropped rather than finished. A BaseException, so
    that a reward function's `except Exception` does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignal:
    """While inside, SIGTERM and SIGINT set `signum` instead of ending the process; the handlers that
    were there come back on leaving. Only the main thread may set handlers, so elsewhere it does nothing.
    With `at_once` the signal also raises `Interrupted`; `droppable`: `interruptible()` regions may raise
    it (a step of a run on several processes cannot be dropped on one: its collectives would wait forever)."""

    def __init__(self, at_once: bool = False, droppable: bool = True) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}
        self.at_once = at_once
        self.droppable = droppable

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self.record) for signum in SIGNALS}
            ACTIVE.append(self)
        return self

    def __exit__(self, *_exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if self in ACTIVE:
            ACTIVE.remove(self)

    def record(self, signum: int, _frame) -> None:
        if self.signum is None:
            self.signum = signum
            if not self.at_once:
                # os.write, not print: print raises when the signal lands while the interrupted code prints
                os.write(
                    2,
                    f"\nrlhfkit: {signal.Signals(signum).name} received; finishing the current step, then writing a "
                    "checkpoint and stopping\n".encode(),
                )
        if self.at_once:
            raise Interrupted(signum)


ACTIVE: list[StopSignal] = []  # the StopSignals the main thread is inside, innermost last


@contextlib.contextmanager
def interruptible():
    """Inside a step, for a call that may never return (a reward function): a stop signal, or one that
    came before, raises `Interrupted` instead of waiting for the step to end; so does one the call
    swallowed. Outside a StopSignal, or in one that cannot drop a step, it does nothing."""
    stop = ACTIVE[-1] if ACTIVE else None
    if stop is None or stop.at_once or not stop.droppable:
        yield
        return
    stop.at_once = True
    try:
        if stop.signum is not None:
            raise Interrupted(stop.signum)
        yield
        if stop.signum is not None:
            raise Interrupted(stop.signum)
    finally:
        stop.at_once = False


def exit_code(signum: int) -> int:
    """128 + the signal's number: what a shell reports for a process the signal ended (SIGTERM 143, SIGINT 130)."""
    return 128 + signum


def resume_command(command: str, run_dir: Path, processes: int = 1) -> str:
    """How to continue: the same pipeline command line (the pipeline resumes an interrupted stage itself),
    or `rlhfkit <command>` on the run folder, whose config.yaml holds every option of the run; under the Python
    API, its call (`continued_from_python`)."""
    if (python := PYTHON_CALLS.get()) is not None:
        return python[0]
    if sys.argv[1:2] == ["pipeline"]:
        return shlex.join(["rlhfkit", *sys.argv[1:]])
    launcher = ["--num-processes", str(processes)] if processes > 1 else []
    return shlex.join(["rlhfkit", command, f"resume={run_dir}", *launcher])


def restart_command(command: str, run_dir: Path, processes: int = 1) -> str:
    """How to continue a run stopped before its first checkpoint: the same pipeline command line, or
    `rlhfkit <command>` with the run's own config.yaml, which starts the same run again in its folder; under the
    Python API, its call (`continued_from_python`)."""
    if (python := PYTHON_CALLS.get()) is not None:
        return python[1]
    if sys.argv[1:2] == ["pipeline"]:
        return shlex.join(["rlhfkit", *sys.argv[1:]])
    launcher = ["--num-processes", str(processes)] if processes > 1 else []
    return shlex.join(["rlhfkit", command, "--config", str(run_dir / "config.yaml"), *launcher])


@contextlib.contextmanager
def stopping_at_once(run_dir: Path, checkpointed: str | None, command: str):
    """Around work outside the steps (an evaluation, DPO's reference pass): SIGTERM or SIGINT ends it at
    once, in one line naming the checkpoint `checkpointed` (e.g. "step 12") and the `command` that
    continues (`resume_command`), or, with no checkpoint yet (None), the command that starts the run
    again (`restart_command`); then the signal's exit code."""
    try:
        with StopSignal(at_once=True):
            yield
    except Interrupted as stop:
        if checkpointed is not None:
            exit_after_checkpoint(stop.signum, checkpointed, run_dir, command)
        exit_before_checkpoint(stop.signum, command)


def exit_before_checkpoint(signum: int, restart: str) -> NoReturn:
    say(
        f"rlhfkit: stopped by {signal.Signals(signum).name} before the run's first checkpoint; start it again with: "
        f"{restart}"
    )
    raise SystemExit(exit_code(signum))


def exit_after_checkpoint(signum: int, step: str, run_dir: Path, resume: str, announce: bool = True) -> NoReturn:
    """Stop after `step` (e.g. "step 12"), whose checkpoint the loop has written; `announce` on the
    process that speaks for the run."""
    if announce:
        say(
            f"rlhfkit: stopped by {signal.Signals(signum).name} after {step}; checkpoint written to "
            f"{run_dir / 'checkpoints'}; "
            f"resume with: {resume}"
        )
    raise SystemExit(exit_code(signum))
