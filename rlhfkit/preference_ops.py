"""Pure tensor maths of the preference losses (the DPO family): the preference-loss part of the `ops`
layer, with no I/O and no state. Inputs are (B,) log-probabilities log pi(y|x) summed over each
response's tokens; h is the margin of the response scores s, chosen minus rejected.

    loss_type  per-pair loss                                   score s(y)            source
    dpo        -log sigmoid(beta h)                            log pi/pi_ref (sum)   Rafailov et al. 2023
    ipo        (h - 1/(2 beta))^2                              log pi/pi_ref (sum)   Azar et al. 2023, eq. 17
    cdpo       -(1-eps) log sigmoid(beta h)                    log pi/pi_ref (sum)   Mitchell 2023 (cDPO)
               - eps log sigmoid(-beta h)
    simpo      -log sigmoid(beta h - gamma)                    log pi / |y|          Meng et al. 2024
                                                               (no reference)

Every response's implicit reward is beta s(y): DPO's equation 5 for dpo, ipo and cdpo, and
SimPO's length-normalised reward for simpo, whose |y| counts the response tokens in the sum.

IPO's log-probabilities are summed, as in the paper's own code (summarize_from_feedback_details,
dpo.py); TRL averages them over tokens for IPO only. Summed, IPO shares DPO's cached reference
log-probabilities and implicit reward, and its target 1/(2 beta) is a margin in nats per response.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

LossType = Literal["dpo", "ipo", "cdpo", "simpo"]
LOSS_TYPES: tuple[str, ...] = typing.get_args(LossType)
REFERENCE_FREE = frozenset({"simpo"})


class PreferenceObjective(typing.NamedTuple):
    """Which preference loss, with its weights; what `rlhfkit dpo` records beside the model it trains."""

    loss_type: str
    beta: float
    label_smoothing: float = 0.0  # cdpo's eps: the assumed probability that a label is flipped
    simpo_gamma: float = 0.0  # simpo's target margin between the rewards

    @property
    def uses_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE


class PreferenceLoss(typing.NamedTuple):
    losses: torch.Tensor  # (B,) per-pair losses
    chosen_rewards: torch.Tensor  # (B,) implicit rewards beta * s(y), detached: they are for logging
    rejected_rewards: torch.Tensor  # (B,)


def response_scores(logps: torch.Tensor, objective: PreferenceObjective, ref_logps: torch.Tensor | None = None,
                    lengths: torch.Tensor | None = None) -> torch.Tensor:
    """s(y): log pi(y)/pi_ref(y), or for a reference-free loss the mean token log-probability log pi(y)/|y|."""
    if objective.uses_reference:
        if ref_logps is None:
            raise ValueError(
                f"loss_type={objective.loss_type} compares the policy with a reference: give its log-probabilities"
            )
        return logps - ref_logps
    if lengths is None:
        raise ValueError(
            f"loss_type={objective.loss_type} normalises by response length: give the response token counts"
        )
    return logps / lengths


def implicit_rewards(
    logps: torch.Tensor,
    objective: PreferenceObjective,
    ref_logps: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """beta * s(y) of each response: the reward the preference loss implicitly fits (DPO's equation 5)."""
    return objective.beta * response_scores(logps, objective, ref_logps, lengths)


def sigmoid_losses(h: torch.Tensor, objective: PreferenceObjective) -> torch.Tensor:
    return -F.logsigmoid(objective.beta * h)


def ipo_losses(h: torch.Tensor, objective: PreferenceObjective) -> torch.Tensor:
    # a squared distance to a finite target: the margin stops growing once the pair is separated by 1/(2 beta)
    return (h - 1 / (2 * objective.beta)) ** 2


def conservative_losses(h: torch.Tensor, objective: PreferenceObjective) -> torch.Tensor:
    # the Bradley-Terry likelihood of a label that is wrong with probability eps: minimal where
    # sigmoid(beta h) = 1 - eps, so the margin stays finite too
    eps = objective.label_smoothing
    return -(1 - eps) * F.logsigmoid(objective.beta * h) - eps * F.logsigmoid(-objective.beta * h)


def simpo_losses(h: torch.Tensor, objective: PreferenceObjective) -> torch.Tensor:
    return -F.logsigmoid(objective.beta * h - objective.simpo_gamma)


PAIR_LOSSES: dict[str, Callable[[torch.Tensor, PreferenceObjective], torch.Tensor]] = {
    "dpo": sigmoid_losses,
    "ipo": ipo_losses,
    "cdpo": conservative_losses,
    "simpo": simpo_losses,
}


def preference_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    objective: PreferenceObjective,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
) -> PreferenceLoss:
    """Per-pair losses of `objective.loss_type` and the detached implicit rewards, from (B,) summed
    log-probabilities: the reference's for dpo, ipo and cdpo, the response token counts for simpo."""
    if objective.loss_type not in PAIR_LOSSES:
        raise ValueError(f"loss_type={objective.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    chosen = response_scores(policy_chosen_logps, objective, ref_chosen_logps, chosen_lengths)
    rejected = response_scores(policy_rejected_logps, objective, ref_rejected_logps, rejected_lengths)
    losses = PAIR_LOSSES[objective.loss_type](chosen - rejected, objective)
    return PreferenceLoss(losses, (objective.beta * chosen).detach(), (objective.beta * rejected).detach())
