"""One run per folder: a process that would write to a run directory in use refuses to start.

Two processes writing one folder would interleave checkpoints, metrics and config.yaml. A run
directory in use holds `.rlhfkit.lock` (pid, host, the process's start tick, when it took the
folder), created with O_CREAT|O_EXCL so that of two processes starting at once exactly one gets it,
and removed when that process exits, also through an error or SIGTERM. A lock whose process no
longer runs on this host (killed, crashed, out of memory) is reported in one line and taken over.
The holder may lock its folder again: the pipeline runs its stages in one process, and a resumed
run reuses its folder.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import RunLockedError
from .preemption import exit_code

LOCK_FILE = ".rlhfkit.lock"
HELD: set[Path] = set()  # lock files this process holds, removed at exit


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir` until this process exits; RunLockedError while another running process holds it."""
    path = (run_dir / LOCK_FILE).resolve()
    while not create(path, holder_record(os.getpid())):
        holder = read_holder(path, run_dir)
        if holder is None:  # released since: try again
            continue
        if same_process(holder, os.getpid()):
            break
        if running(holder):
            raise RunLockedError(
                f"{run_dir} is in use by process {holder['pid']} on {holder['host']} (since {holder['started']}); "
                f"wait for it to end or choose another output_dir; if that process is gone, delete {path}"
            )
        print(f"rlhfkit: warning: {path} was left by process {holder['pid']} (since {holder['started']}), which no longer "
              "runs; taking the folder over", file=sys.stderr)
        path.unlink(missing_ok=True)
    HELD.add(path)
    release_on_sigterm()


def release_run_dir(run_dir: Path) -> None:
    """Give `run_dir` back before this process exits: it will not run there after all."""
    path = (run_dir / LOCK_FILE).resolve()
    if path in HELD:
        HELD.discard(path)
        path.unlink(missing_ok=True)


def holder_record(pid: int) -> dict[str, Any]:
    return {"pid": pid, "host": socket.gethostname(), "process_start": process_start(pid),
            "started": datetime.now().isoformat(timespec="seconds")}


def create(path: Path, record: dict[str, Any]) -> bool:
    """Create the lock file holding `record`; False when it exists already."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record) + "\n")
    return True


def read_holder(path: Path, run_dir: Path) -> dict[str, Any] | None:
    """The lock's record, or None when the lock is gone."""
    try:
        holder = json.loads(path.read_text())
        return {key: holder[key] for key in ("pid", "host", "process_start", "started")}
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        raise RunLockedError(f"{run_dir} holds {path}, which is not an rlhfkit lock file it can read; "
                             "delete it if no run is using this folder") from None


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (Linux; None elsewhere). With the pid it names one
    process for good, where a pid alone may since have been given to another."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # field 22; the command name before ")" may hold spaces


def same_process(holder: dict[str, Any], pid: int) -> bool:
    return (holder["pid"], holder["host"], holder["process_start"]) == (pid, socket.gethostname(), process_start(pid))


def running(holder: dict[str, Any]) -> bool:
    """Whether the lock's process still runs. Another host's processes cannot be looked at: it counts as running."""
    if holder["host"] != socket.gethostname():
        return True
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        pass
    now = process_start(holder["pid"])
    return None in (now, holder["process_start"]) or now == holder["process_start"]  # else the pid was reused


@atexit.register
def release_held() -> None:
    """Remove this process's locks, unless one was deleted and taken by another process meanwhile."""
    for path in HELD:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if same_process(json.loads(path.read_text()), os.getpid()):
                path.unlink()


def release_on_sigterm() -> None:
    """SIGTERM outside a training loop (which stops at a checkpoint itself) would end the process without
    exit handlers and leave the lock behind; exiting as SIGTERM would (143) lets them run."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, exit_on_signal)


def exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(exit_code(signum))
