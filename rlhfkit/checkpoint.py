"""Atomic checkpoints and exact resume.

A checkpoint is a folder `checkpoints/step-NNNNNN/` holding the model and tokenizer as
`save_pretrained` folders (safetensors; PPO adds its value model as `value/`), `state.pt` (optimizer
and scheduler, plus any further ones such as PPO's value optimizer, read back with
`weights_only=True`), `rng.json` (python, numpy and torch RNG states) and `trainer.json` (step and
data position). It is written under a temporary name and renamed into place, so a crash mid-save
never leaves a broken latest checkpoint; `latest` names the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"


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
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


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
    objects with `state_dict()` (optimizers, schedulers) stored in state.pt under their key.
    """
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".tmp-step-{step:06d}-"))
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    for name, extra in (extra_models or {}).items():  # each a complete folder, loadable on its own
        extra.save_pretrained(tmp / name, safe_serialization=True)
        tokenizer.save_pretrained(tmp / name)
    states = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    states |= {name: obj.state_dict() for name, obj in (extra_states or {}).items()}
    torch.save(states, tmp / "state.pt")
    (tmp / "rng.json").write_text(json.dumps(rng_state()))
    (tmp / "trainer.json").write_text(json.dumps({"step": step, **trainer_state}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json_atomic(folder / LATEST, {"checkpoint": final.name, "step": step})
    prune(folder, keep)
    return final


def prune(folder: Path, keep: int) -> None:
    for stale in folder.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if keep <= 0:
        return
    for old in sorted(folder.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint folder for a run directory, a checkpoints folder or a checkpoint itself."""
    path = Path(path)
    if (path / "trainer.json").is_file():
        return path
    for folder in (path / "checkpoints", path):
        pointer = folder / LATEST
        if pointer.is_file():
            candidate = folder / json.loads(pointer.read_text())["checkpoint"]
            if (candidate / "trainer.json").is_file():
                return candidate
    return None


def load_training_state(
    checkpoint: Path, optimizer: torch.optim.Optimizer, scheduler: Any, extra_states: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Restore optimizer, scheduler (and `extra_states`, by key) and RNG states; return trainer.json
    (step, data position...)."""
    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    for name, obj in (extra_states or {}).items():
        obj.load_state_dict(state[name])
    set_rng_state(json.loads((checkpoint / "rng.json").read_text()))
    return json.loads((checkpoint / "trainer.json").read_text())
