"""How a batch is split never changes the update: for every loss aggregation, and every
policy loss under it, one update's gradient is the same with 1 micro-batch of 8 rows, 2 of 4, 4 of 2,
and on 2 gloo processes, because every normaliser is counted over the whole minibatch before the split.

The gradient is read as the weights' change under SGD at learning rate 1 (Adam would hide a wrong
scale). The batch has responses of 1 to 6 tokens, so a per-micro-batch normaliser (TRL #3021, verl
#5625) moves the gradient by tens of percent; the tolerances allow float32 summation order only.
"""

import pytest
import torch
import torch.multiprocessing as mp

from rlhfkit.policy_losses import AGGREGATIONS, POLICY_LOSSES

from ..support.gradients import assert_same_gradient, one_update_gradient, split_invariance_worker
from ..support.processes import free_port

CASES = [{"loss_aggregation": mode, "policy_loss": loss} for mode in AGGREGATIONS for loss in POLICY_LOSSES] + [
    # DAPO's objective: clip-higher, overlong filtering; PPO's dual clip
    {"loss_aggregation": "token-mean", "clip_range_high": 0.28, "mask_truncated": True},
    {"loss_aggregation": "seq-mean-token-mean", "dual_clip": 3.0, "clip_range": 0.05},
    {"loss_aggregation": "seq-mean-token-sum-norm", "loss_normaliser": 4.0, "kl_estimator": "k2"},
]


def case_id(case):
    return ",".join(f"{k}={v}" for k, v in case.items())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_one_updates_gradient_is_the_same_in_1x8_2x4_and_4x2_micro_batches(case, tiny_model_dir):
    whole = one_update_gradient(tiny_model_dir, case, micro_batch_size=8)
    for micro in (4, 2):
        assert_same_gradient(
            one_update_gradient(tiny_model_dir, case, micro_batch_size=micro), whole, f"{8 // micro}x{micro}"
        )


def test_the_split_invariance_has_teeth_a_per_micro_batch_token_mean_differs(tiny_model_dir, monkeypatch):
    """The same comparison with the normaliser counted per micro-batch (the bug the design avoids) fails."""
    from rlhfkit.onpolicy import update

    whole = one_update_gradient(tiny_model_dir, {"loss_aggregation": "token-mean"}, micro_batch_size=8)
    original = update.Objective.aggregate

    def per_micro_batch(self, per_token, mask, normaliser):
        micro_tokens = float(mask.sum())  # this micro-batch's own tokens, scaled to the minibatch's share by its rows
        return original(self, per_token, mask, micro_tokens) * (mask.size(0) / 8)

    monkeypatch.setattr(update.Objective, "aggregate", per_micro_batch)
    split = one_update_gradient(tiny_model_dir, {"loss_aggregation": "token-mean"}, micro_batch_size=2)
    with pytest.raises(AssertionError):
        assert_same_gradient(split, whole, "4x2 with per-micro-batch token means")


def test_two_gloo_processes_give_the_gradient_one_process_gives(tiny_model_dir, tmp_path):
    out = tmp_path / "gradients.pt"
    mp.start_processes(
        split_invariance_worker,
        args=(2, free_port(), str(tiny_model_dir), CASES, 2, str(out)),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    gradients = torch.load(out, weights_only=True)
    for case, gradient in zip(CASES, gradients, strict=True):
        assert_same_gradient(
            gradient, one_update_gradient(tiny_model_dir, case, micro_batch_size=8), f"2 processes, {case_id(case)}"
        )
