"""The update, the phase after advantages: the clipped update on the whole update's rollout (Section 7,
Table 7).

    K epochs x N minibatches of policy (and value) updates: the configured policy loss, aggregated
    as `loss_aggregation` says                                                    (Table 7)
    loss = policy loss [+ kl_coef x KL to the reference] [- entropy_coef x entropy] [+ vf_coef x value loss]
           [+ distill_coef x divergence from the teacher (distill_loss=jsd, topk-forward-kl)]

The maths lives in `ops` and `policy_losses`. Each minibatch is drawn from the whole update's rollout
(gathered by `collect.gather_rollout`): every process computes the gradient of its rows of the
minibatch, each micro-batch's loss divided by the normaliser of the whole minibatch (its tokens or
its sequences), and the gradients are summed across processes before the optimizer step. The update
is therefore the one a single process would make on the same rollout in one pass, up to
floating-point summation order (tests/onpolicy/test_split_invariance.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import ops
from ..config import ValueOptions
from ..devices import autocast
from ..distributed import ONE_PROCESS, process_share
from ..logprobs import pad_token_of
from ..policy_losses import POLICY_LOSSES, ClipRange, aggregate, loss_units
from ..rollout import RolloutBatch
from ..sharding import SavedState, ShardedOptimizerState, ShardedRun, fsdp_modules, full_number
from ..shared_rows import SharedRows
from ..trainers.run import check_finite
from .scoring import (
    OldLogprobs,
    OnPolicyModels,
    RowLayout,
    ScoringPlan,
    pack_rollout,
    policy_head_inputs,
    scored_rows,
    value_estimates,
)


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

    def step(
        self, models: OnPolicyModels, max_grad_norm: float, step_label: int, accelerator=ONE_PROCESS
    ) -> dict[str, float]:
        sum_gradients_across_processes(models.trained(), accelerator)
        norms = {}
        pairs = [("policy", models.policy, self.policy), ("value", models.value, self.value)]
        for name, model, optimizer in pairs:
            if optimizer is None:
                continue
            norm = full_number(
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf"))
            )
            check_finite(step_label, f"{name} gradient norm", norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            norms[f"{name}/grad_norm"] = float(norm)
        return norms

    def advance_schedules(self) -> None:
        for schedule in (self.policy_schedule, self.value_schedule):
            if schedule is not None:
                schedule.step()


def optimizer_states(optimizers: Optimizers, sharded: dict[str, ShardedRun]) -> tuple[Any, dict[str, Any]]:
    """The policy optimizer and the other training states as checkpoints hold them; a sharded
    optimizer as its full, name-keyed state (reading or writing it is a collective)."""
    if not sharded:
        return optimizers.policy, optimizers.named_extra_states()
    extra = (
        {"value_optimizer": sharded["value"].optimizer_state(), "value_scheduler": optimizers.value_schedule}
        if "value" in sharded
        else {}
    )
    return sharded["policy"].optimizer_state(), extra


def saved_optimizer_states(optimizers: Optimizers, sharded: dict[str, ShardedRun]) -> tuple[Any, dict[str, Any]]:
    """`optimizer_states` as a checkpoint writes them: a sharded run's as full state dicts, gathered by
    every process."""
    optimizer, extra = optimizer_states(optimizers, sharded)
    if not sharded:
        return optimizer, extra
    full = {k: SavedState(v.state_dict()) if isinstance(v, ShardedOptimizerState) else v for k, v in extra.items()}
    return SavedState(optimizer.state_dict()), full


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


def learned_mask(batch: RolloutBatch) -> torch.Tensor:
    """(B, R) the tokens the update learns from: the policy's own (`trained_mask`), in the rows with a score
    (`scored_rows`: a row no reward scored is dropped from the update)."""
    return batch.trained_mask & scored_rows(batch).unsqueeze(1)


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

    def loss_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """(B, R) the tokens whose losses count: every token the policy sampled (not an environment's) in a
        row with a score (`learned_mask`), or with mask_truncated (DAPO's overlong filtering) none of a
        response cut before its EOS."""
        trained = learned_mask(batch)
        return trained & batch.has_eos.unsqueeze(1) if self.mask_truncated else trained

    def units(self, batch: RolloutBatch) -> torch.Tensor:
        """(B,) each row's share of its minibatch's normaliser (`policy_losses.loss_units`)."""
        return loss_units(self.loss_mask(batch), self.aggregation)

    def aggregate(self, per_token: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
        return aggregate(per_token, mask, self.aggregation, normaliser, self.constant)


@dataclass(frozen=True)
class Minibatches:
    """The update's shape: `epochs` passes over the rollout (Table 7's K), each in `count` minibatches (N)
    of whole groups of `group` rows, each run in micro-batches of `micro_batch_size` rows."""

    epochs: int
    count: int
    micro_batch_size: int
    group: int


@dataclass(frozen=True)
class UpdatePlan:
    """The on-policy update as the run decides it once (`trainer.update_plan`): what it
    minimises, the value model's options, how scoring and the update's micro-batches read shared rows,
    the update's shape, and where the old policy's log-probabilities come from (`old_logprobs`)."""

    objective: Objective
    value: ValueOptions | None  # None: the algorithm trains no value model
    scoring: ScoringPlan  # how each rollout is scored, the old log-probabilities' source among it
    layout: RowLayout  # which models' micro-batch passes read shared rows
    minibatches: Minibatches
    temperature: float
    kl_placement: str  # "loss": kl_coef x KL is a term of the loss; "reward": the rewards carry it
    kl_estimator: str
    entropy_coef: float
    max_grad_norm: float
    seed: int  # each update's minibatch order derives from it
    precision: str  # the autocast of the update's forwards

    @property
    def old_logprobs(self) -> OldLogprobs:
        return self.scoring.old_logprobs


@dataclass(frozen=True)
class UpdateResult:
    metrics: dict[str, float]
    # (B, R) with plan.old_logprobs == "update", the old log-probabilities the update's first forward
    # gave, every row on every process; None when scoring gave them
    old_logprobs: torch.Tensor | None


@dataclass(frozen=True)
class UpdateStep:
    """What changes from one update to the next: its number (1-based, naming it in errors) and the KL
    coefficient (the adaptive controller moves it)."""

    number: int
    kl_coef: float


def update_on_rollout(
    *,
    models: OnPolicyModels,
    optimizers: Optimizers,
    batch: RolloutBatch,
    plan: UpdatePlan,
    update: int,
    kl_coef: float,
    accelerator=ONE_PROCESS,
) -> UpdateResult:
    """K epochs (Table 7: 4) over the whole update's rollout `batch` in N minibatches (Table 7: 1), one
    optimizer step per minibatch; this process runs the micro-batches of its own rows of each
    minibatch. The loss: the policy loss, plus kl_coef x KL to the reference (kl_placement=loss), minus
    entropy_coef x entropy, each aggregated over the minibatch as `loss_aggregation` says, plus
    vf_coef x value loss (PPO; a mean over the minibatch's tokens). Every normaliser is counted over
    the whole minibatch before it is split, so each micro-batch's loss is its exact share.

    Where the plan takes the old policy's log-probabilities from the update's own forward
    (`plan.old_logprobs == "update"`), they are detached from it and returned (`UpdateResult`)."""
    from_this_forward = plan.old_logprobs == "update"
    if (batch.logprobs is None) != from_this_forward:
        given = "without" if batch.logprobs is None else "with"
        raise ValueError(f"a rollout {given} old log-probabilities, where the plan takes them from "
                         f"{plan.old_logprobs}")
    shape, step = plan.minibatches, UpdateStep(update, kl_coef)
    device = batch.responses.device
    rng = np.random.default_rng([plan.seed, update, 11])
    minibatch = batch.size // shape.count
    units, tokens = plan.objective.units(batch), learned_mask(batch).sum(-1).float()
    stats = Averages()
    grad_norms = Averages()
    lockstep = bool(fsdp_modules(models.policy))
    # this process's rows of the old log-probabilities, zeros at the other processes' rows
    first_forward = torch.zeros(batch.mask.shape, dtype=torch.float32, device=device) if from_this_forward else None
    for epoch in range(shape.epochs):
        order = group_order(rng, batch.size, shape.group)
        for start in range(0, batch.size, minibatch):
            rows = order[start : start + minibatch]
            normalisers = Normalisers(float(units[rows].sum()), float(tokens[rows].sum()))
            passes = micro_batch_plan(rows, batch.size, shape.micro_batch_size, accelerator, lockstep, shape.group)
            for own, counts in passes:
                picked = torch.as_tensor(own, device=device)
                rows_of = batch.select(picked)
                # the group-packed rows, built once for the models whose passes read them
                shared = pack_rollout(rows_of, shape.group) if plan.layout.policy or plan.layout.value else None
                share = normalisers.share(units[picked], tokens[picked]) if counts else None
                logprobs = micro_loss(models, MicroBatch(rows_of, shared, share), plan, step, normalisers, stats)
                if first_forward is not None and counts and epoch == 0:
                    first_forward[picked] = logprobs
            for key, norm in optimizers.step(models, plan.max_grad_norm, update, accelerator).items():
                grad_norms.add(key, norm, 1.0)
        if epoch == 0 and first_forward is not None:  # every row's, and later epochs' ratios are to them
            first_forward = reduce_rows(first_forward, accelerator)
            batch = dataclasses.replace(batch, logprobs=first_forward)
    means = stats.means(accelerator) | grad_norms.means()
    means["val/ratio_var"] = max(0.0, means.pop("ratio_squared") - means["val/ratio"] ** 2)
    means["perf/shared_prefix"] = float(plan.layout.policy)
    return UpdateResult(means, first_forward)


def reduce_rows(rows: torch.Tensor, accelerator) -> torch.Tensor:
    """Each process filled its own rows, zeros elsewhere: their sum is every row."""
    return accelerator.reduce(rows, "sum") if accelerator.num_processes > 1 else rows


def group_order(rng: np.random.Generator, size: int, group: int) -> np.ndarray:
    """The rows of a rollout in a random order of whole groups (a group's rows stay together, in their
    order), so that no minibatch or micro-batch splits a prompt's samples. With one sample per prompt
    it is `rng.permutation(size)` itself, a plain permutation of the rows."""
    groups = rng.permutation(size // group)
    return (groups[:, None] * group + np.arange(group)).ravel()


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a minibatch as this process runs it."""

    rows: RolloutBatch
    shared: SharedRows | None  # its groups packed, for the models whose passes read shared rows
    # (policy, value) weights in the logged means; None: a lockstep pass whose rows belong to another
    # micro-batch, which adds nothing
    share: tuple[float, float] | None


@dataclass(frozen=True)
class Normalisers:
    """A minibatch's normalisers, counted over all of it: the policy loss's units and the value loss's tokens."""

    units: float
    tokens: float

    def share(self, units: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
        """(policy, value) weights of a micro-batch with these rows in the minibatch's logged means."""
        return float(units.sum()) / max(self.units, 1e-8), float(tokens.sum()) / max(self.tokens, 1e-8)


def micro_batch_plan(
    rows: np.ndarray, batch_size: int, size: int, accelerator, lockstep: bool, group: int = 1
) -> list[tuple[np.ndarray, bool]]:
    """This process's rows of a minibatch in micro-batches of `size`, each with whether it counts.
    Processes hold different numbers of a shuffled minibatch's rows; with `lockstep` (sharded models,
    whose every forward and backward pass is a collective) each runs as many micro-batches as the
    busiest one, the extra ones on the minibatch's first group of `group` rows with weight 0."""

    def own_rows(process: int) -> np.ndarray:
        share = process_share(batch_size, process, accelerator.num_processes)
        return rows[(rows >= share.start) & (rows < share.stop)]

    own = own_rows(accelerator.process_index)
    plan = [(own[i : i + size], True) for i in range(0, len(own), size)]
    if lockstep:
        busiest = max(-(-len(own_rows(p)) // size) for p in range(accelerator.num_processes))
        plan += [(rows[:group], False)] * (busiest - len(plan))
    return plan


def micro_loss(
    models: OnPolicyModels,
    micro: MicroBatch,
    plan: UpdatePlan,
    step: UpdateStep,
    normalisers: Normalisers,
    stats: Averages,
) -> torch.Tensor:
    """Forward and backward of one micro-batch: its exact share of the minibatch's loss, its statistics
    added to `stats` with its `share` of the logged means. Returns the old log-probabilities it used, (b, R)."""
    counts = micro.share is not None
    rows, objective, value_options = micro.rows, plan.objective, plan.value
    loss_mask = objective.loss_mask(rows) if counts else torch.zeros_like(rows.trained_mask)
    trained = rows.trained_mask  # environment tokens are context, never trained on
    with autocast(rows.responses.device, plan.precision):
        student = policy_head_inputs(models.policy, rows, plan.layout.rows_for("policy", micro.shared))
        logprobs, entropy = student.logprobs_entropy(rows.responses, plan.temperature, pad_token_of(models.policy))
        if rows.logprobs is None:  # the first epoch's forward, before any step: ratio 1 exactly, the sampling policy
            rows = dataclasses.replace(rows, logprobs=logprobs.detach() * trained)
        policy = POLICY_LOSSES[objective.policy_loss](
            logprobs, rows.logprobs, rows.advantages, trained, objective.clip, objective.dual_clip
        )
        terms = {"loss/policy": objective.aggregate(policy.per_token, loss_mask, normalisers.units)}
        if plan.kl_placement == "loss":
            terms["loss/kl"] = step.kl_coef * objective.aggregate(
                ops.kl_loss(logprobs, rows.logprobs, rows.ref_logprobs, plan.kl_estimator),
                loss_mask,
                normalisers.units,
            )
        teacher = models.teacher
        if teacher is not None and teacher.keeps_distributions:  # jsd, topk-forward-kl: a term of the loss
            divergence = teacher.divergence(student, rows.teacher_features, plan.temperature,
                                            pad_token_of(models.policy))
            terms["loss/distill"] = teacher.options.coef * objective.aggregate(divergence, loss_mask,
                                                                               normalisers.units)
        if plan.entropy_coef:
            terms["loss/entropy"] = -plan.entropy_coef * objective.aggregate(entropy, loss_mask, normalisers.units)
        if value_options is not None:
            new_values = value_estimates(models.value, rows, plan.layout.rows_for("value", micro.shared)).float()
            learned = learned_mask(rows)
            value_loss, value_clipfrac = ops.ppo_value_loss(
                new_values, rows.values, rows.returns, learned, value_options.clip_range or None
            )
            # value_loss is a mean over this micro-batch's tokens: weighted by them, the minibatch's mean
            value_tokens = float(learned.sum()) if counts else 0.0
            terms["loss/value"] = value_options.coef * value_loss * value_tokens / max(normalisers.tokens, 1e-8)
    loss = sum(terms.values())
    check_finite(step.number, "loss", loss.detach())
    loss.backward()
    if not counts:
        return rows.logprobs
    weight, value_weight = micro.share
    ratio = torch.exp(logprobs.detach() - rows.logprobs)
    if value_options is not None:
        stats.add("loss/value_avg", value_loss.detach(), value_weight)
        stats.add("val/clipfrac_avg", value_clipfrac, value_weight)
    if "loss/distill" in terms:
        stats.add("distill/divergence", ops.masked_mean(divergence.detach(), trained), value_weight)
    if "loss/kl" in terms:
        stats.add(
            "loss/kl_avg",
            ops.masked_mean(ops.kl_penalty(logprobs.detach(), rows.ref_logprobs, plan.kl_estimator), trained),
            value_weight,
        )
    # the policy loss as a mean per unit of this micro-batch: summed with its weights, the minibatch's loss
    stats.add("loss/policy_avg", terms["loss/policy"].detach() / max(weight, 1e-12), weight)
    stats.add("policy/clipfrac_avg", policy.clip_fraction, value_weight)
    stats.add("policy/approxkl_avg", policy.approx_kl, value_weight)
    stats.add("policy/entropy_avg", ops.masked_mean(entropy.detach(), trained), value_weight)
    stats.add("val/ratio", ops.masked_mean(ratio, trained), value_weight)
    stats.add("ratio_squared", ops.masked_mean(ratio**2, trained), value_weight)
    return rows.logprobs
