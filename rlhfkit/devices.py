"""Where a model runs and in which precision: shared by every stage, evaluation and the judges."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def default_device() -> torch.device:
    """The device a model runs on outside a launched training run: the GPU when there is one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device: torch.device, precision: str):
    """bf16 autocast on `device` when `precision` is "bf16" (Detail 8), a no-op otherwise."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def is_deepspeed_engine(model: Any) -> bool:
    """Whether `model` is wrapped in DeepSpeed's engine, told without importing DeepSpeed."""
    return type(model).__name__ == "DeepSpeedEngine"


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module):
    """The model in eval mode for the block (dropout off, the KV cache allowed with activation
    checkpointing), then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
