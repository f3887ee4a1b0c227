"""Fault injection for the reliability suite (tests/test_fault_injection.py).

A process started with RLHFKIT_FAULT=<point>:<step> kills itself with SIGKILL when it reaches that
point of that step, as a preempted or out-of-memory job would die: no handler runs, no file is
closed. The points sit where a crash is hardest to survive, inside a checkpoint write. Without the
variable nothing happens.
"""

from __future__ import annotations

import os
import signal

ENV = "RLHFKIT_FAULT"
POINTS = ("save", "publish")  # save: weights written, state and manifest not; publish: folder in place, `latest` not moved


def fault_point(point: str, step: int) -> None:
    if os.environ.get(ENV) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
