"""Scoring, the phase after sampling: what an on-policy stage optimises and what the update needs of
each sampled row, filled in by `score_rollout` (logged as `perf/scoring_s`).

    logprobs, ref_logprobs = the policy's and the frozen reference's log-probabilities of the
                             response tokens, from one forward pass each, at the sampling temperature
    values     = the value model's estimate before each response token (PPO)          (Detail 22)
    components = [f_1(prompts=, completions=, **columns), ..., f_n(...), reward model at EOS] (Detail 12)
    raw score  = sum_c reward_weights[c] * components[c], over those that scored the row  (then Detail 23)

Every component is kept on the rollout (`RolloutBatch.reward_components`, NaN where a function returned
None: it does not score that row) and logged on its own (`rewards/<name>`), so a run shows what each reward
bought. Rows a function failed on are counted per function (`rewards/<name>_errors`) and reported with the
prompt's source line (rlhfkit/rewards.py). A row no component scored, or one a function failed on under
reward_errors=skip, has a NaN raw score: it is dropped from the update (`scored_rows`; reward_sources.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedTokenizerBase

from ..devices import autocast, model_device
from ..environments import EpisodePlan
from ..generation import completion_texts
from ..logprobs import HeadInputs, pad_token_of, response_head_inputs, shared_response_head_inputs
from ..reward_models import ScalarModel
from ..rollout import RolloutBatch
from ..scoring import scores_at_eos
from ..shared_rows import SharedRows, pack_groups, reads_shared_rows
from .distillation import Teacher
from .reward_sources import PromptTexts, RewardSources, component_metrics, rollout_columns

__all__ = ["PromptTexts", "RewardSources", "component_metrics", "rollout_columns"]  # defined in reward_sources.py

@dataclass
class OnPolicyModels:
    policy: torch.nn.Module  # trained
    reference: torch.nn.Module  # frozen copy of the starting (SFT) policy
    reward: ScalarModel | None  # frozen; None when reward functions alone score
    value: ScalarModel | None  # trained, when the algorithm has a critic (Detail 22: from the reward model)
    tokenizer: PreTrainedTokenizerBase
    sources: RewardSources | None = None  # reward functions and weights (None: the reward model alone)
    episodes: EpisodePlan | None = None  # the run's multi-turn episodes (None: single responses)
    teacher: Teacher | None = None  # frozen; on-policy distillation's teacher (None: no distillation)

    def reward_sources(self) -> RewardSources:
        return self.sources or RewardSources.model_only()

    def trained(self) -> list[torch.nn.Module]:
        return [m for m in (self.policy, self.value) if m is not None]

    def frozen(self) -> list[torch.nn.Module]:
        teacher = self.teacher.model if self.teacher is not None else None
        return [m for m in (self.reference, self.reward, teacher) if m is not None]


def shares_prefix(model: torch.nn.Module | None, shared_prefix: str, group: int, rows_per_pass: int,
                  option: str) -> bool:
    """Whether `model`'s passes over `rows_per_pass` rollout rows read each `group` rows' query once (shared
    rows, `rlhfkit/shared_rows.py`): for grouped methods, unless shared_prefix=off, the passes would
    split a group, or the model cannot take the rows' mask (the reason logged once)."""
    if model is None or group == 1:
        return False
    split = f"{option}={rows_per_pass} is not a multiple of samples_per_prompt={group}: it would split groups"
    return reads_shared_rows(model, shared_prefix, split if rows_per_pass % group else None)


def whole_groups(rows: int, group: int) -> int:
    """`rows` rounded down to whole groups of `group`, at least one group."""
    return max(group, rows - rows % group)


def pack_rollout(batch: RolloutBatch, group: int) -> SharedRows:
    return pack_groups(batch.query_ids, batch.query_mask, batch.responses, batch.mask, group)


def policy_head_inputs(policy, batch: RolloutBatch, shared: SharedRows | None = None) -> HeadInputs:
    """What the policy's next-token distributions at the rollout's response positions are formed from (B, R, ...);
    from `shared` rows when given."""
    if shared is not None:
        return shared_response_head_inputs(policy, shared, batch.responses)
    return response_head_inputs(policy, batch.input_ids(), batch.attention_mask(), batch.context_length)


def policy_logprobs(
    policy, batch: RolloutBatch, temperature: float, shared: SharedRows | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) log-probabilities and entropies of the rollout's responses; from `shared` rows when given."""
    inputs = policy_head_inputs(policy, batch, shared)
    return inputs.logprobs_entropy(batch.responses, temperature, pad_token_of(policy))


def value_estimates(value: ScalarModel, batch: RolloutBatch, shared: SharedRows | None = None) -> torch.Tensor:
    """(B, R) V(state before each response token): the head's output at the position that predicts it."""
    if shared is not None:
        return value.shared_per_token_scores(shared)
    per_position = value.per_token_scores(batch.input_ids(), batch.attention_mask())
    return per_position[:, batch.context_length - 1 : -1]


def reward_scores(reward: ScalarModel, batch: RolloutBatch, shared: SharedRows | None = None) -> torch.Tensor:
    """(B,) reward-model scores read at each response's EOS (Detail 12; the last token when there is
    none), the query left padded (Detail 14): the same index equation 3 puts the score on."""
    if shared is not None:
        return reward.shared_scores(shared, batch.mask)
    return scores_at_eos(reward, batch.input_ids(), batch.attention_mask(), batch.context_length, batch.lengths)


@dataclass(frozen=True)
class RowLayout:
    """Which of a rollout's passes read shared rows (`shares_prefix`), decided per model."""

    policy: bool
    reference: bool
    value: bool
    reward: bool

    @classmethod
    def of(cls, models: OnPolicyModels, shared_prefix: str, group: int, rows_per_pass: int, option: str) -> RowLayout:
        """`shared_prefix=` decided for each model's passes over `rows_per_pass` rows (`option` names them)."""
        reward = models.reward if isinstance(models.reward, ScalarModel) else None  # an implicit reward reads pairs
        return cls(*(
            shares_prefix(m, shared_prefix, group, rows_per_pass, option)
            for m in (models.policy, models.reference, models.value, reward)
        ))

    def __bool__(self) -> bool:
        return self.policy or self.reference or self.value or self.reward

    def rows_for(self, model: str, shared: SharedRows | None) -> SharedRows | None:
        """`shared` for a model ("policy", "reference", "value", "reward") that reads shared rows, else None."""
        return shared if getattr(self, model) else None


OldLogprobs = Literal["scoring", "update"]


@dataclass(frozen=True)
class ScoringPlan:
    """How scoring reads every rollout of a run, decided once (`trainer.scoring_plan`, part of the trainer's
    `update.UpdatePlan`)."""

    rows: int  # rows per forward pass: forward_batch_size in whole groups
    group: int  # samples_per_prompt: a prompt's rows, consecutive
    temperature: float  # the sampling temperature, which every log-probability is taken at
    max_response_length: int  # what reward functions are told a response may reach
    layout: RowLayout  # which models' passes read shared rows
    # where the old policy's log-probabilities come from: a policy pass of their own here ("scoring"),
    # or the update's first forward ("update", reuse_update_forward, as TRL does)
    old_logprobs: OldLogprobs


def model_scores(models: OnPolicyModels, batch, rows_per_pass: int) -> torch.Tensor | None:
    """(B,) the reward model's scores of a sampled batch, `rows_per_pass` rows a pass (forward_batch_size), or
    None without a reward model."""
    if models.reward is None:
        return None
    scored = batch.to(model_device(models.reward))
    step = rows_per_pass
    return torch.cat(
        [
            reward_scores(models.reward, scored.select(slice(i, i + step))).float().cpu()
            for i in range(0, batch.size, step)
        ]
    )


def reward_components(
    models: OnPolicyModels,
    batch: RolloutBatch,
    model_scores: torch.Tensor | None,
    prompts: PromptTexts | None,
    max_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, C) reward components: the functions' (NaN where one scored no value), the environment's, the reward
    model's; (B, F) failed rows); `batch.prompts` index `prompts`."""
    sources = models.reward_sources()
    columns, failed = [], torch.zeros(batch.size, 0, dtype=torch.bool)
    if len(sources.functions):
        if prompts is None:
            raise ValueError("reward functions need the prompts' texts and columns")
        completions = completion_texts(batch, models.tokenizer)
        scores, failed = sources.function_scores(prompts, batch, completions, max_length)
        columns.append(scores)
    if sources.has_environment:
        rewards = batch.episodes.env_rewards if batch.episodes is not None else torch.zeros(batch.size)
        columns.append(rewards.float().cpu().unsqueeze(1))
    if model_scores is not None:
        columns.append(model_scores.float().cpu().unsqueeze(1))
    device = batch.responses.device
    if not columns:  # a distillation teacher's run without a task reward: no component
        return torch.zeros(batch.size, 0, device=device), failed.to(device)
    return torch.cat(columns, dim=1).to(device), failed.to(device)


def scored_rows(batch: RolloutBatch) -> torch.Tensor:
    """(B,) the rows the update learns from: those with a raw score (`RewardSources.combine`) and, for ReMax,
    a scored greedy baseline. The others take no part in the loss, the group baselines or any whitening. Rows
    given without raw scores (not scored here) all count."""
    if batch.raw_scores is None:
        return torch.ones(batch.mask.size(0), dtype=torch.bool, device=batch.mask.device)
    scored = ~batch.raw_scores.isnan()
    return scored if batch.baseline_scores is None else scored & ~batch.baseline_scores.isnan()


@torch.no_grad()
def score_rollout(
    models: OnPolicyModels, batch: RolloutBatch, plan: ScoringPlan, precision: str, prompts: PromptTexts | None = None
) -> RolloutBatch:
    """Fill in the sampling-time log-probabilities, reference log-probabilities, values and scores,
    `plan.rows` rows at a time (whole groups, each group's query read once where the models allow:
    `plan.layout`). The old log-probabilities come from the same forward function the update uses, so
    before any update the PPO ratio is exactly 1; where the plan takes them from the update's own
    forward (`plan.old_logprobs == "update"`), they are left to it. Reward functions read the texts and
    columns of `prompts`, which `batch.prompts` index."""
    device = batch.responses.device
    frozen = model_device(models.reference)
    layout, parts = plan.layout, defaultdict(list)
    for start in range(0, batch.size, plan.rows):
        part = batch.select(slice(start, start + plan.rows))
        shared = pack_rollout(part, plan.group) if layout else None
        with autocast(device, precision):
            if plan.old_logprobs == "scoring":
                logprobs, _ = policy_logprobs(models.policy, part, plan.temperature, layout.rows_for("policy", shared))
                parts["logprobs"].append(logprobs)
            if models.value is not None:
                parts["values"].append(value_estimates(models.value, part, layout.rows_for("value", shared)).float())
        with autocast(frozen, precision):
            remote = part.to(frozen)  # the reference and reward models share the frozen device
            remote_shared = shared.to(frozen) if shared is not None else None
            reference, _ = policy_logprobs(
                models.reference, remote, plan.temperature, layout.rows_for("reference", remote_shared)
            )
            parts["ref_logprobs"].append(reference.to(device))
            if models.teacher is not None:  # each row once, unshared (self-distillation's queries differ)
                teacher, features = models.teacher.score(remote)
                parts["teacher_logprobs"].append(teacher.to(device))
                if features is not None:
                    parts["teacher_features"].append(features.to(device))
            if models.reward is not None:
                scores = reward_scores(models.reward, remote, layout.rows_for("reward", remote_shared))
                parts["model_scores"].append(scores.float().to(device))
    filled = {k: torch.cat(v) for k, v in parts.items()}
    scores = filled.pop("model_scores", None)
    components, failed = reward_components(models, batch, scores, prompts, plan.max_response_length)
    sources = models.reward_sources()
    if len(sources.functions):  # a training rollout: what the functions logged is the update's
        sources.keep_logs()
    filled |= {"reward_components": components, "raw_scores": sources.combine(components, failed)}
    if failed.numel():
        filled["reward_failures"] = failed
    # Everything after EOS, and an episode's environment tokens, is masked out of every loss and metric;
    # zero it here too so that no stray number from a PAD or an environment position can leak into a sum.
    for key in ("logprobs", "ref_logprobs", "teacher_logprobs", "values"):
        if key in filled:
            filled[key] = filled[key] * batch.trained_mask
    return dataclasses.replace(batch, **filled)
