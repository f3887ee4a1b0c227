"""The update, the phase after advantages: the clipped update on the whole update's rollout (Section 7,
Table 7).

    K epochs x N minibatches of policy (and value) updates: the configured policy loss, aggregated
    as `loss_aggregation` says                                                    (Table 7)
    loss = policy loss [+ kl_coef x KL to the reference] [- entropy_coef x entropy] [+ vf_coef x value loss]

The maths lives in `ops` and `policy_losses`. Each minibatch is drawn from the whole update's rollout
(gathered by `collect.gather_rollout`): every process computes the gradient of its rows of the
minibatch, each micro-batch's loss divided by the normaliser of the whole minibatch (its tokens or
its sequences), and the gradients are summed across processes before the optimizer step. The update
is therefore the one a single process would make on the same rollout in one pass, up to
floating-point summation order (tests/test_onpolicy_split_invariance.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import ops
from ..config import OnPolicyConfig
from ..devices import autocast
from ..distributed import ONE_PROCESS, process_share
from ..policy_losses import POLICY_LOSSES, ClipRange, aggregate, loss_units
from ..rollout import RolloutBatch
from ..sharding import fsdp_modules, full_number
from ..shared_rows import SharedRows
from ..trainers.run import build_optimizer, check_finite
from .algorithms import ValueOptions, algorithm_of
from .scoring import (
    OnPolicyModels,
    RowLayout,
    pack_rollout,
    policy_logprobs,
    reuses_update_forward,
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


def build_optimizers(models: OnPolicyModels, cfg: OnPolicyConfig, num_updates: int) -> Optimizers:
    """AdamW (Table 7: eps 1e-5) for the policy and, when there is one, the value model, each with the
    learning-rate schedule stepped once per update (Table 7: linear decay to 0 over the run)."""
    policy_opt, policy_sched = build_optimizer(models.policy, cfg, num_updates)
    value_opt, value_sched = (
        build_optimizer(models.value, cfg, num_updates) if models.value is not None else (None, None)
    )
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

    @classmethod
    def of(cls, cfg: OnPolicyConfig) -> Objective:
        return cls(
            cfg.policy_loss,
            ClipRange.of(cfg.clip_range, cfg.clip_range_high),
            cfg.dual_clip,
            cfg.loss_aggregation,
            cfg.loss_normaliser or float(cfg.max_response_length),
            cfg.mask_truncated,
        )

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


def update_on_rollout(
    models: OnPolicyModels,
    optimizers: Optimizers,
    batch: RolloutBatch,
    cfg: OnPolicyConfig,
    update: int,
    precision: str,
    kl_coef: float,
    accelerator=ONE_PROCESS,
    old_logprobs: torch.Tensor | None = None,
) -> dict[str, float]:
    """K epochs (Table 7: 4) over the whole update's rollout `batch` in N minibatches (Table 7: 1), one
    optimizer step per minibatch; this process runs the micro-batches of its own rows of each
    minibatch. The loss: the policy loss, plus kl_coef x KL to the reference (kl_placement=loss), minus
    entropy_coef x entropy, each aggregated over the minibatch as `loss_aggregation` says, plus
    vf_coef x value loss (PPO; a mean over the minibatch's tokens). Every normaliser is counted over
    the whole minibatch before it is split, so each micro-batch's loss is its exact share.

    A rollout scored without the old policy's log-probabilities (`reuses_update_forward`) takes them
    from the update's own forward, detached; given `old_logprobs` (B, R), they are written there for
    every row, on every process."""
    algorithm = algorithm_of(cfg)
    objective = Objective.of(cfg)
    device = batch.responses.device
    rng = np.random.default_rng([cfg.seed, update, 11])
    minibatch = batch.size // cfg.num_minibatches
    units, tokens = objective.units(batch), learned_mask(batch).sum(-1).float()
    value_options = algorithm.value(cfg) if algorithm.value else None
    stats = Averages()
    grad_norms = Averages()
    lockstep = bool(fsdp_modules(models.policy))
    group = cfg.samples_per_prompt
    layout = RowLayout.of(models, cfg, cfg.micro_batch_size, "micro_batch_size")
    reused = first_forward_buffer(batch, cfg)
    for _ in range(cfg.update_epochs):
        order = group_order(rng, batch.size, group)
        for start in range(0, batch.size, minibatch):
            rows = order[start : start + minibatch]
            normalisers = Normalisers(float(units[rows].sum()), float(tokens[rows].sum()))
            plan = micro_batch_plan(rows, batch.size, cfg.micro_batch_size, accelerator, lockstep, group)
            for own, counts in plan:
                picked = torch.as_tensor(own, device=device)
                share = normalisers.share(units[picked], tokens[picked]) if counts else None
                micro = batch.select(picked)
                shared = pack_rollout(micro, group) if layout.policy or layout.value else None  # the models it runs
                passes = MicroPasses(layout, shared, reused is not None)
                logprobs = micro_loss(
                    models, micro, cfg, objective, value_options, precision, kl_coef, update, share, normalisers,
                    stats, passes,
                )
                if reused is not None and counts:
                    reused[picked] = logprobs
            for key, norm in optimizers.step(models, cfg.max_grad_norm, update, accelerator).items():
                grad_norms.add(key, norm, 1.0)
    if reused is not None and old_logprobs is not None:
        old_logprobs.copy_(reduce_rows(reused, accelerator))
    means = stats.means(accelerator) | grad_norms.means()
    means["val/ratio_var"] = max(0.0, means.pop("ratio_squared") - means["val/ratio"] ** 2)
    means["perf/shared_prefix"] = float(layout.policy)
    return means


def first_forward_buffer(batch: RolloutBatch, cfg: OnPolicyConfig) -> torch.Tensor | None:
    """(B, R) zeros to collect the old log-probabilities in, when the rollout has none; else None."""
    if batch.logprobs is not None:
        return None
    if not reuses_update_forward(cfg):
        raise ValueError("a rollout without old log-probabilities, where the update's forward cannot give them")
    return torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)


def reduce_rows(rows: torch.Tensor, accelerator) -> torch.Tensor:
    """Each process filled its own rows, zeros elsewhere: their sum is every row."""
    return accelerator.reduce(rows, "sum") if accelerator.num_processes > 1 else rows


def group_order(rng: np.random.Generator, size: int, group: int) -> np.ndarray:
    """The rows of a rollout in a random order of whole groups (a group's rows stay together, in their
    order), so that no minibatch or micro-batch splits a prompt's samples. For one sample per prompt,
    the row permutation of before."""
    groups = rng.permutation(size // group)
    return (groups[:, None] * group + np.arange(group)).ravel()


@dataclass(frozen=True)
class MicroPasses:
    """How a micro-batch's forwards read it: which models read `shared` rows, and whether the old
    log-probabilities are this forward's own (`reuses_update_forward`)."""

    layout: RowLayout
    shared: SharedRows | None
    old_from_this_forward: bool


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
    micro: RolloutBatch,
    cfg: OnPolicyConfig,
    objective: Objective,
    value_options: ValueOptions | None,
    precision: str,
    kl_coef: float,
    update: int,
    share: tuple[float, float] | None,
    normalisers: Normalisers,
    stats: Averages,
    passes: MicroPasses,
) -> torch.Tensor:
    """Forward and backward of one micro-batch: its exact share of the minibatch's loss. `share`: its
    weights in the logged means (None: a lockstep pass whose rows belong to another micro-batch, which
    adds nothing). Returns the old log-probabilities it used, (b, R)."""
    counts = share is not None
    loss_mask = objective.loss_mask(micro) if counts else torch.zeros_like(micro.trained_mask)
    trained = micro.trained_mask  # environment tokens are context, never trained on
    with autocast(micro.responses.device, precision):
        shared = passes.layout.rows_for("policy", passes.shared)
        logprobs, entropy = policy_logprobs(models.policy, micro, cfg.temperature, shared)
        if passes.old_from_this_forward:  # ratio 1 exactly: the K = 1 update's gradient at the sampling policy
            micro = dataclasses.replace(micro, logprobs=logprobs.detach() * trained)
        policy = POLICY_LOSSES[objective.policy_loss](
            logprobs, micro.logprobs, micro.advantages, trained, objective.clip, objective.dual_clip
        )
        terms = {"loss/policy": objective.aggregate(policy.per_token, loss_mask, normalisers.units)}
        if cfg.kl_placement == "loss":
            terms["loss/kl"] = kl_coef * objective.aggregate(
                ops.kl_loss(logprobs, micro.logprobs, micro.ref_logprobs, cfg.kl_estimator),
                loss_mask,
                normalisers.units,
            )
        if cfg.entropy_coef:
            terms["loss/entropy"] = -cfg.entropy_coef * objective.aggregate(entropy, loss_mask, normalisers.units)
        if value_options is not None:
            new_values = value_estimates(models.value, micro, passes.layout.rows_for("value", passes.shared)).float()
            learned = learned_mask(micro)
            value_loss, value_clipfrac = ops.ppo_value_loss(
                new_values, micro.values, micro.returns, learned, value_options.clip_range or None
            )
            value_tokens = (
                float(learned.sum()) if counts else 0.0
            )  # value_loss is a mean over this micro-batch's tokens
            terms["loss/value"] = value_options.coef * value_loss * value_tokens / max(normalisers.tokens, 1e-8)
    loss = sum(terms.values())
    check_finite(update, "loss", loss.detach())
    loss.backward()
    if not counts:
        return micro.logprobs
    weight, value_weight = share
    ratio = torch.exp(logprobs.detach() - micro.logprobs)
    if value_options is not None:
        stats.add("loss/value_avg", value_loss.detach(), value_weight)
        stats.add("val/clipfrac_avg", value_clipfrac, value_weight)
    if "loss/kl" in terms:
        stats.add(
            "loss/kl_avg",
            ops.masked_mean(ops.kl_penalty(logprobs.detach(), micro.ref_logprobs, cfg.kl_estimator), trained),
            value_weight,
        )
    # the policy loss as a mean per unit of this micro-batch: summed with its weights, the minibatch's loss
    stats.add("loss/policy_avg", terms["loss/policy"].detach() / max(weight, 1e-12), weight)
    stats.add("policy/clipfrac_avg", policy.clip_fraction, value_weight)
    stats.add("policy/approxkl_avg", policy.approx_kl, value_weight)
    stats.add("policy/entropy_avg", ops.masked_mean(entropy.detach(), trained), value_weight)
    stats.add("val/ratio", ops.masked_mean(ratio, trained), value_weight)
    stats.add("ratio_squared", ops.masked_mean(ratio**2, trained), value_weight)
    return micro.logprobs
