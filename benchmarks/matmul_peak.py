"""The machine's measured matmul peak in GFLOP/s, fp32 and bf16, printed as one JSON line per precision:
the denominator of the model FLOPs utilisation (MFU) that the training benchmarks report.

    python benchmarks/matmul_peak.py
    python benchmarks/matmul_peak.py --sizes 512 --seconds 0.2   # smoke test

For each precision, square matmuls of each `--sizes` are timed for about `--seconds` each after a
warm-up; the best rate over the sizes is the peak. On a CPU the threads are torch's (set
`--threads` to what the benchmarks use); bf16 runs on oneDNN's native kernels where the CPU has
AVX-512 BF16 or AMX, otherwise it is emulated and slower than fp32.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from benchmark_common import best_device, machine_fields, matmul_peak_gflops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,2048", help="square matmul sizes, comma separated")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per size and precision")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = best_device()
    sizes = [int(s) for s in args.sizes.split(",")]
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates = {size: matmul_peak_gflops(dtype, device, [size], args.seconds) for size in sizes}
        print(json.dumps({"benchmark": "matmul_peak", "precision": name, "peak_gflops": max(rates.values()),
                          "gflops_by_size": rates} | machine_fields(device)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
