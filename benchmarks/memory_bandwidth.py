"""The machine's measured memory bandwidth in GB/s, printed as one JSON line: the denominator of the
memory limit beside each decoding step that generation.py reports.

    python benchmarks/memory_bandwidth.py --threads 2
    python benchmarks/memory_bandwidth.py --megabytes 16 --repeats 1   # smoke test

`copy`: a `--megabytes` fp32 tensor copied into another, counting the bytes read and written (as STREAM
counts a copy); `read`: the same tensor summed, counting the bytes read. Each is the median of
`--repeats` timings after a warm-up, at torch's thread count (`--threads`). generation.py runs this
script in a child process, so that its tensors do not raise the peak memory the benchmark reports.
"""

from __future__ import annotations

import argparse
import json

import torch
from benchmark_common import best_device, machine_fields, memory_bandwidth_gb_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=256, help="size of the tensor read and copied")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes; the median is reported")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = best_device()
    rates = memory_bandwidth_gb_per_s(device, args.megabytes, args.repeats)
    print(
        json.dumps(
            {"benchmark": "memory_bandwidth", "megabytes": args.megabytes}
            | {f"{name}_gb_per_s": rate for name, rate in rates.items()}
            | machine_fields(device)
        )
    )


if __name__ == "__main__":
    main()
