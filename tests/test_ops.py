import math

import torch

from rlhfkit import ops


def test_first_true_indices_hand_values():
    bools = torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert ops.first_true_indices(bools).tolist() == [2, 0, 4]


def test_truncate_after_eos_keeps_eos_and_pads_after():
    eos, pad = 2, 9
    responses = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 5, 5, 5]])
    out = ops.truncate_after_eos(responses, eos, pad)
    assert out.tolist() == [[5, 2, 9, 9], [5, 6, 7, 8], [2, 9, 9, 9]]


def test_logprobs_from_logits_divides_by_temperature():
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    tokens = torch.tensor([[2]])
    t = 0.7
    expected = 3 / t - math.log(sum(math.exp(v / t) for v in (1.0, 2.0, 3.0)))
    assert ops.logprobs_from_logits(logits, tokens, t).item() == pytest_approx(expected)
    assert ops.logprobs_from_logits(logits, tokens, 1.0).item() == pytest_approx(3 - math.log(sum(math.exp(v) for v in (1, 2, 3))))


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5)


def test_masked_mean_ignores_masked_values():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert ops.masked_mean(values, mask).item() == pytest_approx(2.0)
    assert ops.masked_mean(values, mask, dim=1).tolist() == [1.5, 3.0]


def test_position_ids_from_left_padded_mask_start_at_zero():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert ops.position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = ops.filter_logits(logits, top_k=2)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    nucleus = ops.filter_logits(logits, top_p=0.7)  # 0.5 < 0.7, 0.5 + 0.3 crosses it: keep two
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()


def test_token_cross_entropy_sum_shifts_labels():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 1] = 2.0  # favours token 1 at position 1
    labels = torch.tensor([[-100, 1, -100]])
    loss = ops.token_cross_entropy_sum(logits, labels)
    expected = -(2 - math.log(math.exp(2) + 3))
    assert loss.item() == pytest_approx(expected)
