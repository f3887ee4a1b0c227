"""Metrics: `metrics.jsonl` always, TensorBoard events by default, Weights & Biases when asked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .faults import continue_run, room_for, write_text_atomic


class Tracker:
    def __init__(
        self,
        run_dir: Path,
        report_to: list[str],
        config: dict[str, Any],
        project: str = "rlhfkit",
        resume_step: int = 0,
    ):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.drop_after(resume_step)
        self.tb = None
        self.wandb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard hides the events of earlier files from purge_step on: those after the checkpoint
            # resumed, or at a fresh start all an earlier start of the same run left in tb/
            self.tb = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=resume_step + 1 if resume_step else 0)
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                raise ConfigError("report_to=wandb needs the wandb extra: pip install 'rlhfkit[wandb]'") from None
            self.wandb = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config, resume="allow")
        unknown = set(report_to) - {"tensorboard", "wandb"}
        if unknown:
            raise ValueError(
                f"report_to: unknown tracker(s) {', '.join(sorted(unknown))}; choose from tensorboard, wandb"
            )

    def drop_after(self, step: int) -> None:
        """On resume, forget metrics logged after the checkpoint so curves have no duplicates."""
        size = self.path.stat().st_size if self.path.exists() else 0
        with room_for(self.run_dir, f"{self.path.name} again up to step {step}", size, continue_run(self.run_dir)):
            drop_rows_after(self.path, step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {
            "step": step,
            **{k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()},
        }
        with room_for(
            self.run_dir, f"the metrics of step {step}", len(json.dumps(row)) + 1, continue_run(self.run_dir)
        ):
            append_jsonl(self.path, [row])
            if self.tb is not None:
                for key, value in metrics.items():
                    if isinstance(value, int | float):
                        self.tb.add_scalar(key, value, step)
                self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def drop_rows_after(path: Path, step: int) -> None:
    """Keep only the rows of a JSON-lines log whose `step` is at most `step` (all of them go at 0)."""
    if path.exists():
        write_jsonl(path, [r for r in read_jsonl(path) if r.get("step", 0) <= step] if step else [])


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append `rows`, or none of them: a write the disk cannot take whole is cut back, because half a row
    would make the whole file unreadable."""
    data = memoryview("".join(json.dumps(r) + "\n" for r in rows).encode())
    with Path(path).open("ab", buffering=0) as f:  # unbuffered: each write reaches the file or fails here
        end = f.tell()
        try:
            while data:
                data = data[f.write(data) :]  # a write may take only part of it
        except OSError:
            f.truncate(end)
            raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the file by `rows`; a write cut short (a full disk) loses nothing of what it held."""
    write_text_atomic(Path(path), "".join(json.dumps(r) + "\n" for r in rows))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []
