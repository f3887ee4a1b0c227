"""One run per folder: a process that would write to a run directory in use refuses to start.

Two processes writing one folder would interleave checkpoints, metrics and config.yaml. A run
directory in use holds `.rlhfkit.lock` (pid, host, the process's start tick, when it took the
folder), removed when that process exits, also through an error or SIGTERM. The record is written
beside the lock and linked into place, which fails when a lock is there already: of two processes
starting at once exactly one gets it, and a lock is whole from the moment it exists. A lock whose
process no longer runs on this host (killed, crashed, out of memory), or one that is empty or
unreadable (left by a crash, or a full disk, mid-write by an earlier rlhfkit), is reported in one line
and taken over. The holder may lock its folder again: the pipeline runs its stages in one process,
and a resumed run reuses its folder.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import RunLockedError, warn
from .faults import disk_full_reason, room_for
from .preemption import exit_code

LOCK_FILE = ".rlhfkit.lock"
HELD: set[Path] = set()  # lock files this process holds, removed at exit
SETTLE_SECONDS = 2.0  # an unreadable lock older than this is no longer being written


def lock_run_dir(run_dir: Path) -> None:
    """Hold `run_dir` until this process exits; RunLockedError while another running process holds it."""
    path = (run_dir / LOCK_FILE).resolve()
    while not create(path, holder_record(os.getpid())):
        found = read_lock(path)
        if found is None:  # released since: try again
            continue
        holder = parse_holder(found)
        if holder is not None and same_process(holder, os.getpid()):
            break
        if holder is not None and running(holder):
            raise RunLockedError(
                f"{run_dir} is in use by process {holder['pid']} on {holder['host']} (since {holder['started']}); "
                f"wait for it to end or choose another output_dir; if that process is gone, delete {path}"
            )
        if holder is None and not settled(path):  # on a file system without hard links it may be mid-write
            time.sleep(0.1)
            continue
        warn(f"{path} was left by {describe(holder)}; taking the folder over")
        remove_stale(path, found)
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
    """Put the lock holding `record` at `path`, whole from the moment it exists; False when one is there
    already. A full disk is one line (DiskFullError), leaving no lock behind."""
    data = (json.dumps(record) + "\n").encode()
    with room_for(path.parent, f"its lock file {path.name}", len(data), "run the command again"):
        fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return put_in_place(Path(draft), path, data)
        finally:
            os.unlink(draft)


def put_in_place(draft: Path, path: Path, data: bytes) -> bool:
    """Link the written `draft` to `path` unless something is there; False when it was."""
    try:
        os.link(draft, path)
    except FileExistsError:
        return False
    except OSError as e:  # a file system without hard links (FAT, some FUSE mounts): create, then write at once
        if disk_full_reason(e):
            raise
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return True


def read_lock(path: Path) -> bytes | None:
    """The lock's bytes, or None when the lock is gone."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def parse_holder(data: bytes) -> dict[str, Any] | None:
    """The lock's record (pid, host, process start, when), or None when it is empty or not one."""
    try:
        holder = json.loads(data)
        return {key: holder[key] for key in ("pid", "host", "process_start", "started")}
    except (ValueError, KeyError, TypeError):
        return None


def settled(path: Path) -> bool:
    """Whether an unreadable lock has been so for long enough that no process is still writing it: a lock is
    written whole when linked into place, and within a moment of its creation where it cannot be."""
    with contextlib.suppress(FileNotFoundError):
        return time.time() - path.stat().st_mtime > SETTLE_SECONDS
    return False


def describe(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "a process that died while writing it (it is empty or unreadable)"
    return f"process {holder['pid']} (since {holder['started']}), which no longer runs"


def remove_stale(path: Path, found: bytes) -> None:
    """Remove the stale lock that held `found`, but not a lock another process took over it meanwhile: it is
    moved aside first (of two processes doing so, one moves it) and put back when it is not the stale one."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another process removed it first
        return
    if (taken := aside.read_bytes()) != found:
        put_in_place(aside, path, taken)
    aside.unlink()


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
