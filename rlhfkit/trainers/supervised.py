"""The optimizer steps every supervised stage shares (SFT, reward model, DPO), run by the loop driver
(`loop.py`); the services every stage shares (start-up, precision, optimizer) are `run.py`'s.

A stage gives examples, a collate function and a loss function; `train` owns the data order,
gradient accumulation, the optimizer and schedule (Tables 3-4), non-finite checks and checkpoints
with exact resume. Data order is a function of (seed, step) alone,
so resuming at step k replays exactly the batches an uninterrupted run would see.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import (
    apply_schedule,
    load_optimizer_state,
    load_training_state,
    save_checkpoint,
    seed_everything,
)
from ..config import TrainConfig, check_batch_split
from ..devices import is_deepspeed_engine
from ..errors import ConfigError
from ..models import enable_activation_checkpointing
from ..preemption import resume_command
from ..sharding import (
    ZERO_STAGES,
    SavedState,
    ShardedRun,
    ZeroRun,
    backward,
    clipped_grad_norm,
)
from .loop import run_loop
from .run import accelerator_for, build_optimizer, check_finite

# loss_fn(model, batch) -> (loss summed over the batch's units, extra metrics summed the same way).
# A collated batch carries `loss_units` (per row: tokens for SFT, 1 per pair for the RM).
LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class Schedule:
    examples: int
    total_batch_size: int
    micro_batch_size: int
    processes: int
    steps_per_epoch: int
    total_steps: int

    @property
    def accumulation(self) -> int:
        return self.total_batch_size // (self.micro_batch_size * self.processes)


def plan_schedule(cfg: TrainConfig, examples: int, processes: int) -> Schedule:
    check_batch_split(cfg, processes)  # as the config was checked, now on the processes the run has
    steps_per_epoch = examples // cfg.total_batch_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"only {examples} training examples, fewer than total_batch_size={cfg.total_batch_size}"
        )
    total = cfg.max_steps or max(1, math.floor(cfg.num_epochs * steps_per_epoch))
    return Schedule(examples, cfg.total_batch_size, cfg.micro_batch_size, processes, steps_per_epoch, total)


def batch_indices(
    schedule: Schedule, seed: int, step: int, rank: int, lengths: Sequence[int] | None = None
) -> list[list[int]]:
    """Micro-batches of example indices for optimizer step `step` on process `rank`.

    Each epoch is a fresh permutation drawn from (seed, epoch), sampled without replacement. Given
    the examples' `lengths`, a step's examples are cut into micro-batches in order of length: the step
    sees the same examples (its loss is normalised over all of them), but each micro-batch pads only
    to rows of similar length instead of to the longest row drawn with it.
    """
    epoch, offset = divmod(step, schedule.steps_per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(schedule.examples)
    start = offset * schedule.total_batch_size
    per_rank = schedule.micro_batch_size * schedule.accumulation
    mine = order[start + rank * per_rank : start + (rank + 1) * per_rank].tolist()
    if lengths is not None:
        mine.sort(key=lambda i: lengths[i])
    return [mine[i : i + schedule.micro_batch_size] for i in range(0, per_rank, schedule.micro_batch_size)]


@dataclass
class SupervisedStage:
    name: str
    model: torch.nn.Module
    tokenizer: Any
    examples: list[Any]
    collate: Callable[[list[Any]], dict[str, torch.Tensor]]
    loss_fn: LossFn
    evaluate: Callable[[torch.nn.Module, int], dict[str, float]] | None = None
    # padded width of an example, for length-bucketed micro-batches
    length: Callable[[Any], int] | None = None


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens a batch runs through the model (none for a batch of cached features)."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else 0


@dataclass
class SupervisedSteps:
    """A supervised stage's optimizer steps, as the loop driver runs them."""

    stage: SupervisedStage
    cfg: TrainConfig
    run_dir: Path
    accelerator: Any
    schedule: Schedule
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    lengths: Sequence[int] | None
    sharded: ShardedRun | ZeroRun | None = None
    unit: str = "step"

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def total(self) -> int:
        return self.schedule.total_steps

    def step(self, index: int, _show) -> dict[str, float]:
        began = time.perf_counter()
        metrics, tokens = run_step(
            self.accelerator, self.model, self.stage, self.schedule, self.cfg, index, self.lengths
        )
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses: read before the schedule moves on
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - began
        return metrics | {"train/lr": lr, "perf/tokens_per_s": tokens / elapsed, "perf/step_s": elapsed}

    def evaluate(self, done: int) -> dict[str, float]:
        if not self.stage.evaluate:
            return {}
        return self.stage.evaluate(in_training(self.accelerator, self.model), done)

    def save(self, done: int) -> None:
        model, optimizer = in_training(self.accelerator, self.model), self.optimizer
        if self.sharded is not None:  # gathered on every process, written by process 0
            model, optimizer = self.sharded.gather(), SavedState(self.sharded.optimizer_state().state_dict())
        save(self.accelerator, self.run_dir, done, model, self.stage.tokenizer, optimizer, self.scheduler,
             self.schedule, self.cfg.keep_checkpoints)

    def finish(self) -> dict[str, float]:
        if not self.stage.evaluate:
            return {}
        return self.stage.evaluate(unwrap(self.accelerator, self.model), self.total)

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"loss": f"{metrics['train/loss']:.4f}", "lr": f"{metrics['train/lr']:.2e}",
                "tok_s": f"{metrics['perf/tokens_per_s']:.0f}"}


def train(
    cfg: TrainConfig, stage: SupervisedStage, run_dir: Path, checkpoint: Path | None = None,
    resume: str | None = None,
) -> dict[str, Any]:
    """Run the optimizer steps of `stage`, resuming from `checkpoint` when given. `resume` is the command a
    preempted run prints to continue (default: `rlhfkit <stage> resume=<run_dir>`)."""
    accelerator = accelerator_for(cfg, stage.model)
    seed_everything(cfg.seed)
    schedule = plan_schedule(cfg, len(stage.examples), accelerator.num_processes)
    model = stage.model
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    optimizer, scheduler = build_optimizer(model, cfg, schedule.total_steps)
    fsdp = accelerator.is_fsdp2  # read before prepare, which may reset accelerate's view of it on CPU
    zero = accelerator.state.deepspeed_plugin is not None
    gathered = ShardedRun.keep_copy(model, accelerator.is_main_process) if fsdp or zero else None
    # a sharded optimizer's state loads after sharding, split over this launch's processes
    start = 0
    if checkpoint:
        start = load_training_state(checkpoint, None if fsdp or zero else optimizer, scheduler)["step"]
    model, optimizer = accelerator.prepare(model, optimizer)
    sharded = (ShardedRun(model, optimizer, gathered) if fsdp else
               ZeroRun(accelerator, model, gathered, ZERO_STAGES[cfg.sharding]) if zero else None)
    if sharded is not None and accelerator.is_main_process:
        print(sharded.describe(accelerator.num_processes))
    if sharded is not None and checkpoint:
        load_optimizer_state(checkpoint, sharded.optimizer_state())
        apply_schedule(scheduler)
    model.train()
    lengths = [stage.length(e) for e in stage.examples] if stage.length else None
    steps = SupervisedSteps(stage, cfg, run_dir, accelerator, schedule, model, optimizer, scheduler, lengths,
                            sharded)
    resume = resume or resume_command(stage.name, run_dir, accelerator.num_processes)
    last = run_loop(steps, cfg, run_dir, start, accelerator, resume)
    final_model = sharded.gather() if sharded is not None else unwrap(accelerator, model)
    return {"model": final_model, "steps": schedule.total_steps, "schedule": dataclasses.asdict(schedule),
            "last_metrics": last}


def run_step(accelerator, model, stage: SupervisedStage, schedule: Schedule, cfg: TrainConfig, step: int,
             lengths: Sequence[int] | None) -> tuple[dict[str, float], int]:
    """Forward and backward over this process's micro-batches; return averaged metrics and tokens seen."""
    indices = batch_indices(schedule, cfg.seed, step, accelerator.process_index, lengths)
    micro = [stage.collate([stage.examples[i] for i in idx]) for idx in indices]
    micro = [{k: v.to(accelerator.device) for k, v in b.items()} for b in micro]
    # Normalise by the units (tokens or pairs) of the whole effective batch, over all processes:
    # gradient accumulation then equals one large batch. DDP averages over processes, hence x processes.
    units = accelerator.reduce(sum(b["loss_units"].sum() for b in micro).float(), "sum")
    loss_total = torch.zeros((), device=accelerator.device)
    extra_total: dict[str, torch.Tensor] = {}
    for i, batch in enumerate(micro):
        # all-reduce gradients once per optimizer step, after the last micro-batch
        last = i == len(micro) - 1
        sync = contextlib.nullcontext() if last else accelerator.no_sync(model)
        with sync:
            with accelerator.autocast():
                loss_sum, extra = stage.loss_fn(model, batch)
            check_finite(step + 1, "loss", loss_sum.detach())
            backward(accelerator, model, loss_sum * accelerator.num_processes / units, last)
        loss_total += loss_sum.detach().float()
        for key, value in extra.items():
            extra_total[key] = extra_total.get(key, 0) + value.detach().float()
    grad_norm = clipped_grad_norm(accelerator, model, cfg.max_grad_norm)
    check_finite(step + 1, "gradient norm", torch.as_tensor(grad_norm))
    totals = accelerator.reduce(torch.stack([loss_total, *extra_total.values()]), "sum") / units
    metrics = {"train/loss": totals[0].item(), "train/grad_norm": float(grad_norm)}
    metrics |= {key: totals[i + 1].item() for i, key in enumerate(extra_total)}
    return metrics, sum(count_tokens(b) for b in micro) * accelerator.num_processes


def unwrap(accelerator, model):
    """The bare model, without DDP or the autocast wrapper: evaluation after training runs in fp32,
    exactly as a later `from_pretrained` load would. Removing the wrapper is permanent, so this is
    only for the model training has finished with. A DeepSpeed engine stays as it is: its forward
    gathers ZeRO-3's parameters, and it has no autocast wrapper."""
    return model if is_deepspeed_engine(model) else accelerator.unwrap_model(model, keep_fp32_wrapper=False)


def in_training(accelerator, model):
    """The model without DDP but with its autocast wrapper, for checkpoints and evaluations between
    steps: removing the wrapper there would train every later step in fp32, and a resumed run (which
    wraps afresh) would then differ from an uninterrupted one. A DeepSpeed engine stays (see `unwrap`)."""
    return model if is_deepspeed_engine(model) else accelerator.unwrap_model(model, keep_fp32_wrapper=True)


def save(accelerator, run_dir: Path, step: int, model, tokenizer, optimizer, scheduler, schedule: Schedule,
         keep: int) -> None:
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"examples_seen": step * schedule.total_batch_size, "epoch": step / schedule.steps_per_epoch}
        save_checkpoint(run_dir, step, model, tokenizer, optimizer, scheduler, state, keep)
    accelerator.wait_for_everyone()
