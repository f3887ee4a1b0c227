"""PPO, GRPO and RLOO on two CPU processes over gloo: the same update as one process on the
same global batch, exact resume, an agreed stop on SIGTERM, and a launch that never hangs on a death.

How the two layouts are made comparable: every row draws from an RNG keyed by its prompt's position
in the update and its sample index, so both layouts sample the very same tokens although their
generation chunks (two prompts each) hold other prompts; the rows of each process are padded to
the widths of the whole batch, so every row is computed on the same columns. What remains is the
order of floating-point sums: the micro-batches of a minibatch hold other rows, and the two processes'
gradients are summed by an all-reduce instead of accumulated in one process. In fp32 that moves
logged means by < 1e-4 (relative) and weights trained at learning rate 1e-3 by < 1e-5: the tolerances.
A clip fraction counts tokens past a threshold, and one token of the ~300 an update clips may cross it.
"""

import json
import os
import re
import signal
import time

import pytest
import torch

from rlhfkit.launch import ProcessStatus, launch_outcome

from ..support.launches import launch, launched, launched_straight_and_resumed, process_of_rank, wait_for_step
from ..support.processes import assert_same_files, assert_same_metrics
from ..support.tiny import stage_args

UPDATES = 3
WEIGHTS = {
    "ppo": ["model/model.safetensors", "value/model.safetensors", "value/scalar_head.safetensors"],
    "grpo": ["model/model.safetensors"],
    "rloo": ["model/model.safetensors"],
    "reinforce": ["model/model.safetensors"],
}
# the new paths across processes: ReMax's greedy baseline sampled per process; DAPO's dynamic sampling
# deciding on the gathered scores (a spread of 1.5 drops some groups of the tiny reward model's scores, which span
# about 2.5)
CASES = {
    "ppo": ("ppo", {}),
    "grpo": ("grpo", {}),
    "rloo": ("rloo", {}),
    "remax": ("reinforce", {"advantage_estimator": "remax"}),
    "dapo": ("grpo", {"dynamic_sampling": "true", "dynamic_sampling_min_spread": 1.5, "clip_range_high": 0.28}),
}
STOPPED = re.compile(
    r"^rlhfkit: stopped by (\w+) after update (\d+); checkpoint written to (.+); resume with: (.+)$", re.M
)
DIED = re.compile(r"^rlhfkit: process (\d) \(pid (\d+)\) died without exiting", re.M)


def comparable_args(stage, dirs, out, **extra):
    """Every episode logged (samples.jsonl then holds each response and its score), a reward that
    varies (a tiny random model rarely emits EOS), fp32, and two prompts per generation chunk: one
    process samples other chunks than each of two does."""
    group = 1 if stage in ("ppo", "reinforce") else 4
    return stage_args(
        stage,
        dirs,
        out,
        max_steps=UPDATES,
        sample_every=1,
        log_samples=4,
        eos_trick="false",
        mixed_precision="no",
        generation_batch_size=2 * group,
        **extra,
    )


def episodes(run_dir):
    """(update, query, response) -> (score, raw score, KL, advantage) of every logged episode."""
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {(r["step"], r["query"], r["response"]): (r["score"], r["raw_score"], r["kl"], r["advantage"]) for r in rows}


def load_weights(run_dir, name):
    from safetensors.torch import load_file

    return load_file(run_dir / name)


# PPO (a value model) and GRPO (groups) in the default run; the other paths in the slow suite, which CI runs too
DEFAULT_CASES = ("grpo", "ppo")


@pytest.mark.parametrize(
    "case", [case if case in DEFAULT_CASES else pytest.param(case, marks=pytest.mark.slow) for case in sorted(CASES)]
)
def test_two_processes_make_the_update_one_process_makes_on_the_same_global_batch(
    case, ppo_dirs, one_process_run, tmp_path
):
    stage, extra = CASES[case]
    one, two = one_process_run(stage, comparable_args(stage, ppo_dirs, None, **extra)), tmp_path / "two"
    done = launch(stage, comparable_args(stage, ppo_dirs, two, **extra), 2)
    assert done.returncode == 0, done.stderr[-3000:]
    # the same sampled tokens, the same rewards (scores, KL) and advantages per episode
    single, double = episodes(one), episodes(two)
    assert single.keys() == double.keys() and len(single) == UPDATES * 8
    for key in single:
        assert double[key] == pytest.approx(single[key], rel=1e-4, abs=1e-5), key
    # the same advantages, returns, losses and statistics of the whole batch, update by update
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] == [1, 2, 3]
    if case == "dapo":  # groups were dropped and refilled, the same ones on both layouts (compared below)
        assert sum(r["sampling/dropped_groups"] for r in rows[0]) > 0
    for left, right in zip(*rows, strict=True):
        numbers = {k for k, v in left.items() if isinstance(v, float) and not k.startswith("perf/")}
        assert {
            "advantages/max",
            "advantages/min",
            "returns/mean",
            "objective/rlhf_reward",
            "loss/policy_avg",
        } <= numbers
        for key in numbers:
            # a clip fraction counts tokens past a threshold: a rounding difference can move one token across it
            tolerance = {"abs": 0.01} if key.endswith("clipfrac_avg") else {"rel": 1e-4, "abs": 1e-5}
            assert right[key] == pytest.approx(left[key], **tolerance), (left["step"], key)
    start = load_weights(ppo_dirs["policy"], "model.safetensors")
    trained = load_weights(one, "model/model.safetensors")
    assert max(float((trained[k] - start[k]).abs().max()) for k in start) > 1e-3  # far beyond the tolerance below
    for name in WEIGHTS[stage]:
        single_weights, double_weights = load_weights(one, name), load_weights(two, name)
        for key in single_weights:
            torch.testing.assert_close(
                double_weights[key], single_weights[key], atol=1e-5, rtol=1e-4, msg=f"{name} {key}"
            )
    # written once: one row per update, one eval, one model
    assert len((two / "metrics.jsonl").read_text().splitlines()) == UPDATES


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short
def test_two_processes_sigkilled_and_resumed_end_bit_identical_to_an_uninterrupted_pair(ppo_dirs, tmp_path):
    stage = "grpo"
    args = stage_args(
        stage, ppo_dirs, tmp_path / "straight", max_steps=4, sample_every=1, eos_trick="false", mixed_precision="no"
    )
    straight, killed = launched_straight_and_resumed(stage, args, tmp_path, kill_after=2)
    assert_same_files(straight, killed, ["model/model.safetensors"])
    assert_same_metrics(straight, killed, 4)
    assert (straight / "samples.jsonl").read_text() == (killed / "samples.jsonl").read_text()


def test_sigterm_to_one_process_stops_both_after_the_same_update_with_one_checkpoint(ppo_dirs, tmp_path):
    stage, out, log = "rloo", tmp_path / "run", tmp_path / "run.log"
    with launched(stage, stage_args(stage, ppo_dirs, out, max_steps=50, mixed_precision="no"), log) as (proc, mark):
        wait_for_step(proc, out, 1, log)
        os.kill(process_of_rank(mark, 1), signal.SIGTERM)  # rank 0 hears nothing: it must learn it from rank 1
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 143, text[-3000:]  # as a single process preempted by SIGTERM, not accelerate's 1
    [(name, update, _, resume)] = STOPPED.findall(text)
    assert (name, resume) == ("SIGTERM", f"rlhfkit {stage} resume={out} --num-processes 2")
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [f"step-{int(update):06d}"]
    assert json.loads((out / "checkpoints" / "latest").read_text())["step"] == int(update) < 50


@pytest.mark.faults  # a process SIGKILLed under the launcher: the fault-injection suite
def test_a_process_killed_ends_the_launch_non_zero_with_a_line_naming_it(ppo_dirs, tmp_path):
    stage, out, log = "grpo", tmp_path / "run", tmp_path / "run.log"
    with launched(stage, stage_args(stage, ppo_dirs, out, max_steps=200, mixed_precision="no"), log) as (proc, mark):
        wait_for_step(proc, out, 1, log)
        victim = process_of_rank(mark, 1)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=60)  # bounded: never a hang
        took = time.time() - killed_at
    assert code != 0 and took < 60
    assert DIED.findall(log.read_text()) == [("1", str(victim))]


def test_launch_outcome_keeps_an_agreed_code_and_names_the_dead():
    def status(*codes):
        return [ProcessStatus(rank, 100 + rank, code) for rank, code in enumerate(codes)]

    assert launch_outcome(0, status(0, 0)) == 0
    assert launch_outcome(1, status(143, 143)) == 143  # accelerate reports 1; the processes agreed on SIGTERM
    assert launch_outcome(1, status(2, 2)) == 2
    assert launch_outcome(1, status(1, None)) == 1
    assert launch_outcome(1, [ProcessStatus(0, None, None), ProcessStatus(1, 101, 3)]) == 3


@pytest.mark.faults  # a real Ctrl-C to a launch: the fault-injection suite
def test_the_launch_hands_a_ctrl_c_to_its_processes(ppo_dirs, tmp_path):
    stage, out, log = "grpo", tmp_path / "run", tmp_path / "run.log"
    with launched(stage, stage_args(stage, ppo_dirs, out, max_steps=50, mixed_precision="no"), log) as (proc, _):
        wait_for_step(proc, out, 1, log)
        proc.send_signal(signal.SIGINT)  # to the command the user started, as Ctrl-C in its terminal
        code = proc.wait(timeout=120)
    [(name, update, _, _)] = STOPPED.findall(log.read_text())
    assert (code, name) == (130, "SIGINT") and (out / "checkpoints" / f"step-{int(update):06d}").is_dir()
