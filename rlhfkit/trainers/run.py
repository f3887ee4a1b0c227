"""The services every training stage shares, supervised (`supervised.py`) or on-policy (`onpolicy/`):
starting a run (its folder, the checkpoint it resumes, the models it reads, the seeds), the precision
it computes in, its optimizer, the check that a loss stays finite, and its Accelerator.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import find_checkpoint, seed_everything
from ..config import MODEL_OPTIONS, RunConfig, to_yaml
from ..distributed import processes_need_cpu
from ..errors import ConfigError, NonFiniteError
from ..launch import RUN_STAMP
from ..models import check_model_source
from ..run_folder import (
    CONFIG_FILE,
    open_run_folder,
    read_resolved,
    record_resolved,
    require_resume_path,
    resumed_changes,
)
from ..schedules import lr_schedule
from ..sharding import (
    ZERO_STAGES,
    check_sharding,
    deepspeed_plugin,
    fsdp2_plugin,
    use_deepspeed_on_cpu,
    use_fsdp_on_cpu,
)


def is_main_process() -> bool:
    """True on the process that writes files (rank 0 under `accelerate launch`, or the only one)."""
    return int(os.environ.get("RANK", "0")) == 0


def make_run_dir(cfg: RunConfig, stage: str, checkpoint: Path | None) -> Path:
    if cfg.output_dir:
        run_dir = Path(cfg.output_dir)
    elif checkpoint is not None:
        run_dir = checkpoint.parents[1]
    else:
        # one stamp for every process of a launch: their clocks may cross a second apart
        stamp = os.environ.get(RUN_STAMP) or format(datetime.now(), "%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{stage}-{stamp}"
    changes = []
    if checkpoint is not None:
        changes = resumed_changes(checkpoint.parents[1], to_yaml(cfg, stage), cfg.resume)
    if is_main_process():
        for line in changes:
            print(line)
        continuing = checkpoint is not None and checkpoint.parents[1].resolve() == run_dir.resolve()
        open_run_folder(run_dir, to_yaml(cfg, stage), cfg.overwrite, continuing)
    return run_dir


def check_model_sources(cfg: RunConfig) -> None:
    """Every model the run reads can load, as far as can be told without loading it."""
    for key in MODEL_OPTIONS:
        if getattr(cfg, key, ""):
            check_model_source(getattr(cfg, key), key)


def start_run(cfg: RunConfig, stage: str) -> tuple[RunConfig, Path, Path | None]:
    """(the config with its `auto` options resolved (`settled`), run directory, checkpoint to resume or
    None), with every RNG seeded before any model is built, so `seed` also governs the reward head (an
    added [PAD] row is zero: vocab.match_vocab)."""
    check_sharding(cfg.sharding_options)
    # a bad resume path or model fails before any folder is made
    checkpoint = resume_checkpoint(cfg, stage)
    check_model_sources(cfg)
    run_dir = make_run_dir(cfg, stage, checkpoint)
    if checkpoint is not None and is_main_process():
        carry_history(checkpoint.parents[1], run_dir)
    cfg = settled(cfg, run_dir, checkpoint)
    seed_everything(cfg.seed)
    return cfg, run_dir, checkpoint


# the options whose `auto` depends on the machine or the data: what they resolved to is recorded in the run
# folder's resolved.yaml when they resolve, and a resumed run keeps it
KEPT_ON_RESUME = ("mixed_precision", "decoding", "data_format", "prompt_format")


def settled(cfg: RunConfig, run_dir: Path, checkpoint: Path | None) -> RunConfig:
    """`cfg` with `mixed_precision` and `decoding` resolved, recorded in resolved.yaml with the thread
    count and the device. A resumed run takes every `auto` option as its first part resolved it, and
    its thread count, so it computes as it did on whatever machine it continues (docs/reproduction.md)."""
    recorded = read_resolved(checkpoint.parents[1]) if checkpoint is not None else {}
    kept = {k: recorded[k] for k in KEPT_ON_RESUME if getattr(cfg, k, None) == "auto" and k in recorded}
    fresh = {}
    if cfg.mixed_precision == "auto" and "mixed_precision" not in kept:
        fresh["mixed_precision"] = "bf16" if native_bf16() else "no"
    if getattr(cfg, "decoding", None) == "auto" and "decoding" not in kept:
        fresh["decoding"] = "eager" if processes_need_cpu() else "cuda-graphs"
    if kept.get("mixed_precision") == "bf16" and not native_bf16():
        print(
            "rlhfkit: this run computes in bf16, as it did when it started (resolved.yaml); this machine has no "
            "native bf16, so it continues in emulated bf16, slower, to stay exact"
        )
    keep_thread_count(recorded.get("threads"))
    if is_main_process():
        record_resolved(run_dir, kept | fresh | {"threads": torch.get_num_threads(), "device": device_name()})
    return dataclasses.replace(cfg, **kept, **fresh)


def keep_thread_count(threads: int | None) -> None:
    """A resumed run's thread count as its first part's: a CPU's matmuls may sum in another order with
    another count."""
    if threads and threads != torch.get_num_threads():
        print(f"rlhfkit: using {threads} threads, as the run did when it started (this machine's default: "
              f"{torch.get_num_threads()})")
        torch.set_num_threads(threads)


def device_name() -> str:
    if processes_need_cpu():
        return f"cpu ({platform.processor() or platform.machine()})"
    return f"cuda ({torch.cuda.get_device_name()})"


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention kernel transformers chose for `model` (sdpa, eager, flash_attention_2, ...)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "unknown")


def record_settings(run_dir: Path, values: dict[str, Any]) -> None:
    """What an `auto` option or the machine resolved to once the run's data or models showed it."""
    if is_main_process():
        record_resolved(run_dir, values)


def carry_history(source: Path, run_dir: Path) -> None:
    """Resuming into a new folder: bring the curves and base-model samples along, so the new run's
    plots and report cover the whole run, not just the part after the checkpoint."""
    for name in ("metrics.jsonl", "samples_base.jsonl"):
        kept, target = source / name, run_dir / name
        if kept.is_file() and not target.exists() and source.resolve() != run_dir.resolve():
            shutil.copy2(kept, target)


def resume_checkpoint(cfg: RunConfig, stage: str) -> Path | None:
    if not cfg.resume:
        return None
    require_resume_path(cfg.resume)
    ckpt = find_checkpoint(cfg.resume)
    if ckpt is None:
        raise ConfigError(
            f"resume={cfg.resume}: no complete checkpoint there (looked for checkpoints/latest)"
            + restart_hint(cfg.resume, stage)
        )
    return ckpt


def restart_hint(resume: str, stage: str) -> str:
    """For a run folder stopped before its first checkpoint: how to start it again, which rerunning does."""
    config = Path(resume) / CONFIG_FILE
    if not config.is_file():
        return ""
    return (
        f"; the run there stopped before its first checkpoint: run the command that started it again, or "
        f"`rlhfkit {stage} --config {config}`, which starts the same run again in its folder"
    )


def native_bf16() -> bool:
    """Whether the device the run trains on computes bf16 natively: a CUDA GPU that supports it, or a
    CPU with AVX-512 BF16 or AMX, where oneDNN's bf16 matmuls run about twice as fast as fp32 ones.
    Other CPUs would emulate bf16, slower than fp32."""
    if not processes_need_cpu():
        return torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, probe, lambda: False)() for probe in probes)


def autocast_precision(cfg: RunConfig) -> str:
    """bf16 autocast where the hardware computes bf16 natively (Detail 8), fp32 otherwise."""
    if cfg.mixed_precision == "auto":
        return "bf16" if native_bf16() else "no"
    return cfg.mixed_precision


def build_optimizer(
    model: torch.nn.Module, cfg: RunConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with the paper's epsilon (Tables 3, 4, 7) and the configured schedule over `total_steps`."""
    trained = [p for p in model.parameters() if p.requires_grad]  # a LoRA adapter's, not the frozen base's
    optimizer = torch.optim.AdamW(
        trained, lr=cfg.learning_rate, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )
    return optimizer, lr_schedule(optimizer, cfg.lr_scheduler, cfg.warmup_steps, total_steps)


def check_finite(step: int, name: str, value: torch.Tensor) -> None:
    if not torch.isfinite(value).all():
        raise NonFiniteError(
            f"step {step}: {name} is {value.item() if value.numel() == 1 else 'non-finite'}; stopping. "
            "The last good checkpoint is untouched; lower the learning rate or inspect the data and resume."
        )


def accelerator_for(cfg: RunConfig, model: torch.nn.Module | None = None):
    """An Accelerator with this run's precision, sharding `model` as `sharding=` asks. accelerate keeps
    the first precision of a process for good and refuses another, but one process may run stages that
    differ in it (the pipeline, a notebook, the tests), so the precision part of its state is reset;
    the process group stays."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    plugin = fsdp2_plugin(model) if model is not None and cfg.sharding == "fsdp2" else None
    zero = deepspeed_plugin(cfg.sharding_options) if model is not None and cfg.sharding in ZERO_STAGES else None
    accelerator = Accelerator(
        cpu=processes_need_cpu(), mixed_precision=autocast_precision(cfg), fsdp_plugin=plugin,
        deepspeed_plugin=zero,
    )
    on_cpu_processes = processes_need_cpu() and accelerator.num_processes > 1
    if plugin is not None and on_cpu_processes:
        use_fsdp_on_cpu(accelerator, plugin)
    if zero is not None and on_cpu_processes:
        use_deepspeed_on_cpu(accelerator, zero, autocast_precision(cfg))
    return accelerator
