"""`rlhfkit data make-task`: verifiable arithmetic problems from a seed (rlhfkit/data/tasks.py), written as
GSM8K records in train.jsonl and test.jsonl, with task.json saying how they were made."""

from __future__ import annotations

from pathlib import Path

from ..config import MakeTaskConfig
from ..errors import ConfigError
from .tasks import FILES, write_task


def output_folder(cfg: MakeTaskConfig) -> Path:
    return Path(cfg.out or f"data/{cfg.task}-{cfg.digits}d-seed{cfg.seed}")


def run(cfg: MakeTaskConfig) -> int:
    out = output_folder(cfg)
    held = [name for name in FILES if (out / name).exists()]
    if held and not cfg.overwrite:
        raise ConfigError(
            f"out={out} already holds {', '.join(held)}; choose another out, or set overwrite=true to replace them"
        )
    about = write_task(
        out, cfg.task, cfg.digits, cfg.seed, cfg.train_problems, cfg.test_problems, cfg.held_out_percent
    )
    print(
        f"task {about['task']} ({about['about']}), digits={about['digits']}, seed={about['seed']}: "
        f"{about['train']} training and {about['test']} held-out problems, disjoint by construction"
    )
    print(f"wrote {out}/train.jsonl, test.jsonl and task.json (format: gsm8k)")
    return 0
