"""Pure tensor maths of the on-policy objectives (part of the `ops` layer): the policy losses per
token, and how a minibatch's per-token losses become one number. Shapes: B rows, T response
positions; `mask` (B, T) marks each row's tokens that enter the loss.

Policy losses (`POLICY_LOSSES`), each returning per-token losses and detached statistics:

    ppo-clip    max(-A r, -A clip(r, 1-eps_low, 1+eps_high))           Schulman et al. 2017; eps_high >
                [dual clip: for A < 0, at most -c A]                   eps_low is DAPO's clip-higher;
                                                                       dual clip: Ye et al. 2020
    gspo        as ppo-clip with one ratio per sequence,                Zheng et al. 2025 (GSPO)
                s = exp(mean_t log r_t), on every token of it
    gspo-token  s_t = sg(s) * pi_t / sg(pi_t): the value of s, the       Zheng et al. 2025 (GSPO-token)
                gradient of token t's own log-probability
    cispo       -sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi        MiniMax 2025 (CISPO)

Loss aggregation (`aggregate`): the loss of a minibatch is sum_rows contribution(row) / normaliser,
where the normaliser is counted over the whole minibatch, every process and micro-batch included,
before it is split. Each micro-batch's loss is then its exact share of the minibatch's, and the
summed gradients do not depend on how the minibatch was split:

    token-mean               contribution = the row's token-loss sum     normaliser = tokens
    seq-mean-token-mean      contribution = the row's token-loss mean    normaliser = rows with tokens
    seq-mean-token-sum-norm  contribution = token-loss sum / a constant  normaliser = rows with tokens
                             (Dr. GRPO: the constant is the longest response allowed)
"""

from __future__ import annotations

import typing
from typing import Literal

import torch

from .ops import masked_mean

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)


class PolicyLoss(typing.NamedTuple):
    per_token: torch.Tensor  # (B, T) the loss of each token, before aggregation
    # share of valid tokens whose clipped objective was the active one (or whose weight was cut)
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor  # mean of (log ratio)^2 / 2 over valid tokens, the old-to-new policy KL estimate


class ClipRange(typing.NamedTuple):
    """Bounds of the ratio: [1 - low, 1 + high]; None: unclipped."""

    low: float
    high: float

    @classmethod
    def of(cls, low: float, high: float = 0.0) -> ClipRange | None:
        """`low` 0: no clipping; `high` 0: symmetric, the same as `low`."""
        return cls(low, high or low) if low > 0 else None

    def clamp(self, ratio: torch.Tensor) -> torch.Tensor:
        return torch.clamp(ratio, 1.0 - self.low, 1.0 + self.high)


def approx_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return 0.5 * masked_mean(log_ratio.detach() ** 2, mask)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: ClipRange | None, dual_clip: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token losses, clip fraction) of PPO's pessimistic surrogate on `ratio`, whatever the ratio
    is of (a token, or its sequence broadcast to its tokens)."""
    unclipped = -advantages * ratio
    if clip is None:
        return unclipped, torch.zeros((), device=ratio.device)
    clipped = -advantages * clip.clamp(ratio)
    losses = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip > 1.0:
        # A negative advantage with a huge ratio would give an unbounded loss: cap it at -c A.
        cap = -advantages * dual_clip
        capped = (advantages < 0) & (losses > cap)
        losses = torch.where(capped, cap, losses)
        active = active | capped
    return losses, masked_mean(active.float(), mask).detach()


def ppo_clip_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: ClipRange | None,
    dual_clip: float = 0.0,
) -> PolicyLoss:
    """PPO's clipped surrogate per token (Table 7: clip 0.2), with DAPO's separate upper bound and the
    dual clip when asked."""
    log_ratio = new_logprobs - old_logprobs
    losses, clip_fraction = clipped_surrogate(torch.exp(log_ratio), advantages, mask, clip, dual_clip)
    return PolicyLoss(losses, clip_fraction, approx_kl(log_ratio, mask))


def sequence_log_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, 1) GSPO's length-normalised log ratio: the mean of the token log ratios of each sequence."""
    return masked_mean(new_logprobs - old_logprobs, mask, dim=-1).unsqueeze(1)


def gspo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: ClipRange | None,
    dual_clip: float = 0.0,
) -> PolicyLoss:
    """GSPO: one ratio per sequence, (pi/pi_old)^(1/|y|), clipped (the paper: 3e-4 below, 4e-4 above)
    and set on each of its tokens; with seq-mean-token-mean aggregation this is the paper's
    sequence-level objective."""
    ratio = torch.exp(sequence_log_ratio(new_logprobs, old_logprobs, mask)).expand_as(new_logprobs)
    losses, clip_fraction = clipped_surrogate(ratio, advantages, mask, clip, dual_clip)
    return PolicyLoss(losses, clip_fraction, approx_kl(new_logprobs - old_logprobs, mask))


def gspo_token_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: ClipRange | None,
    dual_clip: float = 0.0,
) -> PolicyLoss:
    """GSPO-token: s_t = sg(s) * pi_t / sg(pi_t) has the sequence ratio's value (so the same clipping)
    and token t's own gradient, so that per-token advantages can be used; with an advantage constant
    over each sequence it equals GSPO in value and gradient."""
    sequence = sequence_log_ratio(new_logprobs, old_logprobs, mask).detach()
    ratio = torch.exp(new_logprobs - new_logprobs.detach() + sequence)
    losses, clip_fraction = clipped_surrogate(ratio, advantages, mask, clip, dual_clip)
    return PolicyLoss(losses, clip_fraction, approx_kl(new_logprobs - old_logprobs, mask))


def cispo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: ClipRange | None,
    dual_clip: float = 0.0,
) -> PolicyLoss:
    """CISPO: REINFORCE on every token, weighted by its importance ratio clipped and detached, so a
    token past the bound still gets a gradient (PPO's clip would drop it), only a bounded one."""
    del dual_clip  # the weight is already bounded above
    log_ratio = new_logprobs - old_logprobs
    ratio = torch.exp(log_ratio.detach())
    weight = clip.clamp(ratio) if clip is not None else ratio
    cut = masked_mean((weight != ratio).float(), mask)
    return PolicyLoss(-weight * advantages * new_logprobs, cut, approx_kl(log_ratio, mask))


POLICY_LOSSES = {"ppo-clip": ppo_clip_loss, "gspo": gspo_loss, "gspo-token": gspo_token_loss, "cispo": cispo_loss}


def loss_units(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B,) what each row counts in its minibatch's normaliser: its tokens (token-mean), or 1 for a row
    with any token (the sequence means); summed over the whole minibatch before it is split."""
    tokens = mask.sum(-1).float()
    if mode == "token-mean":
        return tokens
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        return (tokens > 0).float()
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, normaliser: float, constant: float = 1.0
) -> torch.Tensor:
    """This micro-batch's share of its minibatch's loss: sum of its rows' contributions / `normaliser`,
    the `loss_units` of the whole minibatch. `constant`: seq-mean-token-sum-norm's divisor of each
    row's token sum (Dr. GRPO: the longest response allowed)."""
    weights = mask.to(per_token.dtype)
    sums = (per_token * weights).sum(-1)
    if mode == "token-mean":
        contributions = sums
    elif mode == "seq-mean-token-mean":
        contributions = sums / weights.sum(-1).clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        contributions = sums / constant
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    return contributions.sum() / max(normaliser, 1e-8)
