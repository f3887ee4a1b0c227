"""DPO on real TL;DR comparisons with LoRA beside the full fine-tune, at the same steps: held-out
preference accuracy (with the "prefer the longer summary" baseline beside it), seconds per step and
peak memory of each run. Each run is its own `rlhfkit dpo` process; its peak memory is the child's
peak RSS on a CPU (`ru_maxrss`), read from `wait4`.

    python benchmarks/lora_vs_full.py --model smollm2-135m --steps 30 --out runs/lora-vs-full

Prints one JSON object: the shared settings, and per run the metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "summarize-from-feedback-comparisons"


def run_dpo(options: dict[str, object], out: Path) -> dict[str, object]:
    command = [
        sys.executable,
        "-m",
        "rlhfkit",
        "dpo",
        "--preset",
        "tldr-dpo",
        *(f"{k}={v}" for k, v in options.items()),
        f"output_dir={out}",
    ]
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"  # a file, not a pipe: nobody reads a pipe until the run ends
    began = time.perf_counter()
    with log.open("w") as output:
        proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{log.read_text()[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_seconds = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    overall = json.loads((out / "rm_eval" / "rm_eval.json").read_text())["breakdown"]["overall"]
    last_val = next((r for r in reversed(rows) if "val/accuracy" in r), {})
    return {
        "wall_s": round(seconds, 1),
        "step_s_median": round(statistics.median(step_seconds), 3) if step_seconds else None,
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "val_accuracy": last_val.get("val/accuracy"),
        "val_loss": last_val.get("val/loss"),
        "held_out": {
            k: overall[k]
            for k in ("count", "accuracy", "low", "high", "length_rule", "model_minus_rule")
            if k in overall
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=5e-4)
    parser.add_argument("--full-lr", type=float, default=5e-6)
    parser.add_argument("--eval-pairs", type=int, default=200)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--query-length", type=int, default=256)
    parser.add_argument("--out", default="runs/lora-vs-full")
    args = parser.parse_args()
    shared = {
        "model": args.model,
        "data": str(DATA / "batch13.jsonl.gz"),
        "validation_fraction": args.validation_fraction,
        "max_steps": args.steps,
        "total_batch_size": args.batch,
        "micro_batch_size": 4,
        "forward_batch_size": 8,
        "eval_pairs": args.eval_pairs,
        "max_query_length": args.query_length,
        "eval_samples": 0,
        "report_to": "",
    }
    runs = {
        "full": shared | {"learning_rate": args.full_lr},
        f"lora_r{args.rank}": shared
        | {"learning_rate": args.lora_lr, "lora_rank": args.rank, "lora_alpha": 2 * args.rank},
    }
    out = Path(args.out)
    results = {
        name: run_dpo(options, out / name) | {"learning_rate": options["learning_rate"]}
        for name, options in runs.items()
    }
    print(json.dumps({"benchmark": "lora_vs_full", "stage": "dpo", "shared": shared, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
