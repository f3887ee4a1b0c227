"""Scoring, the phase after sampling: what an on-policy stage optimises and what the update needs of
each sampled row, filled in by `score_rollout` (logged as `perf/scoring_s`).

    logprobs, ref_logprobs = the policy's and the frozen reference's log-probabilities of the
                             response tokens, from one forward pass each, at the sampling temperature
    values     = the value model's estimate before each response token (PPO)          (Detail 22)
    components = [f_1(prompts=, completions=, **columns), ..., f_n(...), reward model at EOS] (Detail 12)
    raw score  = sum_c reward_weights[c] * components[c]             (then the EOS trick, Detail 23)

Every component is kept on the rollout (`RolloutBatch.reward_components`) and logged on its own
(`rewards/<name>`), so a run shows what each reward bought. Rows a function failed on are counted per
function (`rewards/<name>_errors`) and reported with the prompt's source line (rlhfkit/rewards.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ..config import OnPolicyConfig
from ..data.examples import SFTExample, reward_prompt
from ..devices import autocast, model_device
from ..environments import check_environment
from ..errors import ConfigError, warn
from ..generation import completion_texts
from ..logprobs import response_logprobs, shared_response_logprobs
from ..reward_models import ScalarModel
from ..rewards import Prompt, RewardError, RewardFunctions
from ..rollout import RolloutBatch
from ..scoring import scores_at_eos
from ..shared_rows import SharedRows, fall_back, pack_groups, shared_rows_obstacle

REWARD_MODEL = "reward_model"
ENVIRONMENT = "environment"
REPORTED_ERRORS = 5  # per scoring call: the rest are counted, not printed


@dataclass
class PromptTexts:
    """What reward functions read about each prompt: the prompt (`reward_prompt`), dataset columns and source."""

    prompts: list[Prompt]
    columns: list[dict]
    where: list[str]

    @classmethod
    def of(cls, examples: list[SFTExample]) -> PromptTexts:
        return cls(
            [reward_prompt(e) for e in examples],
            [e.record.columns for e in examples],
            [e.record.where for e in examples],
        )


def rollout_columns(batch: RolloutBatch, max_length: int) -> dict[str, Any]:
    """The arguments every reward-function call is given about the sampled responses (rewards.ROLLOUT_COLUMNS).
    `completion_ids` holds each response's tokens up to its EOS, EOS included, as TRL's trainers pass them."""
    lengths = batch.lengths.tolist()
    responses = batch.responses.cpu()
    return {
        "completion_ids": [responses[i, :n].tolist() for i, n in enumerate(lengths)],
        "completion_lengths": lengths,
        "has_eos": batch.has_eos.tolist(),
        "max_completion_length": max_length,
    }


@dataclass
class RewardSources:
    """The configured reward functions, whether a reward model scores too, and each component's weight."""

    functions: RewardFunctions
    has_model: bool
    weights: list[float]
    # by function: what went wrong on its last failed row
    last_problem: dict[str, str] = field(default_factory=dict)
    has_environment: bool = False  # the episodes' environment rewards their ends (`Environment.has_reward`)

    @classmethod
    def from_config(cls, cfg: OnPolicyConfig) -> RewardSources:
        environment = check_environment(cfg.environment, cfg.environment_args)
        has_environment = environment is not None and environment.has_reward
        if not cfg.reward_functions and not cfg.reward_model and not has_environment:
            raise ConfigError(
                "nothing to optimise: give reward_model= (a reward model folder) and/or "
                "reward_functions= "
                "(e.g. gsm8k,format; see rlhfkit/rewards.py)"
            )
        functions = RewardFunctions.from_specs(
            cfg.reward_functions, cfg.reward_error_score, cfg.stop_on_reward_error, cfg.reward_timeout
        )
        sources = cls(functions, bool(cfg.reward_model), [], has_environment=has_environment)
        count = len(sources.names)
        sources.weights = list(cfg.reward_weights) or [1.0] * count
        if len(sources.weights) != count:
            raise ConfigError(
                f"reward_weights has {len(sources.weights)} values for {count} rewards ({', '.join(sources.names)}): "
                "give one per reward function, then one for the environment when it rewards episodes, then one "
                "for the reward model"
            )
        return sources

    @classmethod
    def model_only(cls) -> RewardSources:
        return cls(RewardFunctions([], []), True, [1.0])

    @property
    def names(self) -> list[str]:
        """The components in their order: the functions', the environment's, the reward model's."""
        return self.functions.names + [ENVIRONMENT] * self.has_environment + [REWARD_MODEL] * self.has_model

    def function_scores(
        self, prompts: PromptTexts, rows: list[int], completions: list[str], rollout: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, F) scores, (B, F) bool: the row failed) of the reward functions on completions of
        prompts `rows`, given the `rollout_columns`; failures are printed (the first few) and flagged for
        counting."""
        keys = set().union(*(prompts.columns[i] for i in rows))
        columns = {key: [prompts.columns[i].get(key) for i in rows] for key in keys} | rollout
        where = [prompts.where[i] for i in rows]
        scored = self.functions.score([prompts.prompts[i] for i in rows], completions, columns, where)
        scores = torch.tensor(scored, dtype=torch.float32).reshape(len(self.functions), len(rows)).T
        failed = torch.zeros_like(scores, dtype=torch.bool)
        errors = self.functions.take_errors()
        for error in errors:
            failed[error.row, self.functions.names.index(error.function)] = True
            self.last_problem[error.function] = error.problem
        report_errors(errors)
        return scores, failed

    def check_prompts(self, prompts: PromptTexts) -> None:
        """Refuse, before training, prompts that lack a column a reward function needs."""
        self.functions.check_columns(prompts.columns, prompts.where)

    def stop_if_all_failed(self, failed: torch.Tensor | None, update: int) -> None:
        """Stop, in one line, at an update where a function failed on every row (the (B, F) `failed`):
        scores that are all reward_error_score teach the policy nothing about that function."""
        if failed is None or not failed.numel():
            return
        for name, all_failed in zip(self.functions.names, failed.all(dim=0).tolist(), strict=True):
            if all_failed:
                last = self.last_problem.get(name, "see the warnings above")
                raise ConfigError(
                    f"reward function {name!r} failed on all {failed.size(0)} rows of update "
                    f"{update} (the last: {last}): the run would learn from reward_error_score "
                    "alone: fix the function, then run again"
                )

    def combine(self, components: torch.Tensor) -> torch.Tensor:
        """(B,) the weighted sum of the (B, C) components."""
        return components @ torch.tensor(self.weights, dtype=components.dtype, device=components.device)


def report_errors(errors: list[RewardError]) -> None:
    for error in errors[:REPORTED_ERRORS]:
        warn(error.line())
    if len(errors) > REPORTED_ERRORS:
        warn(
            f"{len(errors) - REPORTED_ERRORS} more reward-function failures in this batch (counted in "
            "rewards/<name>_errors)"
        )


def component_metrics(
    names: list[str], components: torch.Tensor, failed: torch.Tensor | None, prefix: str = "rewards/"
) -> dict[str, float]:
    """The mean of each component and, for reward functions, the number of rows it failed on."""
    metrics = {f"{prefix}{name}": float(components[:, c].mean()) for c, name in enumerate(names)}
    if failed is not None:
        functions = names[: failed.size(1)]
        metrics |= {f"{prefix}{name}_errors": float(failed[:, c].sum()) for c, name in enumerate(functions)}
    return metrics


@dataclass
class OnPolicyModels:
    policy: torch.nn.Module  # trained
    reference: torch.nn.Module  # frozen copy of the starting (SFT) policy
    reward: ScalarModel | None  # frozen; None when reward functions alone score
    value: ScalarModel | None  # trained, when the algorithm has a critic (Detail 22: from the reward model)
    tokenizer: PreTrainedTokenizerBase
    sources: RewardSources | None = None  # reward functions and weights (None: the reward model alone)

    def reward_sources(self) -> RewardSources:
        return self.sources or RewardSources.model_only()

    def trained(self) -> list[torch.nn.Module]:
        return [m for m in (self.policy, self.value) if m is not None]

    def frozen(self) -> list[torch.nn.Module]:
        return [m for m in (self.reference, self.reward) if m is not None]


def shares_prefix(model: torch.nn.Module | None, cfg: OnPolicyConfig, rows_per_pass: int, option: str) -> bool:
    """Whether `model`'s passes over `rows_per_pass` rollout rows read each group's query once (shared
    rows, `rlhfkit/shared_rows.py`): for grouped methods, unless shared_prefix=off, the passes would
    split a group, or the model cannot take the rows' mask (the reason logged once)."""
    group = cfg.samples_per_prompt
    if model is None or group == 1 or cfg.shared_prefix == "off":
        return False
    obstacle = shared_rows_obstacle(model)
    if obstacle is None and rows_per_pass % group:
        obstacle = f"{option}={rows_per_pass} is not a multiple of samples_per_prompt={group}: it would split groups"
    if obstacle is not None:
        fall_back(model, obstacle)
    return obstacle is None


def reuses_update_forward(cfg: OnPolicyConfig) -> bool:
    """Whether the old policy's log-probabilities can come from the update's own forward instead of a
    pass of their own at scoring (TRL does this): only when every row's first update forward runs
    before any optimizer step (one epoch, one minibatch), and nothing before the update needs them
    (the KL enters the loss, or has no weight in the reward)."""
    kl_free_rewards = cfg.kl_placement == "loss" or (cfg.kl_coef == 0 and not cfg.adaptive_kl)
    return cfg.reuse_update_forward and cfg.update_epochs == 1 and cfg.num_minibatches == 1 and kl_free_rewards


def whole_groups(rows: int, group: int) -> int:
    """`rows` rounded down to whole groups of `group`, at least one group."""
    return max(group, rows - rows % group)


def pack_rollout(batch: RolloutBatch, group: int) -> SharedRows:
    return pack_groups(batch.query_ids, batch.query_mask, batch.responses, batch.mask, group)


def policy_logprobs(
    policy, batch: RolloutBatch, temperature: float, shared: SharedRows | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) log-probabilities and entropies of the rollout's responses; from `shared` rows when given."""
    if shared is not None:
        return shared_response_logprobs(policy, shared, batch.responses, temperature)
    return response_logprobs(policy, batch.input_ids(), batch.attention_mask(), batch.context_length, temperature)


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
    def of(cls, models: OnPolicyModels, cfg: OnPolicyConfig, rows_per_pass: int, option: str) -> RowLayout:
        reward = models.reward if isinstance(models.reward, ScalarModel) else None  # an implicit reward reads pairs
        return cls(
            *(shares_prefix(m, cfg, rows_per_pass, option) for m in (models.policy, models.reference, models.value)),
            shares_prefix(reward, cfg, rows_per_pass, option),
        )

    def __bool__(self) -> bool:
        return self.policy or self.reference or self.value or self.reward

    def rows_for(self, model: str, shared: SharedRows | None) -> SharedRows | None:
        """`shared` for a model ("policy", "reference", "value", "reward") that reads shared rows, else None."""
        return shared if getattr(self, model) else None


def model_scores(models: OnPolicyModels, batch, cfg: OnPolicyConfig) -> torch.Tensor | None:
    """(B,) the reward model's scores of a sampled batch, or None without a reward model."""
    if models.reward is None:
        return None
    scored = batch.to(model_device(models.reward))
    step = cfg.forward_batch_size
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
    """((B, C) reward components: the functions' then the reward model's, (B, F) failed rows);
    `batch.prompts` index `prompts`."""
    sources = models.reward_sources()
    columns, failed = [], torch.zeros(batch.size, 0, dtype=torch.bool)
    if len(sources.functions):
        if prompts is None:
            raise ValueError("reward functions need the prompts' texts and columns")
        completions = completion_texts(batch, models.tokenizer)
        scores, failed = sources.function_scores(
            prompts, batch.prompts.tolist(), completions, rollout_columns(batch, max_length)
        )
        columns.append(scores)
    if sources.has_environment:
        rewards = batch.env_rewards if batch.env_rewards is not None else torch.zeros(batch.size)
        columns.append(rewards.float().cpu().unsqueeze(1))
    if model_scores is not None:
        columns.append(model_scores.float().cpu().unsqueeze(1))
    device = batch.responses.device
    return torch.cat(columns, dim=1).to(device), failed.to(device)


@torch.no_grad()
def score_rollout(
    models: OnPolicyModels, batch: RolloutBatch, cfg: OnPolicyConfig, precision: str, prompts: PromptTexts | None = None
) -> RolloutBatch:
    """Fill in the sampling-time log-probabilities, reference log-probabilities, values and scores,
    `forward_batch_size` rows at a time (whole groups, each group's query read once where the models
    allow: `RowLayout`). The old log-probabilities come from the same forward function the update
    uses, so before any update the PPO ratio is exactly 1; where the update's own forward can give
    them (`reuses_update_forward`), they are left to it. Reward functions read the texts and columns
    of `prompts`, which `batch.prompts` index."""
    device = batch.responses.device
    frozen = model_device(models.reference)
    step = whole_groups(cfg.forward_batch_size, cfg.samples_per_prompt)
    layout = RowLayout.of(models, cfg, step, "forward_batch_size")
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    old_policy_pass = not reuses_update_forward(cfg)
    for start in range(0, batch.size, step):
        part = batch.select(slice(start, start + step))
        shared = pack_rollout(part, cfg.samples_per_prompt) if layout else None
        with autocast(device, precision):
            if old_policy_pass:
                logprobs, _ = policy_logprobs(models.policy, part, cfg.temperature, layout.rows_for("policy", shared))
                parts["logprobs"].append(logprobs)
            if models.value is not None:
                parts["values"].append(value_estimates(models.value, part, layout.rows_for("value", shared)).float())
        with autocast(frozen, precision):
            remote = part.to(frozen)  # the reference and reward models share the frozen device
            remote_shared = shared.to(frozen) if shared is not None else None
            reference, _ = policy_logprobs(
                models.reference, remote, cfg.temperature, layout.rows_for("reference", remote_shared)
            )
            parts["ref_logprobs"].append(reference.to(device))
            if models.reward is not None:
                scores = reward_scores(models.reward, remote, layout.rows_for("reward", remote_shared))
                parts["model_scores"].append(scores.float().to(device))
    filled = {k: torch.cat(v) for k, v in parts.items()}
    scores = filled.pop("model_scores", None)
    components, failed = reward_components(models, batch, scores, prompts, cfg.max_response_length)
    filled |= {"reward_components": components, "raw_scores": models.reward_sources().combine(components)}
    if failed.numel():
        filled["reward_failures"] = failed
    # Everything after EOS, and an episode's environment tokens, is masked out of every loss and metric;
    # zero it here too so that no stray number from a PAD or an environment position can leak into a sum.
    for key in ("logprobs", "ref_logprobs", "values"):
        if key in filled:
            filled[key] = filled[key] * batch.trained_mask
    return dataclasses.replace(batch, **filled)
