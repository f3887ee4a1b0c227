"""The on-policy objectives' maths against values worked out by hand: policy losses, loss
aggregation, advantage estimators, DAPO's shaping, and which KL form has the reverse-KL gradient."""

import math

import pytest
import torch

from rlhfkit import ops
from rlhfkit.policy_losses import (
    ClipRange,
    aggregate,
    cispo_loss,
    gspo_loss,
    gspo_token_loss,
    loss_units,
    ppo_clip_loss,
)

LOG = math.log


def logprobs(*values, grad=False):
    return torch.tensor([list(values)], dtype=torch.float64, requires_grad=grad)


def test_clip_higher_bounds_the_ratio_unevenly_and_the_dual_clip_caps_negative_advantages():
    # four tokens, old log-probs 0: ratios 1.5, 0.5, 1.5, 0.5 with advantages +1, +1, -1, -1
    new = logprobs(LOG(1.5), LOG(0.5), LOG(1.5), LOG(0.5), grad=True)
    old, advantages, mask = (
        torch.zeros(1, 4, dtype=torch.float64),
        torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64),
        torch.ones(1, 4),
    )
    out = ppo_clip_loss(new, old, advantages, mask, ClipRange.of(0.2, 0.28))
    # max(-A r, -A clip(r, 0.8, 1.28)): max(-1.5, -1.28), max(-0.5, -0.8), max(1.5, 1.28), max(0.5, 0.8)
    torch.testing.assert_close(out.per_token, torch.tensor([[-1.28, -0.5, 1.5, 0.8]], dtype=torch.float64))
    assert out.clip_fraction.item() == 0.5  # tokens 1 and 4 take the clipped branch
    out.per_token.sum().backward()
    # d(-A r)/d log pi = -A r where unclipped, 0 where clipped
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -0.5, 1.5, 0.0]], dtype=torch.float64))
    symmetric = ppo_clip_loss(new, old, advantages, mask, ClipRange.of(0.2))
    assert symmetric.per_token[0, 0].item() == pytest.approx(-1.2)
    dual = ppo_clip_loss(new, old, advantages, mask, ClipRange.of(0.2, 0.28), dual_clip=1.4)
    # token 3: A = -1 and r = 1.5: the loss 1.5 is capped at -c A = 1.4; the others are unchanged
    torch.testing.assert_close(dual.per_token, torch.tensor([[-1.28, -0.5, 1.4, 0.8]], dtype=torch.float64))
    assert dual.clip_fraction.item() == 0.75
    assert ClipRange.of(0.0, 0.28) is None  # clip_range 0: unclipped


def test_ppo_policy_loss_clips_in_the_pessimistic_direction():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 50.0]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    out = ppo_clip_loss(new, old, advantages, mask, ClipRange.of(0.2))
    # token 0: ratio 1.5, A=+1: -1.5 vs clipped -1.2 -> -1.2 (clipped)
    # token 1: ratio 0.5, A=-1: +0.5 vs clipped +0.8 -> +0.8 (clipped)
    # token 2: ratio 1.1, A=+1: -1.1 vs -1.1 -> -1.1 (inside the range)
    assert aggregate(out.per_token, mask, "token-mean", 3.0).item() == pytest.approx((-1.2 + 0.8 - 1.1) / 3)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
    logs = [math.log(1.5), math.log(0.5), math.log(1.1)]
    assert out.approx_kl.item() == pytest.approx(0.5 * sum(x * x for x in logs) / 3)
    unclipped = ppo_clip_loss(new, old, advantages, mask, None)
    assert aggregate(unclipped.per_token, mask, "token-mean", 3.0).item() == pytest.approx((-1.5 + 0.5 - 1.1) / 3)
    assert unclipped.clip_fraction.item() == 0


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    # token log ratios 0.2 and -0.1: s = exp(0.05) = 1.051271
    new, old = logprobs(0.2, -0.1, grad=True), torch.zeros(1, 2, dtype=torch.float64)
    advantages, mask = torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2)
    unclipped = gspo_loss(new, old, advantages, mask, None)
    torch.testing.assert_close(unclipped.per_token, torch.full((1, 2), -math.exp(0.05), dtype=torch.float64))
    aggregate(unclipped.per_token, mask, "seq-mean-token-mean", 1.0).backward()
    # d(-s)/d log pi_t = -s / |y|: every token of the sequence moves alike
    torch.testing.assert_close(new.grad, torch.full((1, 2), -math.exp(0.05) / 2, dtype=torch.float64))
    clipped = gspo_loss(new, old, advantages, mask, ClipRange.of(3e-4, 4e-4))
    # s = 1.0513 > 1 + 4e-4 with A > 0: max(-1.0513, -1.0004) = -1.0004, clipped on both tokens
    torch.testing.assert_close(clipped.per_token, torch.full((1, 2), -1.0004, dtype=torch.float64))
    assert clipped.clip_fraction.item() == 1.0


def test_gspo_token_equals_gspo_in_value_and_gradient_when_the_advantage_is_the_sequences():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([[0.7] * 3, [-1.2] * 3], dtype=torch.float64)
    grads, values = [], []
    for loss in (gspo_loss, gspo_token_loss):
        new = (old + torch.tensor([[0.1, -0.2, 0.05], [0.3, 0.1, 0.0]], dtype=torch.float64)).requires_grad_()
        out = loss(new, old, advantages, mask, None)
        value = aggregate(out.per_token, mask, "seq-mean-token-mean", 2.0)
        value.backward()
        values.append(value.item())
        grads.append(new.grad * mask)
    assert values[0] == pytest.approx(values[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_cispo_keeps_a_bounded_gradient_on_every_token_where_ppo_drops_the_clipped_ones():
    # ratios e^0.5 = 1.6487 (past 1.28) and e^0.1 = 1.1052, advantage +2 on both
    new, old = logprobs(0.5, 0.1, grad=True), torch.zeros(1, 2, dtype=torch.float64)
    advantages, mask = torch.full((1, 2), 2.0, dtype=torch.float64), torch.ones(1, 2)
    out = cispo_loss(new, old, advantages, mask, ClipRange.of(0.2, 0.28))
    # -sg(clip(r)) A log pi: weights 1.28 and 1.1052
    torch.testing.assert_close(
        out.per_token, torch.tensor([[-1.28 * 2 * 0.5, -math.exp(0.1) * 2 * 0.1]], dtype=torch.float64)
    )
    assert out.clip_fraction.item() == 0.5
    out.per_token.sum().backward()
    torch.testing.assert_close(new.grad, torch.tensor([[-1.28 * 2, -math.exp(0.1) * 2]], dtype=torch.float64))
    ppo = logprobs(0.5, 0.1, grad=True)
    ppo_clip_loss(ppo, old, advantages, mask, ClipRange.of(0.2, 0.28)).per_token.sum().backward()
    assert ppo.grad[0, 0].item() == 0.0  # PPO's clip leaves the first token without a gradient


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "normaliser", "want"),
    [
        ("token-mean", 4.0, (1 + 2 + 3 + 4) / 4),  # every token weighs the same
        ("seq-mean-token-mean", 2.0, (6 / 3 + 4 / 1) / 2),  # every sequence weighs the same
        ("seq-mean-token-sum-norm", 2.0, (6 / 5 + 4 / 5) / 2),  # Dr. GRPO: token sums over the constant 5
    ],
)
def test_each_aggregation_hand_values_and_its_rows_sum_to_the_whole(mode, normaliser, want):
    assert loss_units(MASK, mode).sum().item() == normaliser
    whole = aggregate(PER_TOKEN, MASK, mode, normaliser, constant=5.0)
    assert whole.item() == pytest.approx(want)
    # split into its rows, each divided by the whole's normaliser: the parts add up to the whole
    parts = sum(aggregate(PER_TOKEN[i : i + 1], MASK[i : i + 1], mode, normaliser, constant=5.0) for i in range(2))
    assert parts.item() == pytest.approx(want)


def test_a_token_mean_per_micro_batch_averaged_is_not_the_minibatchs_token_mean():
    # the bug of TRL #3021 and verl #5625: each micro-batch divides by its own tokens, then the means are averaged
    per_micro = [aggregate(PER_TOKEN[i : i + 1], MASK[i : i + 1], "token-mean", float(MASK[i].sum())) for i in range(2)]
    assert (sum(per_micro) / 2).item() == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3.0: the short row counts 3 times over
    assert aggregate(PER_TOKEN, MASK, "token-mean", 4.0).item() == pytest.approx(2.5)


def test_returns_to_go_sum_each_tokens_reward_and_the_later_ones():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    torch.testing.assert_close(ops.returns_to_go(rewards, mask), torch.tensor([[6.0, 5.0, 3.0], [2.0, 1.0, 0.0]]))
    # gamma 0.5: 3; 2 + 0.5 * 3 = 3.5; 1 + 0.5 * 3.5 = 2.75
    torch.testing.assert_close(ops.returns_to_go(rewards[:1], mask[:1], 0.5), torch.tensor([[2.75, 3.5, 3.0]]))


def test_overlong_punishment_falls_linearly_over_the_buffer():
    # 10 tokens allowed, a buffer of 4: free up to 6, then -1/4 per token, -1 from 10 on
    penalty = ops.overlong_penalty(torch.tensor([5, 6, 7, 8, 10, 12]), 10, 4)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    assert ops.overlong_penalty(torch.tensor([10]), 10, 4, factor=0.5).item() == -0.5
    assert ops.overlong_penalty(torch.tensor([10]), 10, 0).item() == 0.0


def test_group_spread_is_the_range_of_each_rows_group():
    spread = ops.group_spread(torch.tensor([1.0, 3.0, 2.0, 2.0, -1.0, 0.5]), torch.tensor([0, 0, 1, 1, 2, 2]))
    torch.testing.assert_close(spread, torch.tensor([2.0, 2.0, 0.0, 0.0, 1.5, 1.5]))


def exact_kl_gradients():
    """A 5-token distribution: pi_theta, the rollout policy pi_old (a step behind) and pi_ref. Returns
    (theta, pi_old, log pi_ref, the exact gradient of KL(pi || pi_ref), of KL(pi_ref || pi))."""
    theta = torch.tensor([0.3, -0.2, 0.9, 0.0, -1.1], dtype=torch.float64, requires_grad=True)
    old = (theta.detach() + torch.tensor([0.05, -0.1, 0.02, 0.08, -0.03], dtype=torch.float64)).log_softmax(-1)
    ref = torch.tensor([0.0, 0.4, 0.1, -0.5, 0.2], dtype=torch.float64).log_softmax(-1)
    reverse = torch.autograd.grad((theta.softmax(-1) * (theta.log_softmax(-1) - ref)).sum(), theta)[0]
    forward = torch.autograd.grad((ref.exp() * (ref - theta.log_softmax(-1))).sum(), theta)[0]
    return theta, old, ref, reverse, forward


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_every_kl_loss_form_has_the_reverse_kl_gradient_in_expectation_over_the_rollout_policy(kind):
    theta, old, ref, reverse, _ = exact_kl_gradients()
    # E_{x ~ pi_old}[grad kl_loss(x)], the expectation taken exactly over the 5 tokens
    expected = (old.exp() * ops.kl_loss(theta.log_softmax(-1), old, ref, kind)).sum()
    torch.testing.assert_close(torch.autograd.grad(expected, theta)[0], reverse)


def test_grpos_plain_k3_loss_has_the_forward_kl_gradient_and_plain_k1_none():
    theta, _, ref, reverse, forward = exact_kl_gradients()
    on_policy = theta.log_softmax(-1).detach().exp()  # on-policy: the tokens come from pi_theta itself
    plain_k3 = torch.autograd.grad((on_policy * ops.kl_penalty(theta.log_softmax(-1), ref, "k3")).sum(), theta)[0]
    torch.testing.assert_close(plain_k3, forward)
    assert not torch.allclose(plain_k3, reverse, atol=1e-3)
    plain_k1 = torch.autograd.grad((on_policy * ops.kl_penalty(theta.log_softmax(-1), ref, "k1")).sum(), theta)[0]
    torch.testing.assert_close(plain_k1, torch.zeros(5, dtype=torch.float64))


def test_only_k1_as_a_reward_gives_the_reverse_kl_gradient():
    theta, _, ref, reverse, _ = exact_kl_gradients()
    for kind in ("k1", "k2", "k3"):
        logp = theta.log_softmax(-1)
        penalty = ops.kl_penalty(logp.detach(), ref, kind)  # a reward is a number: no gradient through it
        # the policy gradient of the reward -penalty: E_pi[-penalty * grad log pi], descended as a loss
        gradient = torch.autograd.grad((logp.exp().detach() * penalty * logp).sum(), theta)[0]
        assert torch.allclose(gradient, reverse) == (kind == "k1"), kind
