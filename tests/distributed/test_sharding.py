"""Sharded training: FSDP2 over 2 CPU processes and gloo trains SFT, RM, DPO, PPO, GRPO and RLOO
like one unsharded process, holds about half the parameters per process, checkpoints full weights and
a full optimizer state, and resumes bit-identically after a SIGKILL; every training stage accepts fsdp2;
choices that cannot run are refused in one line.

The on-policy comparison follows tests/onpolicy/test_distributed.py: one prompt per generation chunk, each
with an RNG keyed by its position in the update, so both layouts sample the same tokens; what differs
is the order of floating-point sums (micro-batches holding other rows, gradients reduce-scattered
instead of accumulated in one process), within 1e-5 for weights trained at learning rate 1e-3."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli import main as cli_main

from ..support.launches import launch, launched_killed_and_resumed, launched_straight_and_resumed
from ..support.mistakes import one_error_line
from ..support.processes import assert_same_files, assert_same_metrics
from ..support.tiny import cli_args, command, stage_args

EXACT = {"mixed_precision": "no"}  # bf16 rounds differently for other batch shapes


def held_share(log: str, sharding: str = "fsdp2") -> tuple[int, int]:
    """(values this process holds, values in all) from the run log's sharding line."""
    line = next(line for line in log.splitlines() if line.startswith(f"sharding: {sharding}"))
    held, total = re.search(r"holds ([\d,]+) of ([\d,]+)", line).groups()
    return int(held.replace(",", "")), int(total.replace(",", ""))


# DeepSpeed ZeRO-2 splits the optimizer state (its log line counts that), ZeRO-3 and FSDP2 the parameters too
SLOW = pytest.mark.slow  # CI runs these too (pytest -m slow); the default run keeps FSDP2 for SFT and PPO


SLOW_PAIRS = [("dpo", "fsdp2"), ("dpo", "zero3")]  # SFT under ZeRO-2 and ZeRO-3: in the SIGKILL test below


def assert_trains_like_one_unsharded_process(stage: str, start: Path, one: Path, two: Path, log: str, sharding: str):
    """The 2-process sharded run `two` holds about half the values per process, trained the weights of the
    one-process run `one` (from `start`) within tolerance, and checkpointed full weights and a full optimizer state."""
    held, total = held_share(log, sharding)
    assert total / 2 <= held < total * 0.55  # each process holds its half (blocks split unevenly by a row at most)
    first, a, b = (load_file(path / "model.safetensors") for path in (start, one / "model", two / "model"))
    assert max(float((a[k] - first[k]).abs().max()) for k in a) > 1e-4  # far beyond the tolerance below
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=2e-6, rtol=1e-4, msg=(stage, key))
    checkpoint = sorted((two / "checkpoints").glob("step-*"))[-1]
    assert load_file(checkpoint / "model" / "model.safetensors").keys() == a.keys()  # full weights, not shards
    optimizer = torch.load(checkpoint / "state.pt", weights_only=True)["optimizer"]
    assert "model.layers.0.self_attn.q_proj.weight" in optimizer["state"]  # full state, keyed by parameter name


@pytest.mark.parametrize(
    "stage, sharding", [("sft", "fsdp2")] + [pytest.param(*pair, marks=SLOW) for pair in SLOW_PAIRS]
)
def test_sharded_on_two_processes_trains_like_one_unsharded_process(
    stage, sharding, ppo_dirs, one_process_run, tmp_path
):
    one, two = one_process_run(stage, stage_args(stage, ppo_dirs, None, max_steps=2, **EXACT)), tmp_path / "two"
    sharded = launch(stage, stage_args(stage, ppo_dirs, two, max_steps=2, sharding=sharding, save_every=1, **EXACT), 2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert_trains_like_one_unsharded_process(stage, ppo_dirs["policy"], one, two, sharded.stdout, sharding)


@pytest.mark.parametrize("sharding", [pytest.param("fsdp2", marks=SLOW), pytest.param("zero3", marks=SLOW)])
def test_sharded_reward_model_on_two_processes_trains_like_one_unsharded_process(
    sharding, ppo_dirs, one_process_run, tmp_path
):
    args = {"max_steps": 2, "eval_pairs": 0, **EXACT}
    one, two = one_process_run("rm", stage_args("rm", ppo_dirs, None, **args)), tmp_path / "two"
    sharded = launch("rm", stage_args("rm", ppo_dirs, two, sharding=sharding, **args), 2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    held, total = held_share(sharded.stdout, sharding)
    assert total / 2 <= held < total * 0.55
    for name in ("model.safetensors", "scalar_head.safetensors"):
        a, b = load_file(one / "model" / name), load_file(two / "model" / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=2e-6, rtol=1e-4, msg=(name, key))
    start = load_file(ppo_dirs["policy"] / "model.safetensors")  # the backbone trained from the policy's weights
    trained = load_file(one / "model" / "model.safetensors")  # a sequence classifier: the policy's keys and `score`
    backbone = [k for k in trained if k in start]
    assert backbone and max(float((trained[k] - start[k]).abs().max()) for k in backbone) > 1e-4


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite
@pytest.mark.parametrize("sharding", ["fsdp2", "zero2", "zero3"])
def test_sharded_sft_trains_like_one_process_and_resumes_bit_identical_after_a_sigkill(
    sharding, ppo_dirs, one_process_run, tmp_path
):
    """The uninterrupted sharded run is held against one unsharded process too (FSDP2's at 2 steps is
    in the default run above), so that DeepSpeed's runs are launched once for both checks."""
    straight = tmp_path / "straight"
    args = stage_args("sft", ppo_dirs, straight, max_steps=4, sharding=sharding, save_every=1, **EXACT)
    done = launch("sft", args, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    one = one_process_run("sft", stage_args("sft", ppo_dirs, None, max_steps=4, **EXACT))
    assert_trains_like_one_unsharded_process("sft", ppo_dirs["policy"], one, straight, done.stdout, sharding)
    killed = launched_killed_and_resumed("sft", args, tmp_path, kill_after=2)
    assert_same_files(straight, killed, ["model/model.safetensors"])
    assert_same_metrics(straight, killed, 4)


ON_POLICY_WEIGHTS = {
    "ppo": ["model/model.safetensors", "value/model.safetensors", "value/scalar_head.safetensors"],
    "grpo": ["model/model.safetensors"],
    "rloo": ["model/model.safetensors"],
}


def on_policy_args(stage, dirs, out, **extra):
    """Two updates in fp32, one prompt per generation chunk, a reward that varies (no EOS trick)."""
    return stage_args(
        stage,
        dirs,
        out,
        max_steps=2,
        eos_trick="false",
        generation_batch_size=1 if stage == "ppo" else 4,
        **EXACT,
        **extra,
    )


@pytest.mark.parametrize("stage", ["ppo", pytest.param("grpo", marks=SLOW), pytest.param("rloo", marks=SLOW)])
def test_fsdp2_on_two_processes_makes_the_on_policy_update_of_one_unsharded_process(
    stage, ppo_dirs, one_process_run, tmp_path
):
    """GRPO and RLOO: the sharded run reads each group's query once (shared rows), the one process not."""
    unshared = {} if stage == "ppo" else {"shared_prefix": "off"}
    one, two = one_process_run(stage, on_policy_args(stage, ppo_dirs, None, **unshared)), tmp_path / "two"
    sharded = launch(stage, on_policy_args(stage, ppo_dirs, two, sharding="fsdp2", save_every=1), 2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "unshared rows" not in sharded.stderr
    held, total = held_share(sharded.stdout)
    assert total / 2 <= held < total * 0.55
    for name in ON_POLICY_WEIGHTS[stage]:
        a, b = load_file(one / name), load_file(two / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-4, msg=(name, key))
    start, trained = load_file(ppo_dirs["policy"] / "model.safetensors"), load_file(one / "model" / "model.safetensors")
    assert (
        max(float((trained[k] - start[k]).abs().max()) for k in trained) > 1e-4
    )  # the runs moved, beyond the tolerance
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    assert {row["perf/shared_prefix"] for row in rows[1]} == {float(stage != "ppo")}
    for left, right in zip(*rows, strict=True):
        # the gradient norm tells a sum of the processes' gradients from a mean, which AdamW's steps barely show
        for key in (
            "objective/scores",
            "objective/kl",
            "loss/policy_avg",
            "val/ratio",
            "response/length_mean",
            "policy/grad_norm",
        ):
            assert right[key] == pytest.approx(left[key], rel=1e-4, abs=1e-5), key
    checkpoint = two / "checkpoints" / "step-000001"
    assert load_file(checkpoint / "model" / "model.safetensors").keys() == trained.keys()  # full weights, not shards
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    assert (
        "model.layers.0.self_attn.q_proj.weight" in state["optimizer"]["state"]
    )  # full state, keyed by parameter name
    if stage == "ppo":
        assert "backbone.layers.0.self_attn.q_proj.weight" in state["value_optimizer"]["state"]


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite
def test_fsdp2_ppo_sigkilled_and_resumed_ends_bit_identical_to_an_uninterrupted_one(ppo_dirs, tmp_path):
    args = on_policy_args("ppo", ppo_dirs, tmp_path / "straight", sharding="fsdp2") | {"max_steps": 3}
    straight, killed = launched_straight_and_resumed("ppo", args, tmp_path, kill_after=2)
    assert_same_files(straight, killed, ON_POLICY_WEIGHTS["ppo"])
    assert_same_metrics(straight, killed, 3)


@pytest.mark.parametrize(
    "stage, extra, message",
    [
        ("ppo", {"sharding": "zero3"}, "sharding=zero3 is for sft, rm, dpo; for ppo use sharding=fsdp2"),
        (
            "ppo",
            {"sharding": "fsdp2", "frozen_device": "cpu"},
            "sharding=fsdp2 with frozen_device=cpu: a sharded reference",
        ),
        ("dpo", {"sharding": "fsdp2", "lora_rank": 8}, "sharding=fsdp2 with lora_rank=8: choose one"),
    ],
)
def test_sharding_that_cannot_run_is_refused_at_start_in_one_line(stage, extra, message, ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main([stage, *cli_args(stage_args(stage, ppo_dirs, out, **extra))]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_zero_without_deepspeed_installed_names_the_extra_to_install(monkeypatch):
    from rlhfkit import sharding
    from rlhfkit.errors import ConfigError
    from rlhfkit.stages import resolve

    monkeypatch.setattr(sharding, "deepspeed_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"sharding=zero2 needs DeepSpeed: pip install 'rlhfkit\[deepspeed\]'"):
        sharding.check_sharding(resolve("sft", None, None, {"sharding": "zero2"}).sharding_options)



def test_sharding_on_one_process_is_refused_rather_than_recorded(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, sharding="fsdp2"), capsys)
    assert "sharding=fsdp2 splits the models across processes and this run has one: add --num-processes N" in line, line
    assert not out.exists()


def sharded_stages() -> list[str]:
    """The training commands of the stage registry: those whose runs take a `sharding` option."""
    from rlhfkit.config import RunConfig
    from rlhfkit.stages import STAGES

    return [name for name, stage in STAGES.items() if stage.config and issubclass(stage.config, RunConfig)]


def test_every_stage_with_a_sharding_option_accepts_fsdp2_and_on_policy_ones_refuse_zero_naming_fsdp2(monkeypatch):
    from rlhfkit.onpolicy.algorithms import ALGORITHMS
    from rlhfkit.sharding import check_sharding
    from rlhfkit.stages import resolve

    monkeypatch.setenv("WORLD_SIZE", "2")  # as under --num-processes 2
    assert "reinforce" in sharded_stages()
    for stage in sharded_stages():
        check_sharding(resolve(stage, None, None, {"sharding": "fsdp2"}).sharding_options)
    for stage in ALGORITHMS:
        with pytest.raises(Exception, match=f"for {stage} use sharding=fsdp2"):
            check_sharding(resolve(stage, None, None, {"sharding": "zero2"}).sharding_options)


@pytest.mark.slow
def test_reinforce_under_fsdp2_on_two_processes_makes_the_update_of_one_unsharded_process(ppo_dirs, tmp_path):
    # one prompt per generation chunk, as the PPO test: a chunk's random stream is then the same on one process or two
    args = {"max_steps": 2, "eos_trick": "false", "generation_batch_size": 1, "mixed_precision": "no"}
    one, two = tmp_path / "one", tmp_path / "two"
    for out, processes, extra in ((one, 1, {}), (two, 2, {"sharding": "fsdp2"})):
        done = launch("reinforce", stage_args("reinforce", ppo_dirs, out, **args, **extra), processes)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "sharding: fsdp2 over 2 processes" in done.stdout
    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-4, msg=key)
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    for left, right in zip(*rows, strict=True):
        for key in ("objective/scores", "objective/kl", "loss/policy_avg", "policy/grad_norm"):
            assert right.get(key) == pytest.approx(left.get(key), rel=1e-4, abs=1e-5), key
