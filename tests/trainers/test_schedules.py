"""rlhfkit.schedules: transformers' learning-rate schedules at every step, and in a checkpoint."""

import pytest
import torch
from transformers import get_scheduler

from rlhfkit.schedules import lr_schedule
from rlhfkit.tracking import read_metrics

from ..support.launches import run_in_this_process
from ..support.tiny import stage_args

TRANSFORMERS_NAME = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=3e-6)


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_NAME))
@pytest.mark.parametrize(("warmup_steps", "total_steps"), [(0, 1), (0, 7), (3, 10), (5, 5), (2, 1)])
def test_each_schedule_gives_transformers_learning_rate_at_every_step(name, warmup_steps, total_steps):
    ours = lr_schedule(optimizer(), name, warmup_steps, total_steps)
    theirs = get_scheduler(TRANSFORMERS_NAME[name], optimizer(), num_warmup_steps=warmup_steps,
                           num_training_steps=total_steps)
    for _ in range(total_steps + 3):
        assert ours.get_last_lr() == theirs.get_last_lr()  # bit for bit
        ours.optimizer.step()
        theirs.optimizer.step()
        ours.step()
        theirs.step()
    assert ours.state_dict() == theirs.state_dict()  # the checkpoint holds the same


# sft and grpo: the supervised loop (rm and dpo share it, in the slow suite) and the on-policy one
@pytest.mark.parametrize("stage", ["sft", "grpo", *(pytest.param(s, marks=pytest.mark.slow) for s in ("rm", "dpo"))])
def test_each_stage_logs_the_rate_each_step_used_not_the_next_ones(stage, ppo_dirs, tmp_path):
    """Three optimizer steps (updates, for GRPO) on a linear schedule: train/lr of step k is the rate the
    optimizer applied at step k, the schedule's value before it moves on (lr, 2/3 lr, 1/3 lr)."""
    lr = 1e-3
    run = run_in_this_process(
        stage, stage_args(stage, ppo_dirs, tmp_path / "run", max_steps=3, lr_scheduler="linear", learning_rate=lr)
    )
    logged = [row["train/lr"] for row in read_metrics(run) if "train/lr" in row]
    schedule = lr_schedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr), "linear", 0, 3)
    used = []
    for _ in range(3):
        used.append(schedule.get_last_lr()[0])
        schedule.optimizer.step()
        schedule.step()
    assert used == pytest.approx([lr, 2 * lr / 3, lr / 3])
    assert logged == pytest.approx(used)
