"""Scoring a rollout, its advantages, and the clipped update on it (Section 7, Details 22-25, Table 7).

    scores    = reward model at the EOS token and/or reward functions, weighted;
                -1 when there is no EOS                                             (Details 12, 23)
    rewards   = -beta * KL per token, plus the score at the EOS token itself      (Equation 3)
    advantages, returns = the algorithm's estimator (PPO: GAE with the value model) (Details 22, 25)
    K epochs x N minibatches of policy (and value) updates: the configured policy loss, aggregated
    as `loss_aggregation` says                                                    (Table 7)

The maths lives in `ops` and `policy_losses`. Under N processes each process scores its own rows;
advantages and every batch statistic are computed on the whole update's rollout
(`rollout.gather_rollout`), and each minibatch is drawn from the whole batch: every process computes
the gradient of its rows of the minibatch, each micro-batch's loss divided by the normaliser of the
whole minibatch (its tokens or its sequences), and the gradients are summed across processes before
the optimizer step. The update is therefore the one a single process would make on the same rollout
in one pass, up to floating-point summation order (tests/test_split_invariance.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from .. import ops
from ..config import GRPOConfig, OnPolicyConfig, PPOConfig, ReinforceConfig, RLOOConfig
from ..devices import autocast, model_device
from ..distributed import ONE_PROCESS
from ..generation import response_logprobs
from ..policy_losses import POLICY_LOSSES, ClipRange, aggregate, loss_units
from ..reward_models import ScalarModel
from ..scoring import scores_at_eos
from ..sharding import fsdp_modules, full_number
from ..trainers.run import build_optimizer, check_finite
from .algorithms import ValueOptions, algorithm_of
from .rewarding import PromptTexts, RewardSources
from .rollout import RolloutBatch, process_share


@dataclass
class OnPolicyModels:
    policy: torch.nn.Module  # trained
    reference: torch.nn.Module  # frozen copy of the starting (SFT) policy
    reward: ScalarModel | None  # frozen; None when reward functions alone score
    value: ScalarModel | None  # trained, when the algorithm has a critic (Detail 22: starts as the reward model)
    tokenizer: PreTrainedTokenizerBase
    sources: RewardSources | None = None  # reward functions and weights (None: the reward model alone)

    def reward_sources(self) -> RewardSources:
        return self.sources or RewardSources.model_only()

    def trained(self) -> list[torch.nn.Module]:
        return [m for m in (self.policy, self.value) if m is not None]

    def frozen(self) -> list[torch.nn.Module]:
        return [m for m in (self.reference, self.reward) if m is not None]


def policy_logprobs(policy, batch: RolloutBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    return response_logprobs(policy, batch.input_ids(), batch.attention_mask(), batch.context_length, temperature)


def value_estimates(value: ScalarModel, batch: RolloutBatch) -> torch.Tensor:
    """(B, R) V(state before each response token): the head's output at the position that predicts it."""
    per_position = value.per_token_scores(batch.input_ids(), batch.attention_mask())
    return per_position[:, batch.context_length - 1 : -1]


def reward_scores(reward: ScalarModel, batch: RolloutBatch) -> torch.Tensor:
    """(B,) reward-model scores read at each response's EOS (Detail 12; the last token when there is
    none), the query left padded (Detail 14): the same index equation 3 puts the score on."""
    return scores_at_eos(reward, batch.input_ids(), batch.attention_mask(), batch.context_length, batch.lengths)


def model_scores(models: OnPolicyModels, batch, cfg: OnPolicyConfig) -> torch.Tensor | None:
    """(B,) the reward model's scores of a sampled batch, or None without a reward model."""
    if models.reward is None:
        return None
    scored = batch.to(model_device(models.reward))
    return torch.cat([reward_scores(models.reward, scored.select(slice(i, i + cfg.forward_batch_size))).float().cpu()
                      for i in range(0, batch.size, cfg.forward_batch_size)])


def completion_texts(batch: RolloutBatch, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    return [tokenizer.decode(batch.responses[i][batch.mask[i]].tolist(), skip_special_tokens=True) for i in range(batch.size)]


def reward_components(models: OnPolicyModels, batch: RolloutBatch, model_scores: torch.Tensor | None, prompts: PromptTexts | None,
                      max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, C) reward components: the functions' then the reward model's, (B, F) failed rows);
    `batch.prompts` index `prompts`."""
    sources = models.reward_sources()
    columns, failed = [], torch.zeros(batch.size, 0, dtype=torch.bool)
    if len(sources.functions):
        if prompts is None:
            raise ValueError("reward functions need the prompts' texts and columns")
        scores, failed = sources.function_scores(prompts, batch.prompts.tolist(), completion_texts(batch, models.tokenizer),
                                                 batch.lengths.tolist(), batch.has_eos.tolist(), max_length)
        columns.append(scores)
    if model_scores is not None:
        columns.append(model_scores.float().cpu().unsqueeze(1))
    device = batch.responses.device
    return torch.cat(columns, dim=1).to(device), failed.to(device)


@torch.no_grad()
def score_rollout(models: OnPolicyModels, batch: RolloutBatch, cfg: OnPolicyConfig, precision: str,
                  prompts: PromptTexts | None = None) -> RolloutBatch:
    """Fill in the sampling-time log-probabilities, reference log-probabilities, values and scores,
    `forward_batch_size` rows at a time. The old log-probabilities come from the same forward
    function the update uses, so before any update the PPO ratio is exactly 1. Reward functions read
    the texts and columns of `prompts`, which `batch.prompts` index."""
    device = batch.responses.device
    frozen = model_device(models.reference)
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    for start in range(0, batch.size, cfg.forward_batch_size):
        part = batch.select(slice(start, start + cfg.forward_batch_size))
        with autocast(device, precision):
            parts["logprobs"].append(policy_logprobs(models.policy, part, cfg.temperature)[0])
            if models.value is not None:
                parts["values"].append(value_estimates(models.value, part).float())
        with autocast(frozen, precision):
            remote = part.to(frozen)  # the reference and reward models share the frozen device
            parts["ref_logprobs"].append(policy_logprobs(models.reference, remote, cfg.temperature)[0].to(device))
            if models.reward is not None:
                parts["model_scores"].append(reward_scores(models.reward, remote).float().to(device))
    filled = {k: torch.cat(v) for k, v in parts.items()}
    components, failed = reward_components(models, batch, filled.pop("model_scores", None), prompts, cfg.max_response_length)
    filled |= {"reward_components": components, "raw_scores": models.reward_sources().combine(components)}
    if failed.numel():
        filled["reward_failures"] = failed
    # Everything after EOS is masked out of every loss and metric; zero it here too so that no
    # stray number from a PAD position can leak into a sum.
    for key in ("logprobs", "ref_logprobs", "values"):
        if key in filled:
            filled[key] = filled[key] * batch.mask
    return dataclasses.replace(batch, **filled)


Estimator = Callable[[Any, torch.Tensor, torch.Tensor, RolloutBatch, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def gae_advantages(cfg: PPOConfig, rewards, mask, batch, _groups):
    """PPO: GAE over the per-token rewards with the value model (Table 7: gamma 1, lambda 0.95)."""
    return ops.gae(rewards, batch.values, mask, cfg.gamma, cfg.lam)


def grpo_advantages(cfg: GRPOConfig, rewards, mask, _batch, groups):
    """GRPO: the sequence reward minus its group's mean, over the group's std unless scale_rewards=false."""
    return ops.sequence_advantages(ops.group_relative_advantages(rewards.sum(-1), groups, cfg.scale_rewards), mask)


def rloo_advantages(_cfg: RLOOConfig, rewards, mask, _batch, groups):
    """RLOO: the sequence reward minus the mean reward of the other samples of its prompt."""
    return ops.sequence_advantages(ops.leave_one_out_advantages(rewards.sum(-1), groups), mask)


def reinforce_pp_advantages(cfg: ReinforceConfig, rewards, mask, _batch, _groups):
    """REINFORCE++: each token's return (its reward and every later one's), whitened over the whole batch's tokens."""
    returns = ops.returns_to_go(rewards, mask, cfg.gamma)
    return ops.masked_whiten(returns, mask), returns


def reinforce_pp_baseline_advantages(_cfg: ReinforceConfig, rewards, mask, _batch, groups):
    """REINFORCE++-baseline: the sequence reward minus its group's mean, whitened over the whole batch's tokens."""
    centred, _ = ops.sequence_advantages(ops.group_relative_advantages(rewards.sum(-1), groups, scale_by_std=False), mask)
    return ops.masked_whiten(centred, mask), centred


def remax_advantages(cfg: ReinforceConfig, rewards, mask, batch, _groups):
    """ReMax: each token's return minus the score of its prompt's greedy response."""
    returns = ops.returns_to_go(rewards, mask, cfg.gamma)
    return (returns - batch.baseline_scores.unsqueeze(1)) * mask, returns


ESTIMATORS: dict[str, Estimator] = {
    "gae": gae_advantages, "grpo": grpo_advantages, "rloo": rloo_advantages, "reinforce-pp": reinforce_pp_advantages,
    "reinforce-pp-baseline": reinforce_pp_baseline_advantages, "remax": remax_advantages,
}


def shaped_scores(cfg: OnPolicyConfig, raw: torch.Tensor, lengths: torch.Tensor, has_eos: torch.Tensor) -> torch.Tensor:
    """(B,) what the advantages see of each response: its raw score minus the length penalty, the EOS
    trick (Detail 23), plus DAPO's overlong punishment."""
    scores = ops.length_penalised_scores(raw, lengths, cfg.reward_length_penalty)
    scores = ops.eos_trick(scores, has_eos, cfg.missing_eos_score) if cfg.eos_trick else scores
    return scores + ops.overlong_penalty(lengths, cfg.max_response_length, cfg.overlong_buffer, cfg.overlong_penalty).to(scores.device)


def row_groups(batch: RolloutBatch, cfg: OnPolicyConfig) -> torch.Tensor:
    """(B,) the group of each row: rows come in groups of samples_per_prompt (sample_responses)."""
    return torch.arange(batch.size, device=batch.mask.device) // cfg.samples_per_prompt


def compute_advantages(batch: RolloutBatch, cfg: OnPolicyConfig, kl_coef: float) -> RolloutBatch:
    """Scores -> per-token rewards (equation 3) -> advantages and returns by the configured estimator,
    on the whole update's rollout. With kl_placement=loss the rewards carry the score alone and the KL
    enters the update's loss."""
    mask = batch.mask
    scores = shaped_scores(cfg, batch.raw_scores, batch.lengths, batch.has_eos)
    kl = ops.kl_penalty(batch.logprobs, batch.ref_logprobs, cfg.kl_estimator) * mask
    rewards, _ = ops.rlhf_rewards(scores, kl, mask, kl_coef if cfg.kl_placement == "reward" else 0.0)
    if cfg.whiten_rewards:  # Detail 24
        rewards = ops.masked_whiten(rewards, mask, shift_mean=False)
    advantages, returns = ESTIMATORS[cfg.advantage_estimator](cfg, rewards, mask, batch, row_groups(batch, cfg))
    if cfg.whiten_advantages:  # Detail 25
        advantages = ops.masked_whiten(advantages, mask)
    return dataclasses.replace(batch, scores=scores, kl=kl, rewards=rewards, advantages=advantages, returns=returns)


def sum_gradients_across_processes(models: list[torch.nn.Module], accelerator) -> None:
    """Each process holds the gradient of its rows' share of the minibatch loss; their sum is the
    gradient of the whole minibatch. One all-reduce over all gradients, flattened; a process whose
    rows took no part in this minibatch contributes zeros. A sharded model's gradients were already
    summed into their shards during the backward pass."""
    if accelerator.num_processes == 1:
        return
    params = [p for model in models if not fsdp_modules(model) for p in model.parameters() if p.requires_grad]
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)  # views of the one reduced buffer: no second copy
        offset += p.numel()


@dataclass
class Optimizers:
    policy: torch.optim.Optimizer
    policy_schedule: Any
    value: torch.optim.Optimizer | None
    value_schedule: Any

    def named_extra_states(self) -> dict[str, Any]:
        return {"value_optimizer": self.value, "value_scheduler": self.value_schedule} if self.value is not None else {}

    def step(self, models: OnPolicyModels, max_grad_norm: float, step_label: int, accelerator=ONE_PROCESS) -> dict[str, float]:
        sum_gradients_across_processes(models.trained(), accelerator)
        norms = {}
        pairs = [("policy", models.policy, self.policy), ("value", models.value, self.value)]
        for name, model, optimizer in pairs:
            if optimizer is None:
                continue
            norm = full_number(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf")))
            check_finite(step_label, f"{name} gradient norm", norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            norms[f"{name}/grad_norm"] = float(norm)
        return norms

    def advance_schedules(self) -> None:
        for schedule in (self.policy_schedule, self.value_schedule):
            if schedule is not None:
                schedule.step()


def build_optimizers(models: OnPolicyModels, cfg: OnPolicyConfig, num_updates: int) -> Optimizers:
    """AdamW (Table 7: eps 1e-5) for the policy and, when there is one, the value model, each with the
    learning-rate schedule stepped once per update (Table 7: linear decay to 0 over the run)."""
    policy_opt, policy_sched = build_optimizer(models.policy, cfg, num_updates)
    value_opt, value_sched = build_optimizer(models.value, cfg, num_updates) if models.value is not None else (None, None)
    return Optimizers(policy_opt, policy_sched, value_opt, value_sched)


class Averages:
    """Weighted means of per-micro-batch statistics over an update, over every process."""

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: torch.Tensor | float, weight: float) -> None:
        self.sums[key] += float(value) * weight
        self.weights[key] += weight

    def means(self, accelerator=ONE_PROCESS) -> dict[str, float]:
        keys = sorted(self.sums)
        totals = torch.tensor([[self.sums[k] for k in keys], [self.weights[k] for k in keys]], dtype=torch.float64)
        if accelerator.num_processes > 1:
            totals = accelerator.reduce(totals.to(accelerator.device), "sum").cpu()
        return {k: float(totals[0, i] / totals[1, i]) for i, k in enumerate(keys) if totals[1, i] > 0}


@dataclass(frozen=True)
class Objective:
    """What the update minimises, read from the config once: the policy loss and its clipping, how
    token losses aggregate (the KL and entropy terms aggregate alike), and which tokens count."""

    policy_loss: str
    clip: ClipRange | None
    dual_clip: float
    aggregation: str
    constant: float  # seq-mean-token-sum-norm's divisor
    mask_truncated: bool

    @classmethod
    def of(cls, cfg: OnPolicyConfig) -> Objective:
        return cls(cfg.policy_loss, ClipRange.of(cfg.clip_range, cfg.clip_range_high), cfg.dual_clip, cfg.loss_aggregation,
                   cfg.loss_normaliser or float(cfg.max_response_length), cfg.mask_truncated)

    def loss_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, R) the tokens whose losses count: every valid token, or with mask_truncated (DAPO's
        overlong filtering) none of a response cut before its EOS."""
        return batch.mask & batch.has_eos.unsqueeze(1) if self.mask_truncated else batch.mask

    def units(self, batch: RolloutBatch) -> torch.Tensor:
        """(B,) each row's share of its minibatch's normaliser (`policy_losses.loss_units`)."""
        return loss_units(self.loss_mask(batch), self.aggregation)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
        return aggregate(per_token, mask, self.aggregation, normaliser, self.constant)


def update_on_rollout(
    models: OnPolicyModels, optimizers: Optimizers, batch: RolloutBatch, cfg: OnPolicyConfig, update: int, precision: str,
    kl_coef: float, accelerator=ONE_PROCESS,
) -> dict[str, float]:
    """K epochs (Table 7: 4) over the whole update's rollout `batch` in N minibatches (Table 7: 1), one
    optimizer step per minibatch; this process runs the micro-batches of its own rows of each
    minibatch. The loss: the policy loss, plus kl_coef x KL to the reference (kl_placement=loss), minus
    entropy_coef x entropy, each aggregated over the minibatch as `loss_aggregation` says, plus
    vf_coef x value loss (PPO; a mean over the minibatch's tokens). Every normaliser is counted over
    the whole minibatch before it is split, so each micro-batch's loss is its exact share."""
    algorithm = algorithm_of(cfg)
    objective = Objective.of(cfg)
    device = batch.responses.device
    rng = np.random.default_rng([cfg.seed, update, 11])
    minibatch = batch.size // cfg.num_minibatches
    units, tokens = objective.units(batch), batch.mask.sum(-1).float()
    value_options = algorithm.value(cfg) if algorithm.value else None
    stats = Averages()
    grad_norms = Averages()
    lockstep = bool(fsdp_modules(models.policy))
    for _ in range(cfg.update_epochs):
        order = rng.permutation(batch.size)
        for start in range(0, batch.size, minibatch):
            rows = order[start : start + minibatch]
            normalisers = Normalisers(float(units[rows].sum()), float(tokens[rows].sum()))
            for own, counts in micro_batch_plan(rows, batch.size, cfg.micro_batch_size, accelerator, lockstep):
                picked = torch.as_tensor(own, device=device)
                share = normalisers.share(units[picked], tokens[picked]) if counts else None
                micro_loss(models, batch.select(picked), cfg, objective, value_options, precision, kl_coef, update, share, normalisers,
                           stats)
            for key, norm in optimizers.step(models, cfg.max_grad_norm, update, accelerator).items():
                grad_norms.add(key, norm, 1.0)
    means = stats.means(accelerator) | grad_norms.means()
    means["val/ratio_var"] = max(0.0, means.pop("ratio_squared") - means["val/ratio"] ** 2)
    return means


@dataclass(frozen=True)
class Normalisers:
    """A minibatch's normalisers, counted over all of it: the policy loss's units and the value loss's tokens."""

    units: float
    tokens: float

    def share(self, units: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
        """(policy, value) weights of a micro-batch with these rows in the minibatch's logged means."""
        return float(units.sum()) / max(self.units, 1e-8), float(tokens.sum()) / max(self.tokens, 1e-8)


def micro_batch_plan(rows: np.ndarray, batch_size: int, size: int, accelerator, lockstep: bool) -> list[tuple[np.ndarray, bool]]:
    """This process's rows of a minibatch in micro-batches of `size`, each with whether it counts.
    Processes hold different numbers of a shuffled minibatch's rows; with `lockstep` (sharded models,
    whose every forward and backward pass is a collective) each runs as many micro-batches as the
    busiest one, the extra ones on a row of the minibatch with weight 0."""
    def own_rows(process: int) -> np.ndarray:
        share = process_share(batch_size, process, accelerator.num_processes)
        return rows[(rows >= share.start) & (rows < share.stop)]

    own = own_rows(accelerator.process_index)
    plan = [(own[i : i + size], True) for i in range(0, len(own), size)]
    if lockstep:
        busiest = max(-(-len(own_rows(p)) // size) for p in range(accelerator.num_processes))
        plan += [(rows[:1], False)] * (busiest - len(plan))
    return plan


def micro_loss(models: OnPolicyModels, micro: RolloutBatch, cfg: OnPolicyConfig, objective: Objective,
               value_options: ValueOptions | None, precision: str, kl_coef: float, update: int, share: tuple[float, float] | None,
               normalisers: Normalisers, stats: Averages) -> None:
    """Forward and backward of one micro-batch: its exact share of the minibatch's loss. `share`: its
    weights in the logged means (None: a lockstep pass whose rows belong to another micro-batch, which
    adds nothing)."""
    counts = share is not None
    loss_mask = objective.loss_mask(micro) if counts else torch.zeros_like(micro.mask)
    with autocast(micro.responses.device, precision):
        logprobs, entropy = policy_logprobs(models.policy, micro, cfg.temperature)
        policy = POLICY_LOSSES[objective.policy_loss](logprobs, micro.logprobs, micro.advantages, micro.mask, objective.clip,
                                                      objective.dual_clip)
        terms = {"loss/policy": objective.aggregate(policy.per_token, loss_mask, normalisers.units)}
        if cfg.kl_placement == "loss":
            terms["loss/kl"] = kl_coef * objective.aggregate(ops.kl_loss(logprobs, micro.logprobs, micro.ref_logprobs, cfg.kl_estimator),
                                                             loss_mask, normalisers.units)
        if cfg.entropy_coef:
            terms["loss/entropy"] = -cfg.entropy_coef * objective.aggregate(entropy, loss_mask, normalisers.units)
        if value_options is not None:
            new_values = value_estimates(models.value, micro).float()
            value_loss, value_clipfrac = ops.ppo_value_loss(new_values, micro.values, micro.returns, micro.mask,
                                                            value_options.clip_range or None)
            value_tokens = float(micro.mask.sum()) if counts else 0.0  # value_loss is a mean over this micro-batch's tokens
            terms["loss/value"] = value_options.coef * value_loss * value_tokens / max(normalisers.tokens, 1e-8)
    loss = sum(terms.values())
    check_finite(update, "loss", loss.detach())
    loss.backward()
    if not counts:
        return
    weight, value_weight = share
    ratio = torch.exp(logprobs.detach() - micro.logprobs)
    if value_options is not None:
        stats.add("loss/value_avg", value_loss.detach(), value_weight)
        stats.add("val/clipfrac_avg", value_clipfrac, value_weight)
    if "loss/kl" in terms:
        stats.add("loss/kl_avg", ops.masked_mean(ops.kl_penalty(logprobs.detach(), micro.ref_logprobs, cfg.kl_estimator), micro.mask),
                  value_weight)
    # the policy loss as a mean per unit of this micro-batch: summed with its weights, the minibatch's loss
    stats.add("loss/policy_avg", terms["loss/policy"].detach() / max(weight, 1e-12), weight)
    stats.add("policy/clipfrac_avg", policy.clip_fraction, value_weight)
    stats.add("policy/approxkl_avg", policy.approx_kl, value_weight)
    stats.add("policy/entropy_avg", ops.masked_mean(entropy.detach(), micro.mask), value_weight)
    stats.add("val/ratio", ops.masked_mean(ratio, micro.mask), value_weight)
    stats.add("ratio_squared", ops.masked_mean(ratio**2, micro.mask), value_weight)


def rollout_metrics(batch: RolloutBatch, kl_coef: float) -> dict[str, float]:
    """The per-update curves of Figure 12 and seed 000 Stage 3, from the whole update's rollout."""
    mask, lengths = batch.mask, batch.lengths.float()
    kl_sum = batch.kl.sum(-1)
    non_score = -kl_coef * kl_sum  # also when the KL enters the loss instead of the reward
    metrics = {
        "objective/rlhf_reward": float((batch.scores + non_score).mean()),
        "objective/scores": float(batch.scores.mean()),
        "objective/raw_scores": float(batch.raw_scores.mean()),
        "objective/kl": float(kl_sum.mean()),
        "objective/non_score_reward": float(non_score.mean()),
        "objective/entropy": float((-batch.logprobs * mask).sum(-1).mean()),
        "objective/kl_coef": kl_coef,
        "response/length_mean": float(lengths.mean()),
        "response/eos_rate": float(batch.has_eos.float().mean()),
        "response/length_score_corr": float(ops.pearson(lengths, batch.scores)),
        "advantages/max": float(batch.advantages[mask].max()),
        "advantages/min": float(batch.advantages[mask].min()),
        "returns/mean": float(ops.masked_mean(batch.returns, mask)),
    }
    if bool(batch.has_eos.any()):  # the score of valid responses alone, apart from the EOS trick's constant
        metrics["objective/scores_with_eos"] = float(batch.raw_scores[batch.has_eos].mean())
    if batch.values is not None:
        metrics["val/mean"] = float(ops.masked_mean(batch.values, mask))
        metrics["val/explained_variance"] = float(ops.explained_variance(batch.values, batch.returns, mask))
    return metrics


def extreme_samples(batch: RolloutBatch, tokenizer, update: int, count: int) -> list[dict[str, Any]]:
    """The `count` highest- and lowest-scored episodes of the update, decoded, with their score, KL and
    advantage (the mean over the response's tokens)."""
    order = torch.argsort(batch.scores, descending=True).tolist()
    picks = [("highest", i) for i in order[:count]] + [("lowest", i) for i in order[::-1][:count]]
    rows = []
    for rank, i in picks:
        query = batch.query_ids[i][batch.query_mask[i].bool()].tolist()
        response = batch.responses[i][batch.mask[i]].tolist()
        rows.append({
            "step": update, "rank": rank, "score": float(batch.scores[i]), "raw_score": float(batch.raw_scores[i]),
            "kl": float(batch.kl[i].sum()), "advantage": float(ops.masked_mean(batch.advantages[i], batch.mask[i])),
            "length": len(response), "has_eos": bool(batch.has_eos[i]),
            "query": tokenizer.decode(query), "response": tokenizer.decode(response, skip_special_tokens=True),
        })
    return rows
