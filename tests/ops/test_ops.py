import math

import pytest
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
    assert ops.logprobs_from_logits(logits, tokens, 1.0).item() == pytest_approx(
        3 - math.log(sum(math.exp(v) for v in (1, 2, 3)))
    )


def pytest_approx(x):
    return pytest.approx(x, rel=1e-5)


def test_masked_mean_ignores_masked_values():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert ops.masked_mean(values, mask).item() == pytest_approx(2.0)
    assert ops.masked_mean(values, mask, dim=1).tolist() == [1.5, 3.0]


def test_position_ids_from_left_padded_mask_start_at_zero():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert ops.position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_right_padding_is_recognised_and_nothing_else_is():
    assert ops.is_right_padded(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]))
    assert not ops.is_right_padded(torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]]))  # one row left padded
    assert not ops.is_right_padded(torch.tensor([[1, 0, 1, 0]]))  # a hole


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = ops.filter_logits(logits, top_k=2)
    assert torch.isinf(top2[0, 2:]).all() and torch.isfinite(top2[0, :2]).all()
    nucleus = ops.filter_logits(logits, top_p=0.7)  # 0.5 < 0.7, 0.5 + 0.3 crosses it: keep two
    assert torch.isfinite(nucleus[0, :2]).all() and torch.isinf(nucleus[0, 2:]).all()


# --- RL maths: every value below is worked out by hand in the comments ---------------


def test_masked_var_biased_and_unbiased():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 2; squared deviations 1, 0, 1 -> biased 2/3, unbiased 2/2
    assert ops.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert ops.masked_var(values, mask).item() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        ops.masked_var(values, torch.tensor([[1, 0, 0, 0]]))


def test_detail24_25_masked_whiten_with_and_without_shifting_the_mean():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # the paper's whiten: mean 2, biased variance 2/3 -> (x - 2) / sqrt(2/3); the masked entry becomes 0
    scale = (2 / 3) ** -0.5
    torch.testing.assert_close(ops.masked_whiten(values, mask), torch.tensor([[-scale, 0.0, scale, 0.0]]))
    # shift_mean=False (reward whitening, Detail 24) adds the mean back
    torch.testing.assert_close(
        ops.masked_whiten(values, mask, shift_mean=False), torch.tensor([[2 - scale, 2.0, 2 + scale, 0.0]])
    )
    # a single valid token does not crash a run: it whitens to 0
    assert ops.masked_whiten(values, torch.tensor([[1, 0, 0, 0]])).tolist() == [[0.0, 0.0, 0.0, 0.0]]


def test_gae_matches_a_hand_computed_trajectory():
    rewards = torch.tensor([[0.1, 0.2, 1.0, 55.0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 77.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    advantages, returns = ops.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=2: delta = 1.0 + 0.9*0 - 0.3 = 0.7                      A2 = 0.7 (the episode ends: next value 0)
    # t=1: delta = 0.2 + 0.9*0.3 - 0.4 = 0.07                   A1 = 0.07 + 0.72*0.7 = 0.574
    # t=0: delta = 0.1 + 0.9*0.4 - 0.5 = -0.04                  A0 = -0.04 + 0.72*0.574 = 0.37328
    torch.testing.assert_close(advantages, torch.tensor([[0.37328, 0.574, 0.7, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.87328, 0.974, 1.0, 0.0]]))


def test_gae_with_gamma_and_lambda_one_returns_the_reward_to_go():
    rewards = torch.tensor([[0.1, 0.2, 1.0], [0.5, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.2, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    advantages, returns = ops.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.3, 1.2, 1.0], [0.5, 0.0, 0.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.8, 0.8, 0.7], [0.3, 0.0, 0.0]]))


def test_ppo_value_loss_clips_around_the_rollout_values():
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.5, -0.1, 40.0]])
    returns = torch.ones(1, 3)
    mask = torch.tensor([[1, 1, 0]])
    loss, clip_fraction = ops.ppo_value_loss(new, old, returns, mask, clip=0.2)
    # token 0: (0.5-1)^2 = 0.25 vs clipped value 0.2: (0.2-1)^2 = 0.64 -> 0.64 (clipped)
    # token 1: (-0.1-1)^2 = 1.21, inside the range -> 1.21
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.21) / 2)
    assert clip_fraction.item() == pytest.approx(0.5)
    assert ops.ppo_value_loss(new, old, returns, mask, clip=None)[0].item() == pytest.approx(0.5 * (0.25 + 1.21) / 2)


def test_kl_estimators_hand_values_and_zero_for_equal_policies():
    logprobs, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    log2 = math.log(2)
    assert ops.kl_penalty(logprobs, ref, "k1").item() == pytest.approx(log2)
    assert ops.kl_penalty(logprobs, ref, "k2").item() == pytest.approx(0.5 * log2**2)
    assert ops.kl_penalty(logprobs, ref, "k3").item() == pytest.approx(0.5 - 1 + log2)  # r - 1 - log r, r = 0.25/0.5
    for kind in ("k1", "k2", "k3"):
        assert ops.kl_penalty(logprobs, logprobs, kind).item() == 0
    with pytest.raises(ValueError, match="k4"):
        ops.kl_penalty(logprobs, ref, "k4")


def test_detail23_eos_trick_replaces_exactly_the_scores_without_eos():
    scores = torch.tensor([1.0, 2.0, 3.0])
    out = ops.eos_trick(scores, torch.tensor([True, False, True]), -1.0)
    assert out.tolist() == [1.0, -1.0, 3.0]


def test_equation3_rewards_put_the_score_on_the_last_valid_token():
    scores = torch.tensor([2.0, -1.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.1, 0.1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rewards = ops.rlhf_rewards(scores, kl, mask, kl_coef=0.5)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.9, 0.0], [-0.05, -0.05, -1.05]]))
    without_scores = ops.rlhf_rewards(torch.zeros(2), kl, mask, kl_coef=0.5)  # the non-score reward alone
    torch.testing.assert_close(without_scores, torch.tensor([[-0.05, -0.1, 0.0], [-0.05, -0.05, -0.05]]))


@pytest.mark.parametrize("chunk_rows", [1, 3, 100])
def test_chunked_logprobs_and_entropy_equal_the_full_computation_with_gradients(chunk_rows):
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 5))
    temperature = 0.7
    full = torch.log_softmax(hidden @ weight.T / temperature, -1)
    expected_lp = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    expected_ent = -(full.exp() * full).sum(-1)
    lp, ent = ops.chunked_logprobs_entropy(hidden, tokens, weight, temperature=temperature, chunk_rows=chunk_rows)
    torch.testing.assert_close(lp, expected_lp)
    torch.testing.assert_close(ent, expected_ent)
    expected_grads = torch.autograd.grad((expected_lp.sum() + expected_ent.sum()), (hidden, weight))
    grads = torch.autograd.grad((lp.sum() + ent.sum()), (hidden, weight))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)
    from_logits, _ = ops.chunked_logprobs_entropy(
        (hidden @ weight.T).detach(), tokens, temperature=temperature, chunk_rows=chunk_rows
    )
    torch.testing.assert_close(from_logits, expected_lp.detach())


def test_explained_variance_pearson_and_the_adaptive_kl_controller():
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert ops.explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert ops.explained_variance(torch.full_like(returns, 2.0), returns, mask).item() == pytest.approx(0.0)
    assert ops.pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])).item() == pytest.approx(1.0)
    assert ops.pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([5.0, 5.0, 5.0])).item() == 0
    assert ops.adaptive_kl_coef(0.1, kl=6.0, target=6.0, horizon=100, steps=10) == pytest.approx(0.1)
    # KL twice the target: error clipped to +0.2 -> coef * (1 + 0.2 * 10/100)
    assert ops.adaptive_kl_coef(0.1, kl=12.0, target=6.0, horizon=100, steps=10) == pytest.approx(0.1 * 1.02)
    assert ops.adaptive_kl_coef(0.1, kl=5.4, target=6.0, horizon=100, steps=10) == pytest.approx(0.1 * (1 - 0.1 * 0.1))


def test_group_relative_advantages_hand_values_with_and_without_std_scaling():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    std = math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 3)  # Bessel-corrected
    want = torch.tensor([-1.5, -0.5, 0.5, 1.5]) / (std + 1e-4)
    got = ops.group_relative_advantages(scores, groups)
    torch.testing.assert_close(got[:4], want)
    assert got[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # equal rewards in a group: zero advantages
    assert ops.group_relative_advantages(scores, groups, scale_by_std=False).tolist() == [
        -1.5,
        -0.5,
        0.5,
        1.5,
        0,
        0,
        0,
        0,
    ]


def test_group_statistics_follow_group_ids_in_any_order():
    scores = torch.tensor([1.0, 10.0, 3.0, 20.0])
    groups = torch.tensor([3, 1, 3, 1])
    assert ops.group_relative_advantages(scores, groups, scale_by_std=False).tolist() == [-1.0, -5.0, 1.0, 5.0]
    assert ops.leave_one_out_baseline(scores, groups).tolist() == [3.0, 20.0, 1.0, 10.0]


def test_leave_one_out_baseline_hand_values_and_it_excludes_the_sample_itself():
    scores = torch.tensor([1.0, 2.0, 3.0, 6.0])
    groups = torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(ops.leave_one_out_baseline(scores, groups), torch.tensor([11 / 3, 10 / 3, 3.0, 2.0]))
    changed = scores.clone()
    changed[2] = 100.0
    baseline = ops.leave_one_out_baseline(changed, groups)
    assert baseline[2].item() == 3.0 and baseline[0].item() != 11 / 3


def test_group_estimators_need_two_samples_per_group():
    with pytest.raises(ValueError, match="at least two samples"):
        ops.leave_one_out_baseline(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="at least two samples"):
        ops.group_relative_advantages(torch.tensor([1.0]), torch.tensor([0]))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_estimators_give_each_valid_token_its_sequence_advantage(name):
    # per-token rewards: -0.1 KL penalty per token, the score on the last valid token
    rewards = torch.tensor([[-0.1, -0.1, 1.0], [-0.1, 2.0, 0.0], [-0.1, -0.1, -0.1], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    groups = torch.tensor([0, 0, 1, 1])
    returns = torch.tensor([0.8, 1.9, -0.3, 0.5])
    per_row = {
        "grpo": ops.group_relative_advantages(rewards.sum(-1), groups, scale_by_std=False),
        "rloo": ops.leave_one_out_advantages(rewards.sum(-1), groups),
    }[name]
    advantages, _ = ops.sequence_advantages(per_row, mask)
    # with two samples per group both the group mean and the leave-one-out baseline are hand-checkable
    if name == "grpo":
        per_sequence = torch.tensor([-0.55, 0.55, -0.4, 0.4])
    else:
        per_sequence = torch.tensor([0.8 - 1.9, 1.9 - 0.8, -0.3 - 0.5, 0.5 + 0.3])
    torch.testing.assert_close(advantages, per_sequence.unsqueeze(1) * mask)
    assert torch.allclose(returns, rewards.sum(-1))
