"""One JSON line for a finished recipe run (recipes/<name>/run.sh): its wall seconds and exit status as the caller
measured them, each trainer's update time and generation speed (median over its updates, from metrics.jsonl), each
policy's held-out accuracy, and every number of the recipe's expected.json beside the CPU run's value and band.

    python benchmarks/recipe_summary.py recipes/arithmetic-grpo --variant full --root runs/arithmetic-grpo-full \\
        --seconds 312 --exit 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rlhfkit.recipe_check import checked_rows, load_expected, read_document

TRAINERS = ("grpo", "rloo")
PERF = {"update_s": "perf/update_total_s", "generation_s": "perf/generation_s"}
ACCURACY = ("greedy_accuracy", "greedy_minus_first", "length", "eos_rate")


def trainer_fields(name: str, run: Path) -> dict:
    """The trainer's updates: how many, their total and median seconds, and its median generated tokens/s."""
    rows = [row for row in read_document(run / "metrics.jsonl") if "step" in row]
    if not rows:
        return {f"{name}_updates": 0}
    fields = {f"{name}_updates": len(rows), f"{name}_train_s": round(sum(r["perf/update_total_s"] for r in rows), 2)}
    for short, key in PERF.items():
        fields[f"{name}_median_{short}"] = round(statistics.median(r[key] for r in rows), 4)
    fields[f"{name}_generated_tokens_per_s"] = round(
        statistics.median(r["perf/generated_tokens_per_s"] for r in rows), 1
    )
    return fields


def accuracy_fields(root: Path) -> dict:
    """Each evaluated policy's greedy accuracy, its difference from the base model, answer length and EOS rate."""
    path = root / "eval" / "accuracy.json"
    if not path.is_file():
        return {}
    fields = {}
    for row in read_document(path)["tables"]["all"]:
        fields |= {f"{row['policy']}_{key}": row[key] for key in ACCURACY if key in row}
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path, help="the recipe folder, holding expected.json")
    parser.add_argument("--variant", required=True)
    parser.add_argument("--root", type=Path, required=True, help="the folder the run wrote")
    parser.add_argument("--seconds", type=float, required=True, help="wall seconds of run.sh")
    parser.add_argument("--exit", type=int, required=True, help="run.sh's exit status (1: a number out of band)")
    args = parser.parse_args()
    line = {"recipe": args.recipe.name, "variant": args.variant, "seconds": args.seconds, "exit": args.exit}
    for name in TRAINERS:
        if (args.root / name / "metrics.jsonl").is_file():
            line |= trainer_fields(name, args.root / name)
    line |= accuracy_fields(args.root)
    # `expected` is the CPU run's value (recipes/<name>/README.md), measured in fp32 with eager decoding
    numbers = checked_rows(args.root, load_expected(args.recipe, args.variant)["numbers"])
    line |= {"numbers_inside": sum(n["inside"] for n in numbers), "numbers": numbers}
    print(json.dumps(line))
    # a missing number: the recipe did not run through (a number out of its band is a measurement, reported above)
    return 1 if any(n["measured"] is None for n in numbers) else 0


if __name__ == "__main__":
    sys.exit(main())
