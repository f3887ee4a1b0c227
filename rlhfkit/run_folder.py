"""The folder a training run writes: never another run's, and left as it was found when the run fails
on a user error before it started.

A folder holding a run (its config.yaml) takes a new run only in three cases: the new run continues
it (`resume=`); it is the same run (the same options) that stopped before it saved a checkpoint or a
model, which starts again in place (reading back what it had cached, its curves starting afresh); or
`overwrite=true`, which first moves the old run aside to `<folder>.old-<time>`, so none of its files
is overwritten and no TensorBoard event file mixes with the new run's. A finished run, a run with
checkpoints to resume, or a run with other options is refused in one line. Kept free of torch: the
command line reads it to check `resume=` before anything loads.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, UserError
from .runlock import LOCK_FILE, lock_run_dir, release_run_dir

CONFIG_FILE = "config.yaml"
# what the run's `auto` options resolved to on the machine that started it, and the machine facts its numbers
# depend on (threads, device); a resumed run keeps them (trainers/run.py `settled`)
RESOLVED_FILE = "resolved.yaml"
IGNORED_OPTIONS = ("output_dir", "resume", "overwrite")  # where and how a run was started, not what it runs
LONGER = "the learning-rate schedule is recomputed for the new length and continues from the step reached"
# the options a resumed run may change, each taking effect as said; any other change is refused, since the
# model, data order, optimizer and schedule come back from the checkpoint and would silently ignore it
RESUME_CHANGEABLE = {
    "max_steps": LONGER,
    "num_epochs": LONGER,
    "save_every": "from the next step",
    "keep_checkpoints": "at the next save",
    "log_every": "from the next step",
    "report_to": "from the next step",
}


@dataclass
class OpenedRun:
    """A run folder this process opened: what it held before, the folders made for it (innermost first),
    and where the run it held was moved aside to."""

    folder: Path
    found: set[str]
    created: list[Path]
    aside: Path | None


OPENED: list[OpenedRun] = []


def read_resolved(run_dir: Path) -> dict[str, Any]:
    """The run's resolved.yaml (`record_resolved`); empty for a run without one (started before it existed)."""
    path = Path(run_dir) / RESOLVED_FILE
    if not path.is_file():
        return {}
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML ({e}); delete it to resolve the auto options afresh") from None
    return values if isinstance(values, dict) else {}


def record_resolved(run_dir: Path, values: dict[str, Any]) -> None:
    """Add `values` to the run's resolved.yaml, beside what it holds."""
    merged = read_resolved(run_dir) | values
    with writing(run_dir, f"write {RESOLVED_FILE} in"):
        (Path(run_dir) / RESOLVED_FILE).write_text(yaml.safe_dump(merged, sort_keys=False))


def require_resume_path(resume: str) -> None:
    """`resume=` names something on disk (what it holds is checked when its checkpoint is looked for)."""
    if not Path(resume).exists():
        raise ConfigError(
            f"resume={resume}: no such run folder or checkpoint; give the output_dir of an earlier run "
            "(or one of its checkpoints/step-N folders)"
        )


def open_run_folder(run_dir: Path, config_text: str, overwrite: bool, continuing: bool) -> None:
    """Make or reuse `run_dir` for a run whose resolved options are `config_text`, lock it and write its
    config.yaml; `continuing`: the run resumes from a checkpoint of this folder."""
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    with writing(run_dir, "create"):
        run_dir.mkdir(parents=True, exist_ok=True)
        lock_run_dir(run_dir)  # first: a folder another process runs in is refused as such
    aside = make_room(run_dir, config_text, overwrite) if not continuing else None
    found = set(os.listdir(run_dir))
    with writing(run_dir, "write in"):
        (run_dir / CONFIG_FILE).write_text(config_text)
    OPENED.append(OpenedRun(run_dir, found, created, aside))


def make_room(run_dir: Path, config_text: str, overwrite: bool) -> Path | None:
    """With `overwrite`, move the run (or the other files) in `run_dir` aside and return where; else refuse in one
    line a run the new one must not replace, or files that are not a run. The same run, stopped before it saved
    anything, starts again in place (None); so does a run in an empty folder."""
    has_run = (run_dir / CONFIG_FILE).is_file()
    refusal = kept_run(run_dir, config_text) if has_run else foreign_files(run_dir)
    if not (refusal or overwrite and has_run):
        return None
    release_run_dir(run_dir)
    if not overwrite:
        raise ConfigError(refusal)
    aside = free_name(run_dir.with_name(f"{run_dir.name}.old-{datetime.now():%Y%m%d-%H%M%S}"))
    with writing(run_dir, "move aside the run in"):
        run_dir.rename(aside)
        run_dir.mkdir()
        lock_run_dir(run_dir)
    print(f"rlhfkit: overwrite=true: moved the {'run' if has_run else 'files'} in {run_dir} aside to {aside}")
    return aside


def resumed_changes(run_dir: Path, config_text: str, resume: str) -> list[str]:
    """Refuse, naming each, the options of a run resumed from `run_dir` that differ from the ones it was
    started with and could not take effect; return a line for each change that does (RESUME_CHANGEABLE).
    Options the run's config.yaml lacks (added to rlhfkit since) are not compared."""
    try:
        old = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return []  # a checkpoint without its run's config.yaml: nothing to compare with
    if not isinstance(old, dict):
        return []
    new = yaml.safe_load(config_text)
    changed = {
        key: (old[key], new[key]) for key in new if key in old and key not in IGNORED_OPTIONS and old[key] != new[key]
    }
    refused = [
        f"{key}={new_value} (the run has {old_value})"
        for key, (old_value, new_value) in changed.items()
        if key not in RESUME_CHANGEABLE
    ]
    if refused:
        raise ConfigError(
            f"resume={resume} continues a run with its own options; these could not take effect and are refused: "
            f"{'; '.join(refused)}. Drop them, or start a new run (a new output_dir) with them; a resumed run "
            f"may change only {', '.join(RESUME_CHANGEABLE)}"
        )
    return [
        f"rlhfkit: resume: {key} {old_value} -> {new_value}: {RESUME_CHANGEABLE[key]}"
        for key, (old_value, new_value) in changed.items()
    ]


def free_name(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`, ... whichever does not exist yet."""
    candidates = itertools.chain([path], (path.with_name(f"{path.name}-{n}") for n in itertools.count(2)))
    return next(p for p in candidates if not p.exists())


def foreign_files(run_dir: Path) -> str | None:
    """Why a folder without a run's config.yaml must not take a run: it holds someone's files (None: empty)."""
    files = sorted(set(os.listdir(run_dir)) - {LOCK_FILE})
    if not files:
        return None
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (
        f"output_dir={run_dir} is not empty ({shown}) and holds no rlhfkit run (no {CONFIG_FILE}): a run would write "
        "over "
        "those files; choose a new or empty output_dir, or set overwrite=true to move the folder aside"
    )


def holds_other_run(run_dir: Path, config_text: str) -> bool:
    """Whether `run_dir` holds a run that a new run with `config_text` must not replace (see `kept_run`)."""
    return (run_dir / CONFIG_FILE).is_file() and kept_run(run_dir, config_text) is not None


def kept_run(run_dir: Path, config_text: str) -> str | None:
    """Why the run in `run_dir` must not be replaced by a new run with `config_text` (None: it may)."""
    resumable = any((run_dir / "checkpoints").glob("step-*"))
    if (run_dir / "model").exists():
        held = "a finished run"
    elif resumable:
        held = "an unfinished run with checkpoints"
    elif changed := changed_options((run_dir / CONFIG_FILE).read_text(), config_text):
        held = f"another run (its config.yaml differs in {', '.join(changed)})"
    else:
        return None
    resume = f"pass resume={run_dir} to continue it, " if resumable else ""
    return f"output_dir={run_dir} holds {held}; {resume}choose a new output_dir, or set overwrite=true to move it aside"


def changed_options(old_text: str, new_text: str) -> list[str]:
    """The options two config.yaml texts set differently (a few named, the rest counted)."""
    try:
        old = yaml.safe_load(old_text)
    except yaml.YAMLError:
        old = None
    if not isinstance(old, dict):
        return ["all options: it is not an rlhfkit config"]
    new = yaml.safe_load(new_text)
    changed = [key for key in {**old, **new} if key not in IGNORED_OPTIONS and old.get(key) != new.get(key)]
    return changed[:4] + ([f"{len(changed) - 4} more"] if len(changed) > 4 else [])


@contextlib.contextmanager
def writing(run_dir: Path, action: str) -> Iterator[None]:
    """An OS refusal (read-only file system, a path through a file, no permission) as one line naming the folder."""
    try:
        yield
    except OSError as e:
        raise ConfigError(
            f"cannot {action} output_dir={run_dir}: {e.strerror or e}; choose a writable folder"
        ) from None


@contextlib.contextmanager
def unstarted_runs_taken_back() -> Iterator[None]:
    """A run opened in the block that fails with a user error (bad data, a model that cannot load) before
    it wrote anything but its config.yaml leaves its folder as it found it. Every folder opened in the
    block is unlocked when it ends: a command's process ends there, but a Python session goes on and may
    resume the run or read its folder from another process."""
    first = len(OPENED)
    try:
        yield
    except UserError:
        for run in reversed(OPENED[first:]):
            take_back(run)
        raise
    finally:
        for run in OPENED[first:]:
            release_run_dir(run.folder)
        del OPENED[first:]


def take_back(run: OpenedRun) -> None:
    """`run`'s folder as it was before the run, unless the run wrote more than its config.yaml there."""
    opening = {CONFIG_FILE, RESOLVED_FILE, LOCK_FILE}  # what a run writes before it starts
    if not run.folder.is_dir() or set(os.listdir(run.folder)) - run.found - opening:
        return  # the run had begun writing: what it wrote stays
    release_run_dir(run.folder)
    for name in (CONFIG_FILE, RESOLVED_FILE):
        if name not in run.found:
            (run.folder / name).unlink(missing_ok=True)
    if run.aside is not None:  # the run moved aside comes back
        run.folder.rmdir()
        run.aside.rename(run.folder)
        print(f"rlhfkit: moved {run.aside} back to {run.folder}")
    for folder in run.created:
        with contextlib.suppress(OSError):  # one that is not empty holds something else: it stays
            folder.rmdir()
