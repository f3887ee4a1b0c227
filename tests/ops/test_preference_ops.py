"""The DPO family's losses (`preference_ops`) against values worked out by hand: dpo, ipo, cdpo, simpo."""

import math
import typing

import pytest
import torch

from rlhfkit.config import DPOConfig
from rlhfkit.preference_ops import LOSS_TYPES, PreferenceObjective, implicit_rewards, preference_loss


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def test_dpo_is_log2_with_zero_rewards_when_the_policy_is_the_reference():
    logps = torch.tensor([-3.0, -7.5, -0.2])
    other = torch.tensor([-4.0, -1.0, -9.0])
    out = preference_loss(logps, other, PreferenceObjective("dpo", 0.05), logps, other)
    # h = 0 for every pair: -log sigmoid(0) = log 2
    torch.testing.assert_close(out.losses, torch.full((3,), math.log(2)))
    assert out.chosen_rewards.abs().max() == 0 and out.rejected_rewards.abs().max() == 0


def test_dpo_hand_values_and_gradient_direction():
    chosen = torch.tensor([-1.0], requires_grad=True)
    rejected = torch.tensor([-2.0], requires_grad=True)
    out = preference_loss(chosen, rejected, PreferenceObjective("dpo", 0.5), torch.tensor([-1.5]), torch.tensor([-1.0]))
    # chosen reward 0.5 * (-1 + 1.5) = 0.25, rejected 0.5 * (-2 + 1) = -0.5, loss = log(1 + exp(-0.75))
    assert out.chosen_rewards.item() == 0.25 and out.rejected_rewards.item() == -0.5
    torch.testing.assert_close(out.losses, torch.tensor([softplus(-0.75)]))
    out.losses.sum().backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()  # descent raises the chosen, lowers the rejected
    assert not out.chosen_rewards.requires_grad


def test_ipo_hand_values_and_its_minimum_at_one_over_two_beta():
    ipo = PreferenceObjective("ipo", 0.25)  # target h = 1 / (2 * 0.25) = 2
    ref = torch.tensor([-4.0, -4.0, -4.0])
    # chosen log-ratios 0, 1.5, 3; rejected log-ratios 0, -0.5, 0 -> h = 0, 2, 3
    chosen = torch.tensor([-4.0, -2.5, -1.0], requires_grad=True)
    rejected = torch.tensor([-4.0, -4.5, -4.0])
    out = preference_loss(chosen, rejected, ipo, ref, ref)
    # (0 - 2)^2 = 4: at step 0 IPO's loss is 1/(4 beta^2), not log 2; (2 - 2)^2 = 0; (3 - 2)^2 = 1
    torch.testing.assert_close(out.losses, torch.tensor([4.0, 0.0, 1.0]))
    # rewards stay DPO's: beta * log-ratio = 0.25 * (0, 1.5, 3) and 0.25 * (0, -0.5, 0)
    torch.testing.assert_close(out.chosen_rewards, torch.tensor([0.0, 0.375, 0.75]))
    torch.testing.assert_close(out.rejected_rewards, torch.tensor([0.0, -0.125, 0.0]))
    out.losses.sum().backward()
    # d/dh (h - 2)^2 = 2 (h - 2): -4 below the target, 0 at it, +2 beyond it (IPO pulls an overfit margin back)
    torch.testing.assert_close(chosen.grad, torch.tensor([-4.0, 0.0, 2.0]))


def test_ipo_sums_log_probabilities_like_dpo():
    # the same pair split into more tokens changes nothing: h is a difference of summed log-ratios
    out = preference_loss(torch.tensor([-10.0]), torch.tensor([-12.0]), PreferenceObjective("ipo", 0.1),
                          torch.tensor([-11.0]), torch.tensor([-11.0]), torch.tensor([5]), torch.tensor([50]))
    # h = (-10 + 11) - (-12 + 11) = 2; target 1 / 0.2 = 5; (2 - 5)^2 = 9
    torch.testing.assert_close(out.losses, torch.tensor([9.0]))


def test_cdpo_with_zero_smoothing_is_dpo_and_log2_at_the_reference_for_any_eps():
    torch.manual_seed(0)
    chosen, rejected, ref_c, ref_r = (torch.randn(16) * 5 for _ in range(4))
    dpo = preference_loss(chosen, rejected, PreferenceObjective("dpo", 0.3), ref_c, ref_r)
    cdpo = preference_loss(chosen, rejected, PreferenceObjective("cdpo", 0.3, label_smoothing=0.0), ref_c, ref_r)
    torch.testing.assert_close(cdpo.losses, dpo.losses)
    at_reference = preference_loss(
        chosen, rejected, PreferenceObjective("cdpo", 0.3, label_smoothing=0.2), chosen, rejected
    )
    # h = 0: (1 - eps) log 2 + eps log 2 = log 2
    torch.testing.assert_close(at_reference.losses, torch.full((16,), math.log(2)))


def test_cdpo_hand_value_and_zero_gradient_where_sigmoid_of_beta_h_is_one_minus_eps():
    eps, beta = 0.2, 0.5
    cdpo = PreferenceObjective("cdpo", beta, label_smoothing=eps)
    # d/dz [-(1-eps) log s(z) - eps log s(-z)] = s(z) - (1 - eps) = 0 at s(z) = 0.8, z = log(0.8/0.2) = log 4; h = z /
    # beta
    h = math.log(4) / beta
    chosen = torch.tensor([h], requires_grad=True)
    out = preference_loss(chosen, torch.tensor([0.0]), cdpo, torch.tensor([0.0]), torch.tensor([0.0]))
    out.losses.sum().backward()
    assert abs(chosen.grad.item()) < 1e-6
    # there the loss is the binary entropy of eps: 0.8 log(1/0.8) + 0.2 log(1/0.2) = 0.17851 + 0.32189 = 0.50040
    assert out.losses.item() == pytest.approx(0.8 * math.log(1 / 0.8) + 0.2 * math.log(1 / 0.2), abs=1e-6)
    assert out.losses.item() == pytest.approx(0.50040, abs=1e-5)
    # h = 2: z = 1; 0.8 * log(1 + e^-1) + 0.2 * log(1 + e^1) = 0.8 * 0.31326 + 0.2 * 1.31326 = 0.51326
    two = preference_loss(torch.tensor([2.0]), torch.tensor([0.0]), cdpo, torch.tensor([0.0]), torch.tensor([0.0]))
    assert two.losses.item() == pytest.approx(0.8 * softplus(-1) + 0.2 * softplus(1), abs=1e-6)
    assert two.losses.item() == pytest.approx(0.51326, abs=1e-5)


def test_simpo_hand_values_without_a_reference():
    simpo = PreferenceObjective("simpo", 2.0, simpo_gamma=1.0)
    chosen = torch.tensor([-6.0], requires_grad=True)
    rejected = torch.tensor([-12.0], requires_grad=True)
    out = preference_loss(chosen, rejected, simpo, chosen_lengths=torch.tensor([3]), rejected_lengths=torch.tensor([4]))
    # rewards 2 * (-6 / 3) = -4 and 2 * (-12 / 4) = -6; loss = -log sigmoid(-4 - (-6) - 1) = log(1 + e^-1) = 0.31326
    assert out.chosen_rewards.item() == -4.0 and out.rejected_rewards.item() == -6.0
    assert out.losses.item() == pytest.approx(softplus(-1), abs=1e-6)
    assert out.losses.item() == pytest.approx(0.31326, abs=1e-5)
    out.losses.sum().backward()
    # d loss / d log pi(y_w) = -(1 - sigmoid(1)) * beta / |y_w| = -0.26894 * 2 / 3 = -0.17929
    assert chosen.grad.item() == pytest.approx(-(1 - 1 / (1 + math.exp(-1))) * 2 / 3, abs=1e-6)
    assert rejected.grad.item() > 0


def test_simpo_rewards_are_length_normalised():
    simpo = PreferenceObjective("simpo", 2.5, simpo_gamma=1.4)
    # -0.5 nats per token over 4 and over 40 tokens: the same reward 2.5 * -0.5 = -1.25
    rewards = implicit_rewards(torch.tensor([-2.0, -20.0]), simpo, lengths=torch.tensor([4, 40]))
    torch.testing.assert_close(rewards, torch.tensor([-1.25, -1.25]))
    out = preference_loss(
        torch.tensor([-2.0]),
        torch.tensor([-20.0]),
        simpo,
        chosen_lengths=torch.tensor([4]),
        rejected_lengths=torch.tensor([40]),
    )
    # equal rewards: the loss is -log sigmoid(-gamma) = log(1 + e^1.4), so a tie is still pushed apart by gamma
    assert out.losses.item() == pytest.approx(softplus(1.4), abs=1e-6)


def test_simpo_ignores_a_reference_and_the_others_need_one():
    simpo = PreferenceObjective("simpo", 2.0, simpo_gamma=0.5)
    lengths = torch.tensor([2]), torch.tensor([2])
    alone = preference_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), simpo, None, None, *lengths)
    given = preference_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), simpo, torch.tensor([9.0]), torch.tensor([-9.0]), *lengths
    )
    torch.testing.assert_close(alone.losses, given.losses)
    with pytest.raises(ValueError, match="response token counts"):
        preference_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), simpo)
    with pytest.raises(ValueError, match="reference"):
        preference_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), PreferenceObjective("ipo", 0.1))
    with pytest.raises(ValueError, match="not one of"):
        preference_loss(
            torch.tensor([-1.0]),
            torch.tensor([-3.0]),
            PreferenceObjective("kto", 0.1),
            torch.tensor([0.0]),
            torch.tensor([0.0]),
        )


def test_the_config_offers_exactly_the_implemented_loss_types():
    assert typing.get_args(typing.get_type_hints(DPOConfig)["loss_type"]) == LOSS_TYPES
