"""Smoke test of benchmarks/compare_trl.py: every trainer on the tiny model, one warm-up and one timed step,
one run per side, all in a single invocation (each run is a child process). Not timed: the numbers are
only checked for shape."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = (
    pytest.mark.slow
)  # about a minute: CI runs it with `pytest -m slow`; the default run stays under 15 minutes

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_trl.py"
TRAINERS = ["sft", "rm", "dpo", "grpo", "rloo", "ppo"]
TINY = {
    "model": "tiny",
    "steps": 1,
    "warmup": 1,
    "repeats": 1,
    "threads": 1,
    "sft-rows": 2,
    "sft-length": 40,
    "pairs": 1,
    "pair-length": 40,
    "response-length": 8,
    "episodes": 4,
    "group": 2,
    "micro-batch": 2,
    "query-length": 24,
    "update-epochs": 2,
}
PER_SIDE = ["s_per_step", "tokens_per_step", "tokens_per_s", "peak_rss_bytes"]
RATIOS = ["tokens_per_s_ratio", "s_per_step_ratio", "peak_rss_ratio"]
PHASES = ["generation_s", "scoring_s", "update_s", "generated_tokens_per_s"]


def test_every_trainer_prints_one_comparison_line_with_both_sides_and_their_ratios():
    options = [f"--{key}={value}" for key, value in TINY.items()]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), f"--trainers={','.join(TRAINERS)}", "--unshared", *options],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["trainer"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert list(rows) == TRAINERS
    for trainer, row in rows.items():
        sides = ["ours"] if trainer == "ppo" else ["ours", "trl"]
        for side in sides:
            assert all(row[f"{side}_{key}"] > 0 for key in PER_SIDE), (trainer, side)
            assert [len(times) for times in row[f"{side}_step_s_runs"]] == [1], trainer  # warm-up dropped
        assert (row["model"], row["steps"], row["threads"], row["precision"]) == ("tiny", 1, 1, "fp32")
        assert row["peak_memory_kind"] == "process_rss" and row["peak_memory_bytes"] > 0
        if trainer != "ppo":
            assert all(row[key] > 0 for key in RATIOS) and row["trl_version"], trainer
            assert row["ours_tokens_per_step"] == row["trl_tokens_per_step"], trainer
        if trainer in ("sft", "rm", "dpo"):
            assert row["matmul_peak_gflops"] > 0 and row["ours_mfu"] > 0 and row["trl_mfu"] > 0, trainer
    for trainer in ("grpo", "rloo"):  # full-length responses on both sides: 2 prompts x 2 samples x (24 + 8)
        assert rows[trainer]["trl_tokens_per_step"] == 4 * (24 + 8)
        # --unshared: ours without shared rows and K = 1 reuse, in the same alternation
        assert rows[trainer]["unshared_s_per_step"] > 0 and rows[trainer]["ours_over_unshared_scoring_s"] > 0
        assert rows[trainer]["unshared_tokens_per_step"] == rows[trainer]["ours_tokens_per_step"]
    assert not any(key.startswith("unshared_") for key in rows["sft"])  # only grouped trainers have that side
    assert rows["sft"]["trl_settings"]["loss_type"] == "chunked_nll"
    assert "trl_s_per_step" not in rows["ppo"] and "no PPO trainer" in rows["ppo"]["trl"]
    assert all(rows["ppo"][f"ours_{phase}"] > 0 for phase in PHASES)


def test_before_after_runs_a_commits_worker_beside_ours_and_trl_at_each_k():
    """`--before-after HEAD`: ours as committed (a temporary worktree importing its own rlhfkit) in the same
    alternation as ours and TRL, one line per K of `--update-epochs 1,2`."""
    options = [f"--{key}={value}" for key, value in TINY.items() if key != "update-epochs"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--trainers=grpo", "--update-epochs=1,2", "--before-after=HEAD", *options],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(row["trainer"], row["update_epochs"]) for row in rows] == [("grpo", 1), ("grpo", 2)]
    for row in rows:
        assert row["before_commit"] == "HEAD" and row["before_s_per_step"] > 0 and row["ours_s_per_step"] > 0
        assert row["after_over_before_s_per_step"] == pytest.approx(
            row["ours_s_per_step"] / row["before_s_per_step"], abs=1e-3
        )
        assert row["before_s_per_step_ratio"] > 0 and row["before_tokens_per_step"] == row["trl_tokens_per_step"]
    worktrees = subprocess.run(
        ["git", "-C", str(SCRIPT.parents[1]), "worktree", "list"], capture_output=True, text=True
    )
    assert "compare-trl-" not in worktrees.stdout  # removed afterwards


def test_epoch_comparison_on_real_tldr_rows_gives_every_side_its_seconds_per_epoch():
    """benchmarks/compare_trl_epoch.py on the tiny model: real SFT posts and comparisons, every side of each
    trainer, the same examples and tokens on both sides."""
    script = SCRIPT.with_name("compare_trl_epoch.py")
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--trainers=sft,rm,dpo",
            "--model=tiny",
            "--sft-examples=8",
            "--pairs=4",
            "--threads=1",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["trainer"]: row for row in map(json.loads, done.stdout.splitlines())}
    sides = {"sft": ["trl", "trl_padding_free", "trl_packing"], "rm": ["trl"], "dpo": ["ours_rows", "trl"]}
    assert list(rows) == list(sides)
    for trainer, row in rows.items():
        assert row["examples"] == (8 if trainer == "sft" else 4) and row["real_tokens"] > 0
        assert row["ours_epoch_s"] > 0 and row["ours_steps"] == 1
        for side in sides[trainer]:
            assert row[f"{side}_epoch_s"] > 0 and row[f"{side}_steps"] >= 1, (trainer, side)
            assert row[f"{side}_over_ours"] == pytest.approx(row[f"{side}_epoch_s"] / row["ours_epoch_s"], abs=1e-3)
    assert rows["dpo"]["ours_reference_s"] > 0  # the reference pass counts in our DPO epoch
    assert rows["dpo"]["trl_real_tokens"] == pytest.approx(rows["dpo"]["real_tokens"], rel=0.02)  # TRL re-tokenizes
