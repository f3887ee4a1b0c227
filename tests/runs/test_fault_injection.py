"""Fault injection: every trainer SIGKILLed at seeded random steps, and inside a checkpoint write
(`rlhfkit.faults`), then resumed, must end bit-identical to a run that was never interrupted.

Each trainer's run is killed four times, each kill in the run the previous one left: at a random moment
after a random step, inside the next checkpoint's write, between that checkpoint's publication and the
`latest` pointer, and after the last step, during the final save and evaluation. Resumed after each kill,
it must end bit-identical to a run never interrupted. The runs are children forked from a warm process
(support.processes.ForkedRun): real processes that a SIGKILL kills, without the seconds of importing torch each time.

Marked `faults` (about 2 minutes on a 2-core CPU): `pytest -m faults`; CI runs it after the default suite.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from ..support.processes import assert_same_files, assert_same_metrics, child_env, run_forked, start_forked
from ..support.tiny import PRESETS, cli_args, stage_args

pytestmark = pytest.mark.faults

STEPS = 5
ON_POLICY = ("ppo", "grpo", "rloo", "reinforce")
TRAINERS = ("sft", "rm", "dpo", *ON_POLICY)
WEIGHTS = {"ppo": ["model/model.safetensors", "value/model.safetensors", "value/scalar_head.safetensors"],
           "rm": ["model/model.safetensors", "model/scalar_head.safetensors"]}


def first_kill_step(trainer: str) -> int:
    """The step after which the first kill comes, drawn per trainer from a seeded generator so that a
    failure can be replayed. At least 2: a run killed before its first checkpoint has nothing to resume
    and is started again (tests/runs/test_checkpoint_integrity.py covers that case); at most STEPS - 2, so
    that the two checkpoint faults after it still find a step to fault before the last one."""
    return random.Random(f"{trainer}-12").randint(2, STEPS - 2)


def trainer_args(trainer: str, inputs: dict, out: Path) -> dict:
    """The tiny options of every test, a checkpoint after every step, every sample logged; a reward
    that varies for the group methods (the tiny model rarely emits EOS); state that must come back on
    resume: DPO's held-out evaluations every 2 steps (on 4 pairs a step: its steps cost the most), PPO's
    adaptive KL controller."""
    extra = {"sample_every": 1} if trainer in ON_POLICY else {}
    extra |= {"eos_trick": "false"} if trainer in ("grpo", "rloo", "reinforce") else {}
    if trainer == "dpo":
        extra |= {"eval_samples": 0, "eval_every": 2, "total_batch_size": 4, "micro_batch_size": 2}
    extra |= {"adaptive_kl": "true", "kl_horizon": 10} if trainer == "ppo" else {}
    return stage_args(trainer, inputs, out, max_steps=STEPS, save_every=1, keep_checkpoints=0, **extra)


def command(trainer: str, args: dict) -> list[str]:
    return [trainer, "--preset", PRESETS[trainer], *cli_args(args)]


def kill_after_step(args: list[str], run_dir: Path, step: int, env: dict[str, str] | None = None) -> int:
    """SIGKILL `rlhfkit ARGS` at whatever it is doing once it has logged `step`; its return code. The
    run's metrics.jsonl must hold no row of `step` yet (a resumed run truncates its rows to its checkpoint)."""
    metrics = run_dir / "metrics.jsonl"

    def logged() -> int:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return max((json.loads(line).get("step", 0) for line in lines if line), default=-1)

    assert logged() < step, f"{metrics} already holds step {step}: the kill would come before the run starts"
    proc, deadline = start_forked(args, run_dir.with_name(f"{run_dir.name}-after-{step}"), env), time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if logged() >= step:
            proc.kill()
            break
        time.sleep(0.01)
    return proc.wait()


def newest_checkpoint(run_dir: Path) -> int:
    return json.loads((run_dir / "checkpoints" / "latest").read_text())["step"]


def killed_inside_a_checkpoint(trainer: str, run_dir: Path, fault: str) -> int:
    """Resume `run_dir` with RLHFKIT_FAULT=<fault>:<the next checkpoint's step>: the run SIGKILLs itself
    inside that checkpoint's write (`save`) or between its publication and `latest` (`publish`)."""
    step = newest_checkpoint(run_dir) + 1
    assert step < STEPS, f"{trainer}: no step left before the last one to fault at ({fault})"
    env = child_env() | {"RLHFKIT_FAULT": f"{fault}:{step}"}
    return run_forked([trainer, f"resume={run_dir}"], run_dir.with_name(f"{run_dir.name}-{fault}"), env).returncode


def resumed(trainer: str, run_dir: Path) -> None:
    done = run_forked([trainer, f"resume={run_dir}"], run_dir.with_name(f"{run_dir.name}-resumed"))
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture
def inputs(ppo_dirs, pad_is_eos_policy, trainer):
    """The tiny inputs; the on-policy trainers start from a model without a distinct PAD (the embedded SmolLM2
    as shipped, any hub model used directly), to which each load adds [PAD]: its row must be the same in the
    policy, the reference and on every reload, so that the KL of update 1 is exactly 0 and every resume is
    bit-identical."""
    return ppo_dirs | {"policy": pad_is_eos_policy} if trainer in ON_POLICY else ppo_dirs


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_run_killed_at_every_fault_point_resumes_bit_identical(trainer, inputs, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_forked(command(trainer, trainer_args(trainer, inputs, straight)), tmp_path / "straight-log", check=True)
    first = first_kill_step(trainer)
    assert kill_after_step(command(trainer, trainer_args(trainer, inputs, killed)), killed, first) == -9
    for fault in ("save", "publish"):
        assert killed_inside_a_checkpoint(trainer, killed, fault) == -9, f"the {fault} fault did not kill the run"
    # during the final save, evaluation and report: the step's row is logged, its checkpoint may not be
    assert kill_after_step([trainer, f"resume={killed}"], killed, STEPS) == -9
    resumed(trainer, killed)

    assert_same_files(straight, killed, WEIGHTS.get(trainer, ["model/model.safetensors"]))
    rows = assert_same_metrics(straight, killed, STEPS)
    if trainer in ON_POLICY:  # the samples of every update, the resumed ones drawn from the restored RNG
        assert (killed / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()
        assert next(r["objective/kl"] for r in rows if "objective/kl" in r) == 0.0
    if trainer == "ppo":  # the adaptive controller moved, and the resumed run continued from its state
        assert rows[-1]["objective/kl_coef"] != rows[0]["objective/kl_coef"]
    if trainer == "dpo":  # held-out evaluations before training and every 2 steps, on either side of the kills
        assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4, 5]
