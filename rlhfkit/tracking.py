"""Metrics: `metrics.jsonl` always, TensorBoard events by default, Weights & Biases when asked."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import ConfigError


class Tracker:
    def __init__(self, run_dir: Path, report_to: list[str], config: dict[str, Any], project: str = "rlhfkit", resume_step: int = 0):
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
            raise ValueError(f"report_to: unknown tracker(s) {', '.join(sorted(unknown))}; choose from tensorboard, wandb")

    def drop_after(self, step: int) -> None:
        """On resume, forget metrics logged after the checkpoint so curves have no duplicates."""
        drop_rows_after(self.path, step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()}}
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
    with Path(path).open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return read_jsonl(path) if path.exists() else []
