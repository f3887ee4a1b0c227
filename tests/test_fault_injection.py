"""Fault injection: every trainer SIGKILLed at seeded random steps, and inside a checkpoint write
(`rlhfkit.faults`), then resumed, must end bit-identical to a run that was never interrupted.

Marked `faults` (about 8 minutes on a 2-core CPU): `pytest -m faults`; CI runs it after the default suite.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import assert_same_files, assert_same_metrics, data_file

pytestmark = pytest.mark.faults

STEPS = 4
TRAINERS = ("sft", "rm", "dpo", "ppo", "grpo", "rloo")
PRESETS = {"sft": "tldr-sft", "rm": "tldr-rm", "dpo": "tldr-dpo", "ppo": "tldr-ppo", "grpo": "tldr-grpo", "rloo": "tldr-rloo"}
WEIGHTS = {"ppo": ["model/model.safetensors", "value/model.safetensors", "value/scalar_head.safetensors"],
           "rm": ["model/model.safetensors", "model/scalar_head.safetensors"]}


def fault_cases() -> list[tuple[str, str, int]]:
    """(trainer, fault, step): two kills at random moments after a random step, one inside a
    checkpoint write, one between a checkpoint's publication and the `latest` pointer; seeded so a
    failure can be replayed. Steps start at 2: a run killed before its first checkpoint has nothing
    to resume and is started again (tests/test_checkpoint_integrity.py covers that case)."""
    rng = random.Random(12)
    cases = []
    for trainer in TRAINERS:
        cases += [(trainer, "after-step", rng.randint(2, STEPS - 1)) for _ in range(2)]
        cases += [(trainer, "save", rng.randint(2, STEPS - 1)), (trainer, "publish", rng.randint(2, STEPS - 1))]
    return cases


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir):
    from rlhfkit.models import ScalarModel, load_policy

    root = tmp_path_factory.mktemp("faults")
    for name, parts, rows in [("posts", ("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"), 40),
                              ("pairs", ("summarize-from-feedback-comparisons", "batch13.jsonl.gz"), 80)]:
        with gzip.open(data_file(*parts), "rt") as f:
            (root / f"{name}.jsonl").write_text("".join(line for _, line in zip(range(rows), f, strict=False)))
    policy, tok = load_policy(str(tiny_model_dir))
    ScalarModel.from_policy(policy).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    return {"policy": tiny_model_dir, "rm": root / "rm", "posts": root / "posts.jsonl", "pairs": root / "pairs.jsonl"}


def trainer_args(trainer: str, inputs: dict, out: Path) -> dict:
    common = {"model": inputs["policy"], "output_dir": out, "max_steps": STEPS, "save_every": 1, "keep_checkpoints": 0,
              "max_query_length": 128, "learning_rate": 1e-3, "report_to": ""}
    if trainer == "sft":
        return common | {"data": inputs["posts"], "validation_posts": 8, "eval_samples": 0, "total_batch_size": 4, "micro_batch_size": 2}
    if trainer in ("rm", "dpo"):
        pairs = common | {"data": inputs["pairs"], "validation_fraction": 0.2, "total_batch_size": 8, "micro_batch_size": 4,
                          "eval_pairs": 0}
        return pairs | ({"forward_batch_size": 4, "eval_samples": 0} if trainer == "dpo" else {"sft_data": ""})
    onpolicy = common | {"reward_model": inputs["rm"], "data": inputs["posts"], "validation_posts": 8, "eval_samples": 0,
                         "total_batch_size": 8, "micro_batch_size": 4, "generation_batch_size": 8, "forward_batch_size": 4,
                         "max_response_length": 10, "sample_every": 1}
    return onpolicy | ({"samples_per_prompt": 4, "eos_trick": "false"} if trainer != "ppo" else {})


def command(trainer: str, args: dict) -> list[str]:
    return [sys.executable, "-m", "rlhfkit", trainer, "--preset", PRESETS[trainer], *[f"{k}={v}" for k, v in args.items()]]


ENV = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory, inputs):
    """One uninterrupted run per trainer, made on first use."""
    runs: dict[str, Path] = {}

    def get(trainer: str) -> Path:
        if trainer not in runs:
            out = tmp_path_factory.mktemp(f"straight-{trainer}")
            subprocess.run(command(trainer, trainer_args(trainer, inputs, out)), check=True, env=ENV, capture_output=True)
            runs[trainer] = out
        return runs[trainer]

    return get


def kill_after_step(cmd: list[str], run_dir: Path, step: int) -> int:
    """SIGKILL the run at whatever it is doing once it has logged `step`; its return code."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if metrics.exists() and any(json.loads(line).get("step", 0) >= step for line in metrics.read_text().splitlines() if line):
            proc.kill()
            break
        time.sleep(0.01)
    return proc.wait()


@pytest.mark.parametrize(("trainer", "fault", "step"), fault_cases(), ids=lambda v: str(v))
def test_killed_run_resumes_bit_identical(trainer, fault, step, inputs, straight_runs, tmp_path):
    straight = straight_runs(trainer)
    killed = tmp_path / "killed"
    cmd = command(trainer, trainer_args(trainer, inputs, killed))
    if fault == "after-step":
        code = kill_after_step(cmd, killed, step)
    else:
        code = subprocess.run(cmd, env=ENV | {"RLHFKIT_FAULT": f"{fault}:{step}"}, capture_output=True).returncode
    assert code == -9, "the run was meant to die by SIGKILL"
    resumed = subprocess.run([sys.executable, "-m", "rlhfkit", trainer, f"resume={killed}"], env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_files(straight, killed, WEIGHTS.get(trainer, ["model/model.safetensors"]))
    assert_same_metrics(straight, killed, STEPS)
