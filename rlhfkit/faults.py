"""Faults a run meets without causing them: killed processes, injected for the reliability suite
(tests/runs/test_fault_injection.py), and a full disk.

A process started with RLHFKIT_FAULT=<point>:<step> kills itself with SIGKILL when it reaches that
point of that step, as a preempted or out-of-memory job would die: no handler runs, no file is
closed. The points sit where a crash is hardest to survive, inside a checkpoint write. Without the
variable nothing happens.

A write that finds the disk full (no space left, or the user's quota used up) stops the run with one
line naming the folder, what was being written and about how large it is (`room_for`), instead of
the traceback of whichever library was writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

from .errors import DiskFullError

ENV = "RLHFKIT_FAULT"
# save: weights written, state and manifest not; publish: folder in place, `latest` not moved
POINTS = ("save", "publish")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def fault_point(point: str, step: int) -> None:
    """SIGKILL this process when RLHFKIT_FAULT names `point` at `step`. A point outside POINTS, in the code or in
    the variable, is refused: a misspelt point would otherwise never fire and the fault test would pass untested."""
    named = os.environ.get(ENV)
    for where, name in (("fault_point", point), (ENV, (named or "").partition(":")[0])):
        if name and name not in POINTS:
            raise ValueError(f"{where}: no fault point {name!r}; the points are {', '.join(POINTS)}")
    if named == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def disk_full_reason(error: BaseException | None) -> str | None:
    """ "No space left on device" or "Disk quota exceeded" when `error`, or an error it was raised from or
    while handling, is the file system refusing a write for lack of room; else None. Libraries keep only
    the text: safetensors says "No space left on device (os error 28)", and torch.save raises its own
    error while handling the OSError of the file it writes to."""
    reasons = [os.strerror(code) for code in DISK_FULL]
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return os.strerror(error.errno)
        if found := next((reason for reason in reasons if reason in str(error)), None):
            return found
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def room_for(folder: Path, what: str, size: int, then: str) -> Iterator[None]:
    """Around writing `what` (about `size` bytes) into `folder`: a full disk becomes one line saying so and
    what to do `then`, once there is room (the caller removes what it half wrote)."""
    try:
        yield
    except Exception as e:
        reason = disk_full_reason(e)
        if reason is None:
            raise
        # a quota is not what the file system reports free
        free = f"; {readable_size(free_space(folder))} free there" if reason == os.strerror(errno.ENOSPC) else ""
        raise DiskFullError(
            f"{reason.lower()} in {folder} while writing {what} (about {readable_size(size)}{free}): free space or "
            f"raise the quota, then {then}"
        ) from None


def write_text_atomic(path: Path, text: str) -> None:
    """Replace the file `path` by `text` through a temporary file beside it, renamed into place: a write cut
    short (a full disk, a kill) leaves the old file whole, and no half-written temporary file holds the space."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:  # already renamed after a good write
        tmp.unlink(missing_ok=True)


def continue_run(run_dir: Path) -> str:
    """What to do after a full disk stopped the run in `run_dir`."""
    return f"continue with resume={run_dir} (from its last complete checkpoint)"


def free_space(folder: Path) -> int:
    """Bytes free for this user on the file system of `folder`, or of its nearest existing parent."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    return shutil.disk_usage(existing).free


def readable_size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}"
        size /= 1000
    return f"{size:.0f} TB"
