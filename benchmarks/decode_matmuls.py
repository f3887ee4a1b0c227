"""The weight matmuls of one decoding step, alone: every linear layer of a model (the LM head included)
applied in turn to `--rows` rows, as a step applies them, with torch's default CPU kernel and with
oneDNN's prepacked one, printed as one JSON line. It asks how near the memory limit a step's matmuls
can run at all with the kernels torch ships, whatever surrounds them (docs/performance.md, "Decoding
beside the memory limit").

    python benchmarks/decode_matmuls.py --model smollm2-135m --rows 8
    python benchmarks/decode_matmuls.py --model tiny --rows 2 --repeats 1   # smoke test

Kernels: `linear` is `torch.nn.functional.linear`, what the model runs (MKL's sgemm in fp32 on a CPU);
`onednn_packed` is `torch.ops.mkldnn._linear_pointwise` on weights reordered once by
`_reorder_linear_weight`, as inductor's freezing runs linear layers on a CPU. Its sums are in another
order, so its outputs differ in the last bits (`onednn_max_abs_diff`): not a drop-in for identical tokens.
Each kernel's pass over every layer is timed `--repeats` times after a warm-up; the median is reported
as ms per step, with the GB/s of weights it reads and the GFLOP/s it computes (2 x rows per weight).
The model's shape comes from rlhfkit/model_configs (random weights: the values do not change the time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from benchmark_common import machine_fields, shaped_model


def pass_seconds(run, repeats: int) -> float:
    run()
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a shipped config's name, or 'tiny'")
    parser.add_argument("--rows", type=int, default=8, help="rows a step decodes (GRPO's shape: 8)")
    parser.add_argument("--repeats", type=int, default=9, help="timed passes; the median is reported")
    args = parser.parse_args()
    if args.model == "tiny":
        from rlhfkit.tiny_models import tiny_policy

        model = tiny_policy()[0]
    else:
        model = shaped_model(args.model)
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(args.rows, w.size(1)) for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, args.rows) for w in weights]
    kernels = {
        "linear": lambda: [torch.nn.functional.linear(x, w) for x, w in zip(inputs, weights, strict=True)],
        "onednn_packed": lambda: [
            torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for x, p in zip(inputs, packed, strict=True)
        ],
    }
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    flops = 2 * args.rows * sum(w.numel() for w in weights)
    row = {
        "benchmark": "decode_matmuls",
        "model": args.model,
        "rows": args.rows,
        "linear_layers": len(weights),
        "weight_bytes": weight_bytes,
        "repeats": args.repeats,
    }
    with torch.inference_mode():
        for name, run in kernels.items():
            seconds = pass_seconds(run, args.repeats)
            row |= {
                f"{name}_ms": round(1000 * seconds, 3),
                f"{name}_gb_per_s": round(weight_bytes / seconds / 1e9, 2),
                f"{name}_gflops": round(flops / seconds / 1e9, 1),
            }
        differences = [
            (a - b).abs().max() for a, b in zip(kernels["linear"](), kernels["onednn_packed"](), strict=True)
        ]
    row["onednn_max_abs_diff"] = float(max(differences))
    print(json.dumps(row | machine_fields(torch.device("cpu"))))


if __name__ == "__main__":
    main()
