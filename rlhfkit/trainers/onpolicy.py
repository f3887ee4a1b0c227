"""The on-policy loop PPO uses, and GRPO and RLOO will (Section 7, Details 20-25, Table 7).

One update, as the paper's pseudocode reads:

    prompts   = next batch of SFT prompts, reshuffled each time they are used up   (Detail 21)
    responses = sample a fixed budget of tokens at temperature T, cut after the first EOS
    scores    = reward model at the EOS token; -1 when there is no EOS            (Details 12, 23)
    rewards   = -beta * KL per token, plus the score at the EOS token itself      (Equation 3)
    advantages, returns = estimator by name (PPO: GAE with the value model)        (Details 22, 25)
    K epochs x N minibatches of clipped policy (and value) updates                (Table 7)

The maths lives in `ops`; this module moves tensors between the models and keeps the books:
checkpoints with exact resume, metrics, samples and timings. Which estimator runs is a config
value looked up in `ops.ADVANTAGE_ESTIMATORS`; the value model exists only when it needs one.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from .. import ops
from ..checkpoint import load_training_state, save_checkpoint
from ..config import ConfigError, OnPolicyConfig
from ..data.collate import left_pad_queries
from ..devices import autocast, evaluation_mode, model_device
from ..generation import SamplingParams, generate, response_logprobs
from ..models import ScalarModel, enable_activation_checkpointing
from ..preemption import StopSignal, exit_after_checkpoint, resume_command
from ..tracking import Tracker, append_jsonl, drop_rows_after
from .engine import autocast_precision, build_optimizer, check_finite

SAMPLES_FILE = "samples.jsonl"


@dataclass
class OnPolicyModels:
    policy: torch.nn.Module  # trained
    reference: torch.nn.Module  # frozen copy of the starting (SFT) policy
    reward: ScalarModel  # frozen
    value: ScalarModel | None  # trained, when the estimator needs one (Detail 22: starts as the reward model)
    tokenizer: PreTrainedTokenizerBase


@dataclass
class RolloutBatch:
    """One update's episodes. B rows; queries left padded to Q columns, responses R columns."""

    prompts: torch.Tensor  # (B,) index of each row's prompt
    query_ids: torch.Tensor  # (B, Q)
    query_mask: torch.Tensor  # (B, Q)
    responses: torch.Tensor  # (B, R) cut after the first EOS, PAD after it
    mask: torch.Tensor  # (B, R) bool: tokens up to and including EOS
    has_eos: torch.Tensor  # (B,)
    logprobs: torch.Tensor | None = None  # (B, R) policy at sampling time (the "old" policy)
    ref_logprobs: torch.Tensor | None = None  # (B, R) frozen reference policy
    values: torch.Tensor | None = None  # (B, R) value model at sampling time
    raw_scores: torch.Tensor | None = None  # (B,) reward model
    scores: torch.Tensor | None = None  # (B,) after the EOS trick
    kl: torch.Tensor | None = None  # (B, R) per-token KL estimate
    rewards: torch.Tensor | None = None  # (B, R) equation 3
    advantages: torch.Tensor | None = None  # (B, R)
    returns: torch.Tensor | None = None  # (B, R)

    @property
    def size(self) -> int:
        return self.responses.size(0)

    @property
    def context_length(self) -> int:
        return self.query_ids.size(1)

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.responses], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.mask.to(self.query_mask.dtype)], dim=1)

    def map_tensors(self, fn) -> RolloutBatch:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return RolloutBatch(**{k: (fn(v) if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})

    def select(self, rows: torch.Tensor | np.ndarray | slice) -> RolloutBatch:
        """The same fields for a subset of rows (columns unchanged, so every row is computed alike)."""
        return self.map_tensors(lambda v: v[rows])

    def to(self, device: torch.device) -> RolloutBatch:
        return self.map_tensors(lambda v: v.to(device))


def prompt_indices(num_prompts: int, count: int, seed: int, start: int) -> np.ndarray:
    """Detail 21: prompts `start .. start+count` of an endless stream that walks through a fresh
    permutation of the prompts each time the previous one is used up (sampling without replacement).
    A function of (seed, position) only, so a resumed run draws exactly the prompts it would have."""
    positions = np.arange(start, start + count)
    epochs, offsets = np.divmod(positions, num_prompts)
    perms = {int(e): np.random.default_rng([seed, int(e)]).permutation(num_prompts) for e in np.unique(epochs)}
    return np.array([perms[int(e)][o] for e, o in zip(epochs, offsets, strict=True)], dtype=np.int64)


TRAINING_STREAM, EVALUATION_STREAM = 7, 13


def update_generator(seed: int, update: int, device: torch.device, stream: int = TRAINING_STREAM) -> torch.Generator:
    """The sampling RNG of one update, derived from (seed, update, stream): resuming needs no RNG state."""
    return torch.Generator(device=device).manual_seed(int(np.random.default_rng([seed, update, stream]).integers(2**62)))


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (a length-sorted chunk needs fewer)."""
    used = mask.sum(0).nonzero()
    first = int(used[0]) if used.numel() else 0
    return ids[:, first:], mask[:, first:]


@torch.no_grad()
def sample_responses(
    policy: torch.nn.Module,
    queries: list[list[int]],
    params: SamplingParams,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    generator: torch.Generator,
    desc: str = "",
    samples_per_prompt: int = 1,
) -> RolloutBatch:
    """Sample `samples_per_prompt` (G) responses per query, longest queries first to pad less. Row
    g + G*i is sample g of query i; `batch_size` counts rows, and each query is encoded once."""
    device = model_device(policy)
    group = samples_per_prompt
    padded = left_pad_queries(queries, tokenizer.pad_token_id)
    query_ids, query_mask = padded["input_ids"].to(device), padded["attention_mask"].to(device)
    order = sorted(range(len(queries)), key=lambda i: -len(queries[i]))
    per_chunk = max(1, batch_size // group)
    chunks = []
    for start in tqdm(range(0, len(order), per_chunk), desc=desc or "sampling", unit="batch", leave=False, disable=not desc):
        picked = torch.tensor(order[start : start + per_chunk], device=device)
        ids, mask = trim_left_padding(query_ids[picked], query_mask[picked])
        out = generate(policy, ids, mask, params, tokenizer.eos_token_id, tokenizer.pad_token_id, generator, group)
        rows = (picked.unsqueeze(1) * group + torch.arange(group, device=device)).reshape(-1)
        chunks.append((rows, out))
    total = len(queries) * group
    width = max(out.responses.size(1) for _, out in chunks)
    responses = torch.full((total, width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    lengths = torch.zeros(total, dtype=torch.long, device=device)
    has_eos = torch.zeros(total, dtype=torch.bool, device=device)
    for rows, out in chunks:
        responses[rows, : out.responses.size(1)] = out.responses
        lengths[rows], has_eos[rows] = out.lengths, out.has_eos
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    prompts = torch.arange(len(queries), device=device).repeat_interleave(group)
    return RolloutBatch(prompts, query_ids.repeat_interleave(group, 0), query_mask.repeat_interleave(group, 0), responses, mask, has_eos)


def policy_logprobs(policy, batch: RolloutBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    return response_logprobs(policy, batch.input_ids(), batch.attention_mask(), batch.context_length, temperature)


def value_estimates(value: ScalarModel, batch: RolloutBatch) -> torch.Tensor:
    """(B, R) V(state before each response token): the head's output at the position that predicts it."""
    per_position = value.per_token_scores(batch.input_ids(), batch.attention_mask())
    return per_position[:, batch.context_length - 1 : -1]


def reward_scores(reward: ScalarModel, batch: RolloutBatch) -> torch.Tensor:
    """(B,) reward-model scores read at each response's EOS (Detail 12; the last token when there is
    none), the query left padded (Detail 14): the same index equation 3 puts the score on."""
    eos_index = batch.context_length + batch.lengths - 1
    return reward(batch.input_ids(), batch.attention_mask(), context_length=batch.context_length, eos_index=eos_index)


@torch.no_grad()
def score_rollout(models: OnPolicyModels, batch: RolloutBatch, cfg: OnPolicyConfig, precision: str) -> RolloutBatch:
    """Fill in the sampling-time log-probabilities, reference log-probabilities, values and scores,
    `forward_batch_size` rows at a time. The old log-probabilities come from the same forward
    function the update uses, so before any update the PPO ratio is exactly 1."""
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
            parts["raw_scores"].append(reward_scores(models.reward, remote).float().to(device))
    filled = {k: torch.cat(v) for k, v in parts.items()}
    mask = batch.mask
    # Everything after EOS is masked out of every loss and metric; zero it here too so that no
    # stray number from a PAD position can leak into a sum.
    for key in ("logprobs", "ref_logprobs", "values"):
        if key in filled:
            filled[key] = filled[key] * mask
    return dataclasses.replace(batch, **filled)


def compute_advantages(batch: RolloutBatch, cfg: OnPolicyConfig, kl_coef: float) -> RolloutBatch:
    """Scores -> per-token rewards (equation 3) -> advantages and returns by the configured estimator.
    With kl_placement=loss the rewards carry the score alone and the KL enters the update's loss."""
    mask = batch.mask
    raw = ops.length_penalised_scores(batch.raw_scores, batch.lengths, cfg.reward_length_penalty)
    scores = ops.eos_trick(raw, batch.has_eos, cfg.missing_eos_score) if cfg.eos_trick else raw
    kl = ops.kl_penalty(batch.logprobs, batch.ref_logprobs, cfg.kl_estimator) * mask
    rewards, _ = ops.rlhf_rewards(scores, kl, mask, kl_coef if cfg.kl_placement == "reward" else 0.0)
    if cfg.whiten_rewards:  # Detail 24
        rewards = ops.masked_whiten(rewards, mask, shift_mean=False)
    estimator = ops.ADVANTAGE_ESTIMATORS[cfg.advantage_estimator]
    groups = torch.arange(batch.size, device=mask.device) // cfg.samples_per_prompt  # rows come in groups (sample_responses)
    advantages, returns = estimator.fn(rewards, mask, values=batch.values, groups=groups, gamma=cfg.gamma, lam=cfg.lam,
                                       scale_by_std=getattr(cfg, "scale_rewards", True))
    if cfg.whiten_advantages:  # Detail 25
        advantages = ops.masked_whiten(advantages, mask)
    return dataclasses.replace(
        batch, scores=scores, kl=kl, rewards=rewards, advantages=advantages, returns=returns
    )


@dataclass
class Optimizers:
    policy: torch.optim.Optimizer
    policy_schedule: Any
    value: torch.optim.Optimizer | None
    value_schedule: Any

    def named_extra_states(self) -> dict[str, Any]:
        return {"value_optimizer": self.value, "value_scheduler": self.value_schedule} if self.value is not None else {}

    def step(self, models: OnPolicyModels, max_grad_norm: float, step_label: int) -> dict[str, float]:
        norms = {}
        pairs = [("policy", models.policy, self.policy), ("value", models.value, self.value)]
        for name, model, optimizer in pairs:
            if optimizer is None:
                continue
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf"))
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
    """Token-weighted running means of per-micro-batch statistics, averaged over an update."""

    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: torch.Tensor | float, weight: float) -> None:
        self.sums[key] += float(value) * weight
        self.weights[key] += weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


def update_on_rollout(
    models: OnPolicyModels, optimizers: Optimizers, batch: RolloutBatch, cfg: OnPolicyConfig, update: int, precision: str,
    kl_coef: float,
) -> dict[str, float]:
    """K epochs (Table 7: 4) over the rollout batch in N minibatches (Table 7: 1), one optimizer step
    per minibatch, micro-batches accumulated so the step equals one pass over the whole minibatch.
    The loss: clipped surrogate, plus vf_coef x value loss (PPO), plus kl_coef x KL to the reference
    (kl_placement=loss), minus entropy_coef x entropy."""
    device = batch.responses.device
    rng = np.random.default_rng([cfg.seed, update, 11])
    minibatch = batch.size // cfg.num_minibatches
    stats = Averages()
    grad_norms = Averages()
    clip = cfg.clip_range or None
    value_clip = getattr(cfg, "value_clip_range", 0.0) or None
    for _ in range(cfg.update_epochs):
        order = torch.as_tensor(rng.permutation(batch.size), device=device)
        for start in range(0, batch.size, minibatch):
            rows = order[start : start + minibatch]
            tokens = float(batch.mask[rows].sum().clamp(min=1))
            for micro_start in range(0, len(rows), cfg.micro_batch_size):
                micro = batch.select(rows[micro_start : micro_start + cfg.micro_batch_size])
                weight = float(micro.mask.sum()) / tokens
                with autocast(device, precision):
                    logprobs, entropy = policy_logprobs(models.policy, micro, cfg.temperature)
                    policy_loss = ops.ppo_policy_loss(logprobs, micro.logprobs, micro.advantages, micro.mask, clip)
                    loss = policy_loss.loss
                    if cfg.kl_placement == "loss":
                        kl_term = ops.masked_mean(ops.kl_penalty(logprobs, micro.ref_logprobs, cfg.kl_estimator), micro.mask)
                        loss = loss + kl_coef * kl_term
                        stats.add("loss/kl_avg", kl_term.detach(), weight)
                    if cfg.entropy_coef:
                        loss = loss - cfg.entropy_coef * ops.masked_mean(entropy, micro.mask)
                    if models.value is not None:
                        new_values = value_estimates(models.value, micro).float()
                        value_loss, value_clipfrac = ops.ppo_value_loss(new_values, micro.values, micro.returns, micro.mask, value_clip)
                        loss = loss + cfg.vf_coef * value_loss
                        stats.add("loss/value_avg", value_loss.detach(), weight)
                        stats.add("val/clipfrac_avg", value_clipfrac, weight)
                check_finite(update, "loss", loss.detach())
                (loss * weight).backward()
                ratio = torch.exp(logprobs.detach() - micro.logprobs)
                stats.add("loss/policy_avg", policy_loss.loss.detach(), weight)
                stats.add("policy/clipfrac_avg", policy_loss.clip_fraction, weight)
                stats.add("policy/approxkl_avg", policy_loss.approx_kl, weight)
                stats.add("policy/entropy_avg", ops.masked_mean(entropy.detach(), micro.mask), weight)
                stats.add("val/ratio", ops.masked_mean(ratio, micro.mask), weight)
                stats.add("ratio_squared", ops.masked_mean(ratio**2, micro.mask), weight)
            for key, norm in optimizers.step(models, cfg.max_grad_norm, update).items():
                grad_norms.add(key, norm, 1.0)
    means = stats.means() | grad_norms.means()
    means["val/ratio_var"] = max(0.0, means.pop("ratio_squared") - means["val/ratio"] ** 2)
    return means


def rollout_metrics(batch: RolloutBatch, kl_coef: float) -> dict[str, float]:
    """The per-update curves of Figure 12 and seed 000 Stage 3, from the rollout alone."""
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
    """The `count` highest- and lowest-scored episodes of the update, decoded."""
    order = torch.argsort(batch.scores, descending=True).tolist()
    picks = [("highest", i) for i in order[:count]] + [("lowest", i) for i in order[::-1][:count]]
    rows = []
    for rank, i in picks:
        query = batch.query_ids[i][batch.query_mask[i].bool()].tolist()
        response = batch.responses[i][batch.mask[i]].tolist()
        rows.append({
            "step": update, "rank": rank, "score": float(batch.scores[i]), "raw_score": float(batch.raw_scores[i]),
            "kl": float(batch.kl[i].sum()), "length": len(response), "has_eos": bool(batch.has_eos[i]),
            "query": tokenizer.decode(query), "response": tokenizer.decode(response, skip_special_tokens=True),
        })
    return rows


def check_batch_shape(cfg: OnPolicyConfig) -> None:
    estimator = ops.ADVANTAGE_ESTIMATORS[cfg.advantage_estimator]
    if estimator.needs_groups and cfg.samples_per_prompt < 2:
        raise ConfigError(f"advantage_estimator={cfg.advantage_estimator} compares the samples of a prompt: set samples_per_prompt >= 2")
    if cfg.total_batch_size % cfg.samples_per_prompt:
        raise ConfigError(f"total_batch_size={cfg.total_batch_size} must be a multiple of samples_per_prompt={cfg.samples_per_prompt}")
    if cfg.total_batch_size % cfg.num_minibatches:
        raise ConfigError(f"total_batch_size={cfg.total_batch_size} must be a multiple of num_minibatches={cfg.num_minibatches}")


def planned_updates(cfg: OnPolicyConfig) -> int:
    check_batch_shape(cfg)
    updates = cfg.max_steps or cfg.total_episodes // cfg.total_batch_size
    if updates < 1:
        raise ConfigError(f"total_episodes={cfg.total_episodes} is less than one update of total_batch_size={cfg.total_batch_size}")
    return updates


def draw_queries(prompts: list[list[int]], cfg: OnPolicyConfig, update: int) -> tuple[list[list[int]], np.ndarray]:
    """This update's total_batch_size / samples_per_prompt queries and their prompt indices."""
    per_update = cfg.total_batch_size // cfg.samples_per_prompt
    picked = prompt_indices(len(prompts), per_update, cfg.seed, update * per_update)
    return [prompts[i] for i in picked], picked


def collect(models: OnPolicyModels, prompts: list[list[int]], cfg: OnPolicyConfig, update: int, kl_coef: float,
            precision: str, timings: dict[str, float], show=lambda phase: None) -> RolloutBatch:
    """Sample, score and estimate advantages for update `update` (0-based); `show(phase)` reports progress."""
    device = model_device(models.policy)
    queries, prompt_ids = draw_queries(prompts, cfg, update)
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.temperature)
    show("sampling")
    began = time.perf_counter()
    # eval mode: with activation checkpointing on, a model in train mode refuses the KV cache
    with autocast(device, precision), evaluation_mode(models.policy):
        batch = sample_responses(models.policy, queries, params, models.tokenizer, cfg.generation_batch_size,
                                 update_generator(cfg.seed, update, device), samples_per_prompt=cfg.samples_per_prompt)
    batch.prompts = torch.as_tensor(prompt_ids, device=device).repeat_interleave(cfg.samples_per_prompt)
    timings["generation"] = time.perf_counter() - began
    show("scoring")
    began = time.perf_counter()
    batch = score_rollout(models, batch, cfg, precision)
    timings["scoring"] = time.perf_counter() - began
    return compute_advantages(batch, cfg, kl_coef)


def prepare_for_training(models: OnPolicyModels, cfg: OnPolicyConfig) -> None:
    for frozen in (models.reference, models.reward):
        frozen.eval().requires_grad_(False)
    for trained in (models.policy, models.value):
        if trained is None:
            continue
        trained.train()
        if cfg.gradient_checkpointing:
            if isinstance(trained, ScalarModel):
                trained.activation_checkpointing_enable()
            else:
                enable_activation_checkpointing(trained)


def save(run_dir: Path, update: int, models: OnPolicyModels, optimizers: Optimizers, state: dict[str, Any], keep: int) -> None:
    extra_models = {"value": models.value} if models.value is not None else {}
    save_checkpoint(run_dir, update, models.policy, models.tokenizer, optimizers.policy, optimizers.policy_schedule,
                    state, keep, extra_models=extra_models, extra_states=optimizers.named_extra_states())


def train_on_policy(
    models: OnPolicyModels,
    prompts: list[list[int]],
    cfg: OnPolicyConfig,
    run_dir: Path,
    checkpoint: Path | None,
    name: str,
    evaluate=None,
) -> dict[str, Any]:
    """Run every update of an on-policy stage; `evaluate(policy, update)` adds periodic metrics."""
    num_updates = planned_updates(cfg)
    precision = autocast_precision(cfg)
    prepare_for_training(models, cfg)
    optimizers = build_optimizers(models, cfg, num_updates)
    kl_coef, start = cfg.kl_coef, 0
    if checkpoint is not None:
        state = load_training_state(checkpoint, optimizers.policy, optimizers.policy_schedule, optimizers.named_extra_states())
        start, kl_coef = state["step"], state["kl_coef"]
    drop_rows_after(run_dir / SAMPLES_FILE, start)
    tracker = Tracker(run_dir, cfg.report_to, dataclasses.asdict(cfg), resume_step=start)
    if evaluate is not None and cfg.eval_every and start == 0:
        tracker.log(0, evaluate(models.policy, 0))
    bar = tqdm(total=num_updates, initial=start, desc=name, unit="update")

    def show(phase: str) -> None:
        bar.set_description_str(f"{name} [{phase}]", refresh=True)

    last: dict[str, float] = {}
    with StopSignal() as stop:
        for update in range(start, num_updates):
            began = time.perf_counter()
            timings: dict[str, float] = {}
            batch = collect(models, prompts, cfg, update, kl_coef, precision, timings, show)
            metrics = rollout_metrics(batch, kl_coef)
            show("updating")
            tick = time.perf_counter()
            metrics |= update_on_rollout(models, optimizers, batch, cfg, update + 1, precision, kl_coef)
            timings["update"] = time.perf_counter() - tick
            metrics["train/lr"] = optimizers.policy_schedule.get_last_lr()[0]
            optimizers.advance_schedules()
            if cfg.adaptive_kl:
                kl_coef = ops.adaptive_kl_coef(kl_coef, metrics["objective/kl"], cfg.kl_target, cfg.kl_horizon, batch.size)
            done = update + 1
            elapsed = time.perf_counter() - began
            metrics |= {f"perf/{k}_s": v for k, v in timings.items()}
            metrics |= {
                "perf/update_total_s": elapsed,
                "perf/generated_tokens_per_s": float(batch.lengths.sum()) / timings["generation"],
                "perf/episodes_per_s": batch.size / elapsed,
                "episodes": done * cfg.total_batch_size,
            }
            if cfg.sample_every and (done == 1 or done % cfg.sample_every == 0 or done == num_updates):
                append_jsonl(run_dir / SAMPLES_FILE, extreme_samples(batch, models.tokenizer, done, cfg.log_samples))
            if evaluate is not None and cfg.eval_every and done % cfg.eval_every == 0:
                show("evaluating")
                metrics |= evaluate(models.policy, done)
            if done % cfg.log_every == 0 or done == num_updates:
                tracker.log(done, metrics)
            last = metrics
            bar.update(1)
            bar.set_postfix(score=f"{metrics['objective/scores']:.3f}", kl=f"{metrics['objective/kl']:.3f}",
                            len=f"{metrics['response/length_mean']:.1f}")
            state = {"episodes": done * cfg.total_batch_size, "kl_coef": kl_coef}
            saved = (bool(cfg.save_every) and done % cfg.save_every == 0) or done == num_updates
            if saved:
                save(run_dir, done, models, optimizers, state, cfg.keep_checkpoints)
            if signum := stop.signum:  # read once: a signal after this line stops the next update
                if not saved:
                    save(run_dir, done, models, optimizers, state, cfg.keep_checkpoints)
                bar.close()
                tracker.close()
                exit_after_checkpoint(signum, f"update {done}", run_dir, resume_command(name, run_dir))
    bar.close()
    tracker.close()
    return {"updates": num_updates, "last_metrics": last, "kl_coef": kl_coef}
