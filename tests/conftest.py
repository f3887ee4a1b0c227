"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models, and ../shared/data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
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


def kill_after_checkpoint(command: list[str], run_dir: Path, step: int, env: dict[str, str]) -> int:
    """Start `command`, SIGKILL it as soon as its checkpoint `step` (or a later one) is complete, and
    return the step of the newest complete checkpoint it left."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and json.loads(latest.read_text())["step"] >= step:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return json.loads(latest.read_text())["step"]
