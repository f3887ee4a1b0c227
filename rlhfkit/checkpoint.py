"""Atomic checkpoints and exact resume.

A checkpoint is a folder `checkpoints/step-NNNNNN/` holding the model and tokenizer as
`save_pretrained` folders (safetensors; PPO adds its value model as `value/`; with LoRA, the adapters
and scalar heads alone: `adapters.py`), `state.pt` (optimizer
and scheduler, plus any further ones such as PPO's value optimizer, read back with
`weights_only=True`), `rng.json` (python, numpy and torch RNG states) and `trainer.json` (step and
data position), and last `manifest.json` (every other file's size and sha256). It is written under a
temporary name and renamed into place, so a crash mid-save never leaves a broken latest checkpoint;
`latest` names the newest complete one. Resume checks the manifest, so a checkpoint damaged later
(a truncated copy, a bad disk) is caught and an older intact one is used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import errors
from .adapters import save_weights
from .errors import CheckpointError
from .faults import continue_run, fault_point, room_for, write_text_atomic

LATEST = "latest"
MANIFEST = "manifest.json"
# What resume reads from a checkpoint saved before manifests (besides the model's safetensors)
LEGACY_NEEDS = ("trainer.json", "state.pt", "rng.json", "model/config.json")


def rng_state() -> dict[str, Any]:
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
        "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    keep: int = 2,
    extra_models: dict[str, torch.nn.Module] | None = None,
    extra_states: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` atomically, point `latest` at it, keep the newest `keep` (0: all).

    `extra_models` are saved as `save_pretrained` folders named by their key; `extra_states` are
    objects with `state_dict()` (optimizers, schedulers) stored in state.pt under their key. A write that
    fails (a full disk: DiskFullError) leaves no temporary folder and `latest` as it was.
    """
    folder = run_dir / "checkpoints"
    final = folder / f"step-{step:06d}"
    models = {"model": model, **(extra_models or {})}
    states = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    states |= {name: obj.state_dict() for name, obj in (extra_states or {}).items()}
    with room_for(folder, f"checkpoint {final.name}", checkpoint_size(models.values(), states),
                  continue_run(run_dir)):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".tmp-step-{step:06d}-"))
        try:
            write_checkpoint_files(tmp, step, models, tokenizer, states, trainer_state)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:  # gone once renamed; after a failure its half-written files would hold the space the run needs
            shutil.rmtree(tmp, ignore_errors=True)
        fault_point("publish", step)
        write_json_atomic(folder / LATEST, {"checkpoint": final.name, "step": step})
    prune(folder, keep)
    return final


def write_checkpoint_files(tmp: Path, step: int, models: dict[str, torch.nn.Module], tokenizer: Any,
                           states: dict[str, Any], trainer_state: dict[str, Any]) -> None:
    for name, saved in models.items():  # each a complete folder (or adapter), loadable on its own
        save_weights(saved, tmp / name)
        tokenizer.save_pretrained(tmp / name)
    fault_point("save", step)
    with (tmp / "state.pt").open("wb") as f:  # through a Python file: a full disk then raises an OSError naming it
        torch.save(states, f)
    (tmp / "rng.json").write_text(json.dumps(rng_state()))
    (tmp / "trainer.json").write_text(json.dumps({"step": step, **trainer_state}, indent=2))
    write_manifest(tmp)


def checkpoint_size(models: Iterable[torch.nn.Module], states: dict[str, Any]) -> int:
    """About the bytes of a checkpoint: the weights it saves (those that train: an adapter's alone) and
    every tensor of the optimizer and scheduler states; tokenizer files and JSON are left out."""
    weights = sum(p.numel() * p.element_size() for model in models for p in model.parameters() if p.requires_grad)
    return weights + tensor_bytes(states)


def tensor_bytes(value: Any) -> int:
    """The bytes of every tensor in nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return 0


def prune(folder: Path, keep: int) -> None:
    for stale in folder.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep <= 0:
        return
    for old in sorted(folder.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def write_manifest(folder: Path) -> None:
    """List every file of `folder` with its size and sha256; written after all of them, so it covers
    the whole checkpoint."""
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def find_checkpoint(path: str | Path) -> Path | None:
    """The newest intact checkpoint of a run directory or a checkpoints folder, or the checkpoint
    named itself; None where nothing was ever checkpointed.

    Intact: every file its manifest lists is there with the listed size and sha256. The candidates
    are the checkpoint `latest` names and the older ones, newest first (step folders newer than the
    one it names are leftovers of a run resumed from an older checkpoint); a damaged candidate, or a
    `latest` that is missing, unreadable or names a missing folder, is reported on stderr in one line
    naming the file, and the next older one is tried. With none intact this raises CheckpointError
    rather than return None, which would let a pipeline stage start over beside checkpoints that
    need a decision. A checkpoint named itself is never swapped for another: a damaged one raises.

    A checkpoint saved before manifests cannot be verified: it is accepted, with a warning, when it
    holds every file resume reads (trainer.json, state.pt, rng.json, the model's config and
    safetensors; PPO's value/ folder is not checked), and skipped as damaged otherwise.
    """
    path = Path(path)
    if (path / MANIFEST).is_file() or (path / "trainer.json").is_file():
        if problem := checkpoint_problem(path):
            raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if not (folder / LATEST).exists() and not any(folder.glob("step-*")):
        return None
    problems = []
    for candidate in newest_first(folder):
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        warn(f"skipping checkpoint {candidate.name}: {problem}")
        problems.append(problem)
    reasons = "; ".join(problems) or f"{folder / LATEST} is unreadable and there are no step folders"
    advice = f"resume another run, or move {folder} away to start afresh"
    raise CheckpointError(f"no intact checkpoint in {folder} ({reasons}); {advice}")


def newest_first(folder: Path) -> list[Path]:
    """The checkpoint `latest` names (even if missing, so that it is reported) and the older ones,
    newest first; every step folder when the pointer cannot be read."""
    steps = sorted(folder.glob("step-*"), reverse=True)
    pointer = folder / LATEST
    if not pointer.exists():
        warn(f"{pointer} is missing; trying every step folder, newest first")
        return steps
    try:
        named = json.loads(pointer.read_text())["checkpoint"]
    except (ValueError, KeyError, TypeError) as e:
        warn(f"{pointer} is unreadable ({e!r}); trying every step folder, newest first")
        return steps
    return [folder / named] + [step for step in steps if step.name < named]


def checkpoint_problem(checkpoint: Path) -> str | None:
    """What makes `checkpoint` unusable, naming the file, or None when it is intact."""
    if not checkpoint.is_dir():
        return f"{checkpoint} does not exist"
    return cached_problem(checkpoint.resolve(), fingerprint(checkpoint))


def fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file's name, size and modification time: what changing any file alters."""
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    stats = [(path.relative_to(folder).as_posix(), path.stat()) for path in files]
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


@functools.cache
def cached_problem(checkpoint: Path, _fingerprint: tuple) -> str | None:
    """Resume looks its checkpoint up several times (CLI, run folder, trainer) and hashing gigabytes
    each time would take minutes, so a verdict holds while the folder's fingerprint is unchanged."""
    if (checkpoint / MANIFEST).is_file():
        return manifest_problem(checkpoint)
    missing = [name for name in LEGACY_NEEDS if not (checkpoint / name).is_file()]
    missing += [] if any((checkpoint / "model").glob("*.safetensors")) else ["model/*.safetensors"]
    if missing:
        return f"{checkpoint / missing[0]} is missing and there is no {MANIFEST} (saved before checksums)"
    warn(f"{checkpoint} has no {MANIFEST} (saved before checksums): resuming from it unverified")
    return None


def manifest_problem(checkpoint: Path) -> str | None:
    try:
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"{checkpoint / MANIFEST} is unreadable ({e!r})"
    for name, entry in files.items():  # sizes first: a truncated file is found without hashing the rest
        path = checkpoint / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{path} has {path.stat().st_size} bytes, {MANIFEST} says {entry['size']}"
    for name, entry in files.items():
        if file_sha256(checkpoint / name) != entry["sha256"]:
            return f"{checkpoint / name} does not match its sha256 in {MANIFEST} (changed after saving)"
    return None


@functools.cache  # once per message: resume looks its checkpoint up several times
def warn(message: str) -> None:
    errors.warn(message)


def load_training_state(
    checkpoint: Path,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    extra_states: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Restore optimizer, scheduler (and `extra_states`, by key) and RNG states; return trainer.json
    (step, data position...)."""
    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=True)
    if optimizer is not None:  # None: loaded later (a sharded optimizer, once sharded: load_optimizer_state)
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if optimizer is not None:
        apply_schedule(scheduler)
    for name, obj in (extra_states or {}).items():
        obj.load_state_dict(state[name])
        if isinstance(obj, torch.optim.lr_scheduler.LambdaLR):  # PPO's value model has a schedule of its own
            apply_schedule(obj)
    set_rng_state(json.loads((checkpoint / "rng.json").read_text()))
    return json.loads((checkpoint / "trainer.json").read_text())


def apply_schedule(scheduler: Any) -> None:
    """Set the restored optimizer's learning rates from the schedule built for this run's length, at the step
    reached. The optimizer's state holds the rates of the schedule it was saved under: unchanged, this writes
    the same values; a resumed run given a larger max_steps continues on its recomputed schedule instead of
    the old one's end (0 for cosine and linear)."""
    for group, base, factor in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["lr"] = base * factor(scheduler.last_epoch)


def load_optimizer_state(checkpoint: Path, optimizer: Any) -> None:
    """The optimizer state of `checkpoint` into `optimizer` (anything with `load_state_dict`)."""
    optimizer.load_state_dict(torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=True)["optimizer"])
