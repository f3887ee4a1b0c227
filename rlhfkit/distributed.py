"""Multi-process launch through `accelerate` and a smoke check that the processes agree.

`rlhfkit <stage> ... --num-processes N` re-runs the same command under `accelerate launch`
(CPU processes talk over gloo, GPUs over NCCL). `accelerate launch -m rlhfkit <stage> ...` works too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def inside_launcher() -> bool:
    return "LOCAL_RANK" in os.environ or "ACCELERATE_PROCESS_ID" in os.environ


def launch_command(argv: list[str], num_processes: int) -> list[str]:
    """The `accelerate launch` command that runs `rlhfkit <argv>` on `num_processes` (>= 2) processes."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(num_processes)]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", os.environ.get("RLHFKIT_PORT", "29517")]
    # accelerate's torchrun-based launcher also serves CPU processes: each process then builds
    # `Accelerator(cpu=True)`, which joins a gloo process group (`--cpu` alone would start only one).
    cmd += ["--multi_gpu", "--num_cpu_threads_per_process", str(max(1, (os.cpu_count() or 1) // num_processes))]
    return [*cmd, "-m", "rlhfkit", *argv]


def relaunch(argv: list[str], num_processes: int) -> int:
    return subprocess.call(launch_command(argv, num_processes))


class OneProcess:
    """What the trainers ask of an `accelerate.Accelerator`, for code run in a single process without
    one (tests, benchmarks, notebooks): rank 0 of 1, and nothing to reduce or gather."""

    process_index, num_processes, is_main_process = 0, 1, True

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def wait_for_everyone(self) -> None:
        pass


ONE_PROCESS = OneProcess()


def processes_need_cpu() -> bool:
    """True without CUDA, or with fewer GPUs than processes on this machine (each process needs its own)."""
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return not torch.cuda.is_available() or torch.cuda.device_count() < local_processes


def check_agreement() -> dict:
    """Every process computes the same tiny thing; all-reduce and gather prove they talk and agree."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=processes_need_cpu())
    rank, world = accelerator.process_index, accelerator.num_processes
    total = accelerator.reduce(torch.tensor([float(rank + 1)], device=accelerator.device), reduction="sum").item()
    torch.manual_seed(0)
    probe = torch.nn.Linear(4, 1).to(accelerator.device)
    value = probe(torch.ones(1, 4, device=accelerator.device)).detach().reshape(1)
    gathered = accelerator.gather(value).cpu()
    result = {
        "rank": rank,
        "world_size": world,
        "backend": str(getattr(accelerator.state, "backend", None)),
        "rank_sum": total,
        "rank_sum_expected": world * (world + 1) / 2,
        "seeded_outputs_agree": bool(torch.allclose(gathered, gathered[0].expand_as(gathered))),
    }
    result["ok"] = result["rank_sum"] == result["rank_sum_expected"] and result["seeded_outputs_agree"]
    accelerator.wait_for_everyone()
    return result
