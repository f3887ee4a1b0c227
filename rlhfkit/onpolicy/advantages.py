"""Advantages, the phase between scoring and the update, on the whole update's rollout (Section 7,
Details 23-25, Equation 3):

    scores    = raw score minus the length penalty; -1 when there is no EOS; DAPO's overlong
                punishment                                                            (Detail 23)
    rewards   = -beta * KL per token, plus the score at the EOS token itself         (Equation 3)
    advantages, returns = the configured estimator (PPO: GAE with the value model)    (Details 22, 25)

Each estimator is declared where it is defined, with what it needs beyond the rewards:
`@estimator("remax", reads=ReinforceConfig, needs_greedy_baseline=True)` registers it in `ESTIMATORS`;
a stage whose config is a `reads` class (or a subclass) may name it; collection samples the greedy
baselines an estimator declares, and `check_estimator` refuses, as the config resolves, a name no
estimator of that stage has and a config that cannot give its estimator the groups it compares. An
estimator is `(options, rewards, mask, batch, groups) -> (advantages, returns)`: `options` is the stage's
`config.AdvantageOptions` (gamma, lam, scale_rewards, ...); what else it needs it reads from the rollout
`batch` (PPO's `values`, ReMax's `baseline_scores`); `groups` holds each row's group id (the rows of one
prompt's samples are consecutive and share one id). The maths lives in `ops`.

A row without a score (`scoring.scored_rows`: no reward scored it, or a function failed on it under
reward_errors=skip) is dropped: its `mask` is empty, so it has no reward, advantage or return, and it takes no
part in any whitening; the group estimators compare the scored rows of each group alone (`scored_groups`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import ops
from ..config import (
    AdvantageOptions,
    DistillConfig,
    DistillOptions,
    GRPOConfig,
    OnPolicyConfig,
    PPOConfig,
    ReinforceConfig,
    RewardShaping,
    RLOOConfig,
)
from ..distill_ops import reverse_kl_advantages
from ..errors import ConfigError
from ..rollout import RolloutBatch
from .scoring import OldLogprobs, scored_rows

EstimatorFunction = Callable[[AdvantageOptions, torch.Tensor, torch.Tensor, RolloutBatch, torch.Tensor],
                             tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator needs beyond the per-token rewards."""

    groups: bool = False  # compares the samples of a prompt: samples_per_prompt >= 2, sampling that varies
    greedy_baseline: bool = False  # the shaped score of each prompt's greedy answer (`batch.baseline_scores`)


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator as declared: its name (an `advantage_estimator` choice), function and needs."""

    name: str
    function: EstimatorFunction
    needs: EstimatorNeeds
    reads: type  # the config class of the stages that may name it (a subclass's too)

    def __call__(self, options: AdvantageOptions, rewards: torch.Tensor, mask: torch.Tensor, batch: RolloutBatch,
                 groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.function(options, rewards, mask, batch, groups)


ESTIMATORS: dict[str, Estimator] = {}


def estimator(name: str, *, reads: type = OnPolicyConfig, needs_groups: bool = False,
              needs_greedy_baseline: bool = False) -> Callable[[EstimatorFunction], EstimatorFunction]:
    """Register the decorated function in `ESTIMATORS` as `advantage_estimator=name`, with the config
    class of the stages that may name it (every on-policy stage's, unless it is one algorithm's) and its needs."""
    def register(function: EstimatorFunction) -> EstimatorFunction:
        ESTIMATORS[name] = Estimator(name, function, EstimatorNeeds(needs_groups, needs_greedy_baseline), reads)
        return function

    return register


@estimator("gae", reads=PPOConfig)
def gae_advantages(options: AdvantageOptions, rewards, mask, batch, _groups):
    """PPO: GAE over the per-token rewards with the value model (Table 7: gamma 1, lambda 0.95)."""
    return ops.gae(rewards, batch.values, mask, options.gamma, options.lam)


def scored_groups(scores: torch.Tensor, groups: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(B,) each row's score (0 where unscored), the sum of its group's scored rows' and their count: the group
    statistics of `ops`, over the rows a group has scores for. Groups must have two rows or more."""
    ops.require_groups_of_two(ops.group_sums(scores, groups)[1], "a group estimator")
    weight = scored.to(scores.dtype)
    kept = scores.where(scored, torch.zeros_like(scores))
    return kept, ops.group_sums(kept, groups)[0], ops.group_sums(weight, groups)[0]


def group_relative_over_scored(scores, groups, scored, scale_by_std: bool, eps: float = 1e-4) -> torch.Tensor:
    """`ops.group_relative_advantages` over each group's scored rows: 0 for an unscored row, and for every row
    of a group with fewer than two scored rows (nothing to compare it with)."""
    kept, sums, counts = scored_groups(scores, groups, scored)
    compared = scored & (counts >= 2)
    centered = (kept - sums / counts.clamp(min=1)).where(compared, torch.zeros_like(kept))
    if not scale_by_std:
        return centered
    variance = ops.group_sums(centered**2, groups)[0] / (counts - 1).clamp(min=1)
    return centered / (variance.sqrt() + eps)


def leave_one_out_over_scored(scores, groups, scored) -> torch.Tensor:
    """`ops.leave_one_out_advantages` over each group's scored rows: each scored row's score minus the mean of
    the other scored rows of its group; 0 for an unscored row and for a row with no other scored row."""
    kept, sums, counts = scored_groups(scores, groups, scored)
    others = counts - 1
    baseline = (sums - kept) / others.clamp(min=1)
    return (kept - baseline).where(scored & (others > 0), torch.zeros_like(kept))


@estimator("grpo", reads=GRPOConfig, needs_groups=True)
def grpo_advantages(options: AdvantageOptions, rewards, mask, batch, groups):
    """GRPO: the sequence reward minus its group's mean, over the group's std unless scale_rewards=false."""
    relative = group_relative_over_scored(rewards.sum(-1), groups, scored_rows(batch), options.scale_rewards)
    return ops.sequence_advantages(relative, mask)


@estimator("rloo", reads=RLOOConfig, needs_groups=True)
def rloo_advantages(_options: AdvantageOptions, rewards, mask, batch, groups):
    """RLOO: the sequence reward minus the mean reward of the other samples of its prompt."""
    return ops.sequence_advantages(leave_one_out_over_scored(rewards.sum(-1), groups, scored_rows(batch)), mask)


@estimator("reinforce-pp", reads=ReinforceConfig)
def reinforce_pp_advantages(options: AdvantageOptions, rewards, mask, _batch, _groups):
    """REINFORCE++: each token's return (its reward and every later one's), whitened over the whole
    batch's tokens."""
    returns = ops.returns_to_go(rewards, mask, options.gamma)
    return ops.masked_whiten(returns, mask), returns


@estimator("reinforce-pp-baseline", reads=ReinforceConfig, needs_groups=True)
def reinforce_pp_baseline_advantages(_options: AdvantageOptions, rewards, mask, batch, groups):
    """REINFORCE++-baseline: the sequence reward minus its group's mean, whitened over the whole
    batch's tokens."""
    relative = group_relative_over_scored(rewards.sum(-1), groups, scored_rows(batch), scale_by_std=False)
    centred, _ = ops.sequence_advantages(relative, mask)
    return ops.masked_whiten(centred, mask), centred


@estimator("remax", reads=ReinforceConfig, needs_greedy_baseline=True)
def remax_advantages(options: AdvantageOptions, rewards, mask, batch, _groups):
    """ReMax: each token's return minus the score of its prompt's greedy response (NaN, unscored, only where
    `mask` is empty)."""
    returns = ops.returns_to_go(rewards, mask, options.gamma)
    return (returns - batch.baseline_scores.nan_to_num().unsqueeze(1)) * mask, returns


@estimator("teacher", reads=DistillConfig)
def teacher_only_advantages(_options: AdvantageOptions, rewards, mask, _batch, _groups):
    """`rlhfkit distill`: no task reward, so no task advantage; the teacher's is added after
    (`with_teacher_advantages`)."""
    zeros = torch.zeros_like(rewards) * mask
    return zeros, zeros


def with_teacher_advantages(advantages: torch.Tensor, batch: RolloutBatch, trained: torch.Tensor,
                            distill: DistillOptions | None) -> torch.Tensor:
    """The task's advantages plus, with distill_loss=reverse-kl-advantage, the teacher's per-token advantage
    -distill_coef x (log pi_student - log pi_teacher) of each sampled token, discounted over the later ones
    (tinker's recipe adds the two alike); the task's alone otherwise."""
    if distill is None or not distill.per_token_advantage:
        return advantages
    return advantages + reverse_kl_advantages(
        batch.logprobs, batch.teacher_logprobs, trained, distill.coef, distill.discount
    )


def needs_of(estimator: str) -> EstimatorNeeds:
    """The needs of the estimator `advantage_estimator=estimator` names."""
    return ESTIMATORS[estimator].needs


def estimators_for(config: type) -> list[str]:
    """The estimators a stage whose config class is `config` may name, in registration order."""
    return [name for name, declared in ESTIMATORS.items() if issubclass(config, declared.reads)]


def check_estimator(config: type, *, estimator: str, samples_per_prompt: int, dynamic_sampling: bool,
                    temperature: float) -> None:
    """Refuse, as the config of a stage whose config class is `config` resolves, an estimator this stage does not
    have, and options that cannot give the estimator what it needs: a group estimator (and dynamic sampling,
    which compares a group's samples too) needs 2 or more samples per prompt, and it, like a greedy baseline,
    learns nothing from greedy samples, all alike."""
    accepted = estimators_for(config)
    if estimator not in accepted:
        raise ConfigError(f"advantage_estimator={estimator!r} is not accepted; choose one of: {', '.join(accepted)}")
    needs = needs_of(estimator)
    for needs_groups, what in ((dynamic_sampling, "dynamic_sampling=true"),
                               (needs.groups, f"advantage_estimator={estimator}")):
        if needs_groups and samples_per_prompt < 2:
            raise ConfigError(f"{what} compares the samples of a prompt: set samples_per_prompt to 2 or more")
    if temperature > 0:
        return
    if needs.greedy_baseline:
        alike = f"each response is its own greedy baseline (advantage_estimator={estimator})"
    elif dynamic_sampling or needs.groups:
        compared = ("dynamic_sampling=true drops every group" if dynamic_sampling
                    else f"advantage_estimator={estimator} compares them")
        alike = f"the samples_per_prompt={samples_per_prompt} responses to a prompt are identical ({compared})"
    else:
        return
    raise ConfigError(f"temperature={temperature:g} samples greedily: {alike}, so every advantage is 0 "
                      "and the run learns nothing; set temperature above 0 (e.g. 0.7)")


def shaped_scores(shaping: RewardShaping, raw: torch.Tensor, lengths: torch.Tensor,
                  has_eos: torch.Tensor) -> torch.Tensor:
    """(B,) what the advantages see of each response: its raw score minus the length penalty, the EOS
    trick (Detail 23), plus DAPO's overlong punishment."""
    scores = ops.length_penalised_scores(raw, lengths, shaping.length_penalty)
    scores = with_eos_trick(scores, has_eos, shaping)
    overlong = ops.overlong_penalty(lengths, shaping.max_response_length, shaping.overlong_buffer,
                                    shaping.overlong_penalty)
    return scores + overlong.to(scores.device)


def with_eos_trick(scores: torch.Tensor, has_eos: torch.Tensor, shaping: RewardShaping) -> torch.Tensor:
    """Detail 23 as configured: `missing_eos_score` for responses without an EOS, when eos_trick is on."""
    return ops.eos_trick(scores, has_eos, shaping.missing_eos_score) if shaping.eos_trick else scores


def row_groups(batch: RolloutBatch, group: int) -> torch.Tensor:
    """(B,) the group of each row: rows come in groups of samples_per_prompt (sample_responses)."""
    return torch.arange(batch.size, device=batch.mask.device) // group


def per_token_kl(batch: RolloutBatch, estimator: str) -> torch.Tensor:
    """(B, R) the KL estimate of each response token to the reference, 0 after EOS and at an episode's
    environment tokens."""
    return ops.kl_penalty(batch.logprobs, batch.ref_logprobs, estimator) * batch.trained_mask


def with_old_logprobs(batch: RolloutBatch, logprobs: torch.Tensor, kl_estimator: str) -> RolloutBatch:
    """The rollout with the old policy's log-probabilities the update's forward gave, and the KL from them."""
    batch = dataclasses.replace(batch, logprobs=logprobs * batch.trained_mask)
    return dataclasses.replace(batch, kl=per_token_kl(batch, kl_estimator))


def estimate_on_policy_tokens(options: AdvantageOptions, rewards: torch.Tensor, batch: RolloutBatch, mask: torch.Tensor,
                              trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) by the configured estimator over the policy's tokens (`trained`, within `mask`): in
    a multi-turn episode those tokens compacted into one sequence (`ops.compact_tokens`), the estimate put back
    in their columns, 0 at the environment's tokens."""
    estimate, groups = ESTIMATORS[options.estimator], row_groups(batch, options.samples_per_prompt)
    if batch.episodes is None:
        return estimate(options, rewards, mask, batch, groups)
    compacted, columns, kept = ops.compact_tokens(rewards, trained)
    values = ops.compact_tokens(batch.values, trained)[0] if batch.values is not None else None
    advantages, returns = estimate(options, compacted, kept, dataclasses.replace(batch, values=values), groups)
    width = rewards.size(1)
    return (ops.expand_tokens(advantages, columns, kept, width), ops.expand_tokens(returns, columns, kept, width))


def compute_advantages(batch: RolloutBatch, options: AdvantageOptions, kl_coef: float,
                       old_logprobs: OldLogprobs = "scoring") -> RolloutBatch:
    """Scores -> per-token rewards (equation 3) -> advantages and returns by the configured estimator,
    on the whole update's rollout. With kl_placement=loss the rewards carry the score alone and the KL
    enters the update's loss. In multi-turn episodes only the policy's tokens are rewarded and estimated
    (`estimate_on_policy_tokens`); the score sits on the episode's last token, which is the policy's. A
    row without a score (`scored_rows`) keeps the score NaN and is masked out of everything else. Where
    the update's forward gives the old log-probabilities (`old_logprobs="update"`), the rollout has none
    yet: the rewards carry no KL, which that source guarantees they would not (`ScoringPlan.of`), and
    `with_old_logprobs` adds the KL after the update."""
    scored = scored_rows(batch)
    mask, trained = batch.mask & scored.unsqueeze(1), batch.trained_mask & scored.unsqueeze(1)
    scores = shaped_scores(options.shaping, batch.raw_scores, batch.lengths, batch.has_eos).where(scored, torch.nan)
    kl = per_token_kl(batch, options.kl_estimator) if old_logprobs == "scoring" else None
    reward_kl = kl if kl is not None else torch.zeros_like(batch.ref_logprobs)
    beta = kl_coef if options.kl_placement == "reward" else 0.0
    rewards = ops.rlhf_rewards(scores.nan_to_num(), reward_kl, mask, beta)
    if options.whiten_rewards:  # Detail 24
        rewards = ops.masked_whiten(rewards, trained, shift_mean=False)
    advantages, returns = estimate_on_policy_tokens(options, rewards, batch, mask, trained)
    if options.whiten_advantages:  # Detail 25
        advantages = ops.masked_whiten(advantages, trained)
    advantages = with_teacher_advantages(advantages, batch, trained, options.distill)
    return dataclasses.replace(batch, scores=scores, kl=kl, rewards=rewards, advantages=advantages,
                               returns=returns)
