"""Fields every benchmark prints (where it ran, its peak memory), the FLOP counts behind MFU and the bytes
and bandwidth behind a decoding step's memory limit."""

from __future__ import annotations

import platform
import resource
import statistics
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


def memory_bandwidth_gb_per_s(device: torch.device, megabytes: int = 256, repeats: int = 5) -> dict[str, float]:
    """The machine's measured memory bandwidth at torch's thread count, GB/s: `copy`, a `megabytes` fp32
    tensor copied into another (bytes read plus written, as STREAM counts a copy), and `read`, the same
    tensor summed (bytes read); each the median of `repeats` timings after one warm-up. The tensors are
    far larger than the caches, so each pass goes to memory."""
    source = torch.randn(megabytes * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    passes = {"copy": (lambda: target.copy_(source), 2), "read": (source.sum, 1)}
    rates = {}
    for name, (run, reads_and_writes) in passes.items():
        run()
        seconds = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - began)
        rates[name] = round(reads_and_writes * source.nbytes / statistics.median(seconds) / 1e9, 2)
    return rates


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads, in the dtype each is stored and run in: every parameter
    once (`parameters()` yields a tied embedding once, as the LM head that reads it whole), except an
    input embedding that is not the LM head's: of that a step reads only its rows' vectors."""
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings().weight
    untied = embedding if head is None or head.weight is not embedding else None
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not untied)


def kv_cache_bytes_per_position(config, dtype: torch.dtype) -> int:
    """Bytes of the keys and values of one position of one row: layers x 2 x kv heads x head dim x the
    element size."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
