"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models, and ../shared/data."""

from __future__ import annotations

import gzip
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


@pytest.fixture(scope="session")
def ppo_dirs(tmp_path_factory, tiny_model_dir):
    """A tiny policy, a reward model made from it (scalar head at seed 1) and 40 real TL;DR posts."""
    from rlhfkit.models import ScalarModel, load_policy

    root = tmp_path_factory.mktemp("ppo")
    policy, tok = load_policy(str(tiny_model_dir))
    torch.manual_seed(1)
    reward = ScalarModel.from_policy(policy)
    reward.save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    with gzip.open(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"), "rt") as f:
        (root / "posts.jsonl").write_text("".join(line for _, line in zip(range(40), f, strict=False)))
    return {"policy": tiny_model_dir, "rm": root / "rm", "posts": root / "posts.jsonl"}


def straight_and_resumed(stage: str, preset: str, args: dict, tmp_path: Path, kill_at: int) -> tuple[Path, Path]:
    """Run `rlhfkit <stage>` once straight through, and once SIGKILLed after checkpoint `kill_at`
    then resumed; return both run directories for comparison."""
    import sys

    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}

    def command(out: Path, **extra) -> list[str]:
        values = args | extra | {"output_dir": str(out)}
        return [sys.executable, "-m", "rlhfkit", stage, "--preset", preset, *[f"{k}={v}" for k, v in values.items()]]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(command(straight), check=True, env=env, capture_output=True)
    kill_after_checkpoint(command(killed, save_every=1), killed, kill_at, env)
    subprocess.run([sys.executable, "-m", "rlhfkit", stage, f"resume={killed}"], check=True, env=env, capture_output=True)
    return straight, killed


def assert_same_files(a: Path, b: Path, files: list[str]) -> None:
    from safetensors.torch import load_file

    for name in files:
        left, right = load_file(a / name), load_file(b / name)
        assert left.keys() == right.keys(), name
        for key in left:
            assert torch.equal(left[key], right[key]), (name, key)


def assert_same_metrics(a: Path, b: Path, steps: int) -> list[dict]:
    """Every logged number but the timings is identical; returns the straight run's rows."""
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (a, b)]
    assert sorted({r["step"] for r in rows[1]}) == sorted({r["step"] for r in rows[0]})
    assert max(r["step"] for r in rows[1]) == steps
    for left, right in zip(*rows, strict=True):
        drop = ("perf/",)
        assert {k: v for k, v in left.items() if not k.startswith(drop)} == {k: v for k, v in right.items() if not k.startswith(drop)}
    return rows[0]


def write_sft_csv(path: Path, rows: list[dict]) -> Path:
    """TL;DR SFT rows as a CSV file with the upstream columns (other keys are dropped)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["subreddit", "title", "post", "summary"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path
