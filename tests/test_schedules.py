"""rlhfkit.schedules: transformers' learning-rate schedules at every step, and in a checkpoint."""

import pytest
import torch
from transformers import get_scheduler

from rlhfkit.schedules import lr_schedule

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
