"""What the trainers need of the processes of a launch (`launch.py` starts them): the device, a
stand-in for the accelerator in a single process, each process's share of a batch, and a smoke check
that the processes agree."""

from __future__ import annotations

import json
import os
import sys

import torch


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


def process_share(count: int, rank: int, processes: int) -> slice:
    """The contiguous part of `count` items (an update's prompts or rows) that process `rank` handles."""
    per_process = count // processes
    return slice(rank * per_process, (rank + 1) * per_process)


def leave_process_group() -> None:
    """End this process's part in the launch's process group after the others have finished theirs:
    a process that exits first closes its connections while another may still be tearing gloo down,
    which aborts that one now and then. Not after a failure, when a peer may be gone for good."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


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


def run_dist_check(_: None) -> int:
    """`rlhfkit dist-check`: one line per process saying whether the processes communicate and agree."""
    result = check_agreement()
    # one write per line: processes share stdout, and print() writes the text and the newline apart
    sys.stdout.write("dist-check " + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["ok"] else 1
