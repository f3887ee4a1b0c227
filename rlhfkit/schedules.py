"""Learning-rate schedules (Tables 3, 4, 7: cosine or linear decay after an optional linear warm-up),
as `torch.optim.lr_scheduler.LambdaLR` multipliers.

They are transformers' (`get_scheduler` with "cosine", "linear", "constant_with_warmup"), written out
because importing `transformers.optimization` loads the Trainer's utilities and peft: about 3 s of
every process's start-up, paid again by each process of a launch. tests/trainers/test_schedules.py checks
them against transformers' at every step, checkpoints included."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup(step: int, warmup_steps: int) -> float:
    return float(step) / float(max(1, warmup_steps))


def linear(step: int, *, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return warmup(step, warmup_steps)
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def cosine(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """Half a cosine from 1 to 0 over the steps after warm-up."""
    if step < warmup_steps:
        return warmup(step, warmup_steps)
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def constant(step: int, *, warmup_steps: int, total_steps: int) -> float:
    del total_steps  # constant after the warm-up
    return warmup(step, warmup_steps) if step < warmup_steps else 1.0


SCHEDULES = {"cosine": cosine, "linear": linear, "constant": constant}


def lr_schedule(optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int) -> LambdaLR:
    """The `lr_scheduler=name` schedule of `optimizer` over `total_steps` optimizer steps."""
    return LambdaLR(optimizer, partial(SCHEDULES[name], warmup_steps=warmup_steps, total_steps=total_steps))
