"""Fault injection: every trainer SIGKILLed at seeded random steps, and inside a checkpoint write
(`rlhfkit.faults`), then resumed, must end bit-identical to a run that was never interrupted.

Marked `faults` (about 8 minutes on a 2-core CPU): `pytest -m faults`; CI runs it after the default suite.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest

from .helpers import (
    PRESETS,
    assert_same_files,
    assert_same_metrics,
    child_env,
    cli_args,
    rlhfkit_command,
    stage_args,
)

pytestmark = pytest.mark.faults

STEPS = 4
TRAINERS = ("sft", "rm", "dpo", "ppo", "grpo", "rloo")
ON_POLICY = ("ppo", "grpo", "rloo", "reinforce")
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


def trainer_args(trainer: str, inputs: dict, out: Path) -> dict:
    """The tiny options of every test, a checkpoint after every step, every sample logged; a reward
    that varies for the group methods (the tiny model rarely emits EOS); state that must come back on
    resume: DPO's held-out evaluations every 2 steps, PPO's adaptive KL controller."""
    extra = {"sample_every": 1} if trainer in ON_POLICY else {}
    extra |= {"eos_trick": "false"} if trainer in ("grpo", "rloo", "reinforce") else {}
    extra |= {"eval_samples": 0, "eval_every": 2} if trainer == "dpo" else {}
    extra |= {"adaptive_kl": "true", "kl_horizon": 10} if trainer == "ppo" else {}
    return stage_args(trainer, inputs, out, max_steps=STEPS, save_every=1, keep_checkpoints=0, **extra)


def command(trainer: str, args: dict) -> list[str]:
    return rlhfkit_command(trainer, "--preset", PRESETS[trainer], *cli_args(args))


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory, ppo_dirs):
    """One uninterrupted run per trainer, made on first use."""
    runs: dict[str, Path] = {}

    def get(trainer: str) -> Path:
        if trainer not in runs:
            out = tmp_path_factory.mktemp(f"straight-{trainer}")
            subprocess.run(
                command(trainer, trainer_args(trainer, ppo_dirs, out)), check=True, env=child_env(), capture_output=True
            )
            runs[trainer] = out
        return runs[trainer]

    return get


def kill_after_step(cmd: list[str], run_dir: Path, step: int) -> int:
    """SIGKILL the run at whatever it is doing once it has logged `step`; its return code."""
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if metrics.exists() and any(
            json.loads(line).get("step", 0) >= step for line in metrics.read_text().splitlines() if line
        ):
            proc.kill()
            break
        time.sleep(0.01)
    return proc.wait()


@pytest.mark.parametrize(("trainer", "fault", "step"), fault_cases(), ids=lambda v: str(v))
def test_killed_run_resumes_bit_identical(trainer, fault, step, ppo_dirs, straight_runs, tmp_path):
    straight = straight_runs(trainer)
    killed = tmp_path / "killed"
    cmd = command(trainer, trainer_args(trainer, ppo_dirs, killed))
    if fault == "after-step":
        code = kill_after_step(cmd, killed, step)
    else:
        code = subprocess.run(
            cmd, env=child_env() | {"RLHFKIT_FAULT": f"{fault}:{step}"}, capture_output=True
        ).returncode
    assert code == -9, "the run was meant to die by SIGKILL"
    resumed = subprocess.run(
        rlhfkit_command(trainer, f"resume={killed}"), env=child_env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_files(straight, killed, WEIGHTS.get(trainer, ["model/model.safetensors"]))
    rows = assert_same_metrics(straight, killed, STEPS)
    if trainer in ON_POLICY:  # the samples of every update, the resumed ones drawn from the restored RNG
        assert (killed / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()
    if trainer == "ppo":  # the adaptive controller moved, and the resumed run continued from its state
        assert rows[-1]["objective/kl_coef"] != rows[0]["objective/kl_coef"]
    if trainer == "dpo":  # held-out evaluations before training and at steps 2 and 4, on either side of the kill
        assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4]


@pytest.mark.parametrize("stage", ["ppo", "grpo", "rloo", "reinforce"])
def test_a_model_whose_pad_is_its_eos_resumes_bit_identical(stage, ppo_dirs, pad_is_eos_policy, tmp_path):
    """From a model without a distinct PAD (the embedded SmolLM2 as shipped, any hub model used directly)
    each load adds [PAD]: its row must be the same in the policy, the reference and on every reload, so
    the KL of update 1 is exactly 0 and a SIGKILLed run resumes bit-identical (review case 1)."""
    inputs = ppo_dirs | {"policy": pad_is_eos_policy}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(
        command(stage, trainer_args(stage, inputs, straight)), check=True, env=child_env(), capture_output=True
    )
    assert kill_after_step(command(stage, trainer_args(stage, inputs, killed)), killed, 2) == -9
    resumed = subprocess.run(
        rlhfkit_command(stage, f"resume={killed}"), env=child_env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_files(straight, killed, WEIGHTS.get(stage, ["model/model.safetensors"]))
    rows = assert_same_metrics(straight, killed, STEPS)
    assert next(r["objective/kl"] for r in rows if "objective/kl" in r) == 0.0
