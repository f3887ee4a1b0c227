"""Sharded training (`sharding=fsdp2`): parameters, gradients and optimizer state split across the
processes of a launch, through accelerate's FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each decoder block is sharded on its own and gathered just in time for its forward and backward
passes, then freed (`reshard_after_forward`). What a person reads stays unsharded: a checkpoint
holds the full model (gathered into process 0's unsharded copy, `ShardedRun.gathered`) and the full
optimizer state keyed by parameter name, which resume splits again over however many processes
it has. accelerate only offers FSDP on GPUs; its FSDP2 code runs unchanged over gloo on CPU
processes (checked with torch 2.13), so the tests use it there too.

The on-policy stages (PPO, GRPO, RLOO, REINFORCE) shard all their models with `fully_shard` directly
(`shard_on_policy`): the policy and value model like the supervised model, and the frozen reference
and reward model too, so that no process holds a whole copy of any of the four. Sampling runs on the
gathered policy (`gathered_for_generation`: one all-gather per rollout, then no collective while
decoding, so processes may decode different numbers of steps); every other forward pass gathers one
block at a time, and every process runs the same number of them (`update.micro_batch_plan`).

DeepSpeed ZeRO (`zero2`: gradients and optimizer state split; `zero3`: parameters too) runs the
supervised stages through accelerate's DeepSpeed plugin, an optional extra (`rlhfkit[deepspeed]`).
accelerate offers it only on GPUs; DeepSpeed's engines run unchanged on CPU processes over gloo, so a
CPU launch is switched to it as for FSDP2. Checkpoints are the same as FSDP2's: the full model in
process 0's copy, the full optimizer state keyed by parameter name (`ZeroOptimizerState`). The
on-policy stages refuse ZeRO in one line naming fsdp2.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .config import ShardingOptions, launched_processes
from .devices import is_deepspeed_engine
from .errors import ConfigError
from .models import backbone_of, decoder_layers, wrapped_backbone

ZERO_STAGES = {"zero2": 2, "zero3": 3}


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_sharding(options: ShardingOptions) -> None:
    """Refuse, in one line naming what to use instead, a sharding choice this machine or these options
    cannot run (which stages take which sharding, the registry checks as the config resolves)."""
    if options.sharding == "none":
        return
    if options.sharding in ZERO_STAGES and not deepspeed_installed():
        raise ConfigError(
            f"sharding={options.sharding} needs DeepSpeed: pip install 'rlhfkit[deepspeed]' (or use sharding=fsdp2)"
        )
    if options.frozen_device:
        raise ConfigError(
            f"sharding={options.sharding} with frozen_device={options.frozen_device}: a sharded reference and "
            "reward model live on every process's own device; leave frozen_device empty"
        )
    if options.lora_rank > 0:
        raise ConfigError(
            f"sharding={options.sharding} with lora_rank={options.lora_rank}: choose one (LoRA already keeps "
            "gradients and optimizer state small; sharding splits full fine-tuning)"
        )
    if launched_processes() < 2:  # run unsharded, it would be recorded as sharded and still not fit
        raise ConfigError(
            f"sharding={options.sharding} splits the models across processes and this run has one: add "
            "--num-processes N (N >= 2, one per device), or drop sharding (docs/scaling.md)"
        )


def block_class_names(model: torch.nn.Module) -> list[str]:
    """The decoder block class, sharded one block at a time."""
    return [type(decoder_layers(backbone_of(model))[1][0]).__name__]


def fsdp2_plugin(model: torch.nn.Module):
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=block_class_names(model),
        reshard_after_forward=True,
        state_dict_type="FULL_STATE_DICT",
        cpu_ram_efficient_loading=False,
        activation_checkpointing=False,
    )


def use_fsdp_on_cpu(accelerator, plugin) -> None:
    """accelerate sets up FSDP only for GPU process groups; its FSDP2 preparation works unchanged
    over gloo, so a CPU launch is switched to it here."""
    from accelerate.utils import DistributedType

    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin


def deepspeed_plugin(options: ShardingOptions):
    """ZeRO stage 2 or 3 at this run's micro-batch and gradient clipping. One DeepSpeed step per
    optimizer step: the engine steps when the last micro-batch's backward pass ends (`supervised.run_step`
    marks it), its loss already normalised by rlhfkit, so DeepSpeed's own accumulation stays at 1."""
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(
        zero_stage=ZERO_STAGES[options.sharding],
        gradient_accumulation_steps=1,
        zero3_save_16bit_model=True,
        zero3_init_flag=False,
    )
    plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = options.micro_batch_size
    plugin.deepspeed_config["gradient_clipping"] = options.max_grad_norm if options.max_grad_norm > 0 else 0.0
    return plugin


def use_deepspeed_on_cpu(accelerator, plugin, precision: str) -> None:
    """accelerate sets up DeepSpeed only on GPUs; DeepSpeed's ZeRO engines run over gloo on CPU processes."""
    from accelerate.utils import DistributedType

    plugin.set_mixed_precision(precision)
    plugin.select(_from_accelerator_state=True)
    accelerator.state.deepspeed_plugins = plugin
    accelerator.state.distributed_type = DistributedType.DEEPSPEED


def backward(accelerator, model: Any, loss: torch.Tensor, last: bool) -> None:
    """The backward pass of one micro-batch; a DeepSpeed engine reduces, clips and steps after the
    last one of the optimizer step. The engine is driven directly: accelerate dispatches on its
    distributed type, which `prepare` sets back to MULTI_CPU on CPU processes."""
    if not is_deepspeed_engine(model):
        accelerator.backward(loss)
        return
    model.set_gradient_accumulation_boundary(last)
    model.backward(loss)
    if last:
        model.step()


def clipped_grad_norm(accelerator, model: Any, max_norm: float) -> torch.Tensor:
    """The step's gradient norm before clipping (a DeepSpeed engine clipped it inside its step)."""
    if is_deepspeed_engine(model):
        return torch.as_tensor(float(model.get_global_grad_norm()))
    return accelerator.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))


@dataclass
class ShardedRun:
    """The sharded model, its optimizer, and process 0's unsharded copy that checkpoints and the
    final model are gathered into."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    gathered: torch.nn.Module | None  # process 0 only

    @classmethod
    def keep_copy(cls, model: torch.nn.Module, is_main: bool) -> torch.nn.Module | None:
        """Before sharding: process 0's unsharded copy (with the buffers that no state dict holds)."""
        return copy.deepcopy(model) if is_main else None

    def gather(self) -> torch.nn.Module | None:
        """The full weights in process 0's copy (every process must call this: it is a collective)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.gathered is not None:
            self.gathered.load_state_dict(full)
        return self.gathered

    def describe(self, processes: int) -> str:
        """A line for the run log: how much of the model this process holds."""
        from torch.distributed.tensor import DTensor

        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in self.model.parameters())
        total = sum(p.numel() for p in self.model.parameters())
        return f"sharding: fsdp2 over {processes} processes; this process holds {local:,} of {total:,} parameter values"

    def optimizer_state(self) -> ShardedOptimizerState:
        return ShardedOptimizerState(self.model, self.optimizer)


@dataclass
class ZeroRun:
    """`ShardedRun` for a DeepSpeed engine (`model`) prepared by `accelerator`."""

    accelerator: Any
    model: Any
    gathered: torch.nn.Module | None  # process 0 only
    stage: int

    def gather(self) -> torch.nn.Module | None:
        """The full weights in process 0's copy (a collective under ZeRO-3)."""
        full = self.model._zero3_consolidated_16bit_state_dict() if self.stage == 3 else self.model.module.state_dict()
        if self.gathered is not None:
            self.gathered.load_state_dict(full, strict=False)  # a tied LM head is the embedding, saved once
        return self.gathered

    def describe(self, processes: int) -> str:
        if self.stage == 3:
            params = list(self.model.module.parameters())
            local, total = sum(p.ds_tensor.numel() for p in params), sum(p.ds_numel for p in params)
            held = f"this process holds {local:,} of {total:,} parameter values"
            return f"sharding: zero3 over {processes} processes; {held}"
        partitions = self.model.optimizer.single_partition_of_fp32_groups
        local, total = (
            sum(p.numel() for p in partitions),
            sum(p.numel() for p in self.model.module.parameters() if p.requires_grad),
        )
        return (
            f"sharding: zero2 over {processes} processes; parameters whole on each, this process holds {local:,} of "
            f"{total:,} "
            "optimizer-state values"
        )

    def optimizer_state(self) -> ZeroOptimizerState:
        return ZeroOptimizerState(self.model)


@dataclass
class ZeroOptimizerState:
    """A DeepSpeed ZeRO optimizer's AdamW state as one full dict keyed by parameter name, the layout
    `ShardedOptimizerState` writes (`state_dict`, a collective), and back into this launch's partitions."""

    engine: Any

    def named(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.engine.module.named_parameters() if p.requires_grad]

    def flat_partitions(self) -> list[torch.Tensor]:
        """This process's flat fp32 partitions, the tensors AdamW's state is keyed by (ZeRO-3, ZeRO-2)."""
        zero = self.engine.optimizer
        return list(getattr(zero, "fp32_partitioned_groups_flat", None) or zero.single_partition_of_fp32_groups)

    def inner(self) -> torch.optim.Optimizer:
        return self.engine.optimizer.optimizer  # the torch AdamW stepping ZeRO's flat partitions

    def state_dict(self) -> dict[str, Any]:
        from deepspeed.utils import safe_get_full_optimizer_state

        steps = [s["step"] for s in self.inner().state.values() if "step" in s]
        step = steps[0].clone() if steps else torch.tensor(0.0)
        state = {
            name: {
                "step": step.clone(),
                "exp_avg": safe_get_full_optimizer_state(p, "exp_avg"),
                "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq"),
            }
            for name, p in self.named()
        }
        groups = [
            {k: v for k, v in g.items() if k != "params"} | {"params": [n for n, _ in self.named()]}
            for g in self.inner().param_groups[:1]
        ]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        inner = self.inner()
        step = next(iter(state["state"].values()))["step"]
        for group in inner.param_groups:  # the learning rate the schedule had reached, among others
            group.update({k: v for k, v in state["param_groups"][0].items() if k != "params"})
        for flat in self.flat_partitions():  # AdamW creates its state lazily, at the first step
            inner.state.setdefault(flat, {"exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)})
            inner.state[flat]["step"] = step.clone().float()
        # ZeRO-2 links each parameter to its slice of that state after its first step; link it now
        link = getattr(self.engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:
            link()
        for name, p in self.named():
            for key in ("exp_avg", "exp_avg_sq"):
                safe_set_full_optimizer_state(p, state["state"][name][key], key)


def shard_groups(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded one by one, innermost first: each decoder block, then a causal LM whole; a
    scalar model's backbone and each head apart, because its value and score paths call them directly
    (`per_token_scores`), never through the scalar model's own forward."""
    wrapped = wrapped_backbone(model)
    if wrapped is not None:
        heads = [child for child in model.children() if child is not wrapped]
        return [*decoder_layers(wrapped)[1], wrapped, *heads]
    return [*decoder_layers(backbone_of(model))[1], model]


def shard_in_place(model: torch.nn.Module, device: torch.device, trained: bool) -> None:
    """Split `model`'s parameters over every process of the launch. A trained model's gradients are
    summed across processes, not averaged: each process's loss is already weighted by its share of
    the whole minibatch (`update.update_on_rollout`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    for module in shard_groups(model):
        fully_shard(module, mesh=mesh, reshard_after_forward=True)
        if trained:  # a plain sum: gloo has no pre-scaled sum, which a divide factor would otherwise ask for
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def shard_on_policy(models: Any, device: torch.device, is_main: bool) -> dict[str, torch.nn.Module | None]:
    """Shard an on-policy stage's four models (`OnPolicyModels`) over the launch's processes; return
    process 0's unsharded copies of the trained ones ("policy", "value"), kept on the host, which
    checkpoints and the final model are gathered into."""
    trained = {"policy": models.policy, "value": models.value}
    copies = {name: ShardedRun.keep_copy(model, is_main) for name, model in trained.items() if model is not None}
    for model in models.trained():
        shard_in_place(model, device, trained=True)
    for model in models.frozen():
        shard_in_place(model, device, trained=False)
    return copies


def fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered_for_generation(model: torch.nn.Module) -> Iterator[None]:
    """The whole of a sharded `model` on every process while it samples (a collective on entry and
    exit; nothing for a model that is not sharded). Decoding then needs no collective per token, so
    processes may stop at different lengths without waiting for each other (the hang of TRL #3858)."""
    groups = fsdp_modules(model)
    for module in groups:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for module in groups:
            module.reshard()
            module.set_reshard_after_forward(True, recurse=False)


def full_number(value: torch.Tensor) -> torch.Tensor:
    """A sharded model's reduction (a gradient norm) as a plain tensor."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


@dataclass
class ShardedOptimizerState:
    """The sharded optimizer's state as one full, name-keyed dict (`state_dict`, a collective; full on
    process 0), and back from such a dict into this launch's shards (`load_state_dict`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


@dataclass
class SavedState:
    """A state dict already gathered, handed to `save_checkpoint` where it expects an optimizer."""

    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.state
