"""Errors a user can act on. The CLI prints their message in one line instead of a traceback; `warn`
prints a warning the same way."""

import sys

from tqdm import tqdm  # the base class: its live-bar set holds tqdm.auto's bars too (widgets in a notebook)


class UserError(Exception):
    """Base class: the message names what is wrong (key, file, line, step) and what to do."""


class ConfigError(UserError, ValueError):
    """A configuration value or key the user must fix."""


class DataFormatError(UserError, ValueError):
    """Input not in the expected upstream format; the message names file, line and field."""


class ModelError(UserError, RuntimeError):
    """A model that cannot be found, loaded or prepared."""


class NonFiniteError(UserError, RuntimeError):
    """A loss or gradient became NaN/inf; the run stops and the last good checkpoint is kept."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint to resume from that is missing files or whose files changed after saving."""


class RunLockedError(UserError, RuntimeError):
    """Another running process writes the run directory; the message names the folder and its pid."""


class DiskFullError(UserError, RuntimeError):
    """A write found no space left (or the quota used up); the message names the folder and the size needed.
    Not an OSError, which the run folder's checks would report as a folder that cannot be written."""


def warn(message: str) -> None:
    """One `rlhfkit: warning:` line on stderr (see `say`)."""
    say(f"rlhfkit: warning: {message}")


def say(line: str) -> None:
    """`line` on stderr at the start of a line (`grep '^rlhfkit: warning'` finds it in a log): a progress bar on
    screen leaves its line open to redraw it after `\\r`, so that line is ended first."""
    line_start = "\n" if tqdm._instances else ""  # tqdm's live bars; a closed or disabled bar leaves the set
    print(f"{line_start}{line}", file=sys.stderr, flush=True)
