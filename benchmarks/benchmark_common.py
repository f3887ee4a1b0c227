"""Fields every benchmark prints (where it ran, its peak memory) and the FLOP counts behind MFU."""

from __future__ import annotations

import platform
import resource
import time

import torch


def best_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def machine_fields(device: torch.device) -> dict:
    """Device name, threads, torch version and the peak memory so far: CUDA's `max_memory_allocated`
    on a GPU, the process's peak RSS on a CPU."""
    cuda = device.type == "cuda"
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "peak_memory_bytes": int(peak),
        "peak_memory_kind": "cuda_allocated" if cuda else "process_rss",
        "torch": torch.__version__,
    }


def shaped_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A causal LM with random weights in the shape of a published config shipped in
    rlhfkit/model_configs (`smollm2-135m`, `pythia-1b-deduped`, `llama-3.2-1b`, ...): the seeds' model
    sizes without downloading them. Dropout off, as every rlhfkit stage has it (Detail 6)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhfkit.model_shape import shipped_config
    from rlhfkit.models import disable_dropout

    fields = shipped_config(name)
    config = AutoConfig.for_model(
        fields.pop("model_type"), **{k: v for k, v in fields.items() if not k.startswith("_")}
    )
    torch.manual_seed(seed)
    return disable_dropout(AutoModelForCausalLM.from_config(config, dtype=torch.float32))


def shape_special_ids(model: torch.nn.Module) -> tuple[int, int]:
    """(EOS, PAD) of a random-weight shape: the config's first EOS, and its PAD or else the last id."""
    config = model.config
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    return eos, config.pad_token_id if config.pad_token_id is not None else config.vocab_size - 1


def matmul_peak_gflops(
    dtype: torch.dtype, device: torch.device, sizes: list[int] = (1024, 2048), seconds: float = 1.0
) -> float:
    """The best GFLOP/s of square `dtype` matmuls of the given sizes on `device`, each timed for about
    `seconds` after one warm-up call."""
    best = 0.0
    for size in sizes:
        a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
        torch.mm(a, b)
        calls, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize()
            calls += 1
        best = max(best, 2 * size**3 * calls / (time.perf_counter() - began) / 1e9)
    return round(best, 1)
