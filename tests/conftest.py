"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models, and ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RLHFKIT_SHARED_DATA", REPO.parent / "shared" / "data"))


def data_file(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found: the tests expect ../shared/data beside the repository")
    return path


@pytest.fixture(scope="session")
def tokenizer():
    from rlhfkit.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved 2-layer d=64 random Llama with the real SmolLM2 tokenizer (and [PAD])."""
    from rlhfkit.models import save_tiny_policy

    return save_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture
def tiny_model(tiny_model_dir):
    from rlhfkit.models import load_policy

    return load_policy(str(tiny_model_dir))


def sft_losses_on_fixed_batch(model, batch, lr: float, steps: int) -> list[float]:
    """Per-token SFT loss after each of `steps` AdamW steps on the same batch."""
    from rlhfkit.trainers.sft import sft_loss

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-5)
    losses = []
    for _ in range(steps):
        loss_sum, _ = sft_loss(model, batch)
        loss = loss_sum / batch["loss_units"].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
