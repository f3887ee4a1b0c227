"""Fields every benchmark prints: where it ran and its peak memory."""

from __future__ import annotations

import platform
import resource

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
