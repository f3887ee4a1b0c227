"""The recipe's table (recipes/arithmetic-distill/README.md): each model's greedy accuracy on the held-out `mul`
problems with the paired difference from the base model, on the `add` problems none trained on, and each method's
training cost: wall time (wall_seconds.tsv, written by run.sh), updates or optimizer steps, and tokens sampled.

Usage: python recipes/arithmetic-distill/table.py ROOT    (prints the table as Markdown; writes ROOT/table.json)
"""

import json
import sys
from pathlib import Path

# model -> its training run; a checkpoint part of the way (opd-7) -> its run and the updates it had done
TRAINED = {"teacher": "grpo", "opd": "opd", "opd-jsd": "opd-jsd", "opd-jsd-5": "opd-jsd-5", "sft": "sft"}
CHECKPOINTS = {"opd-7": ("opd", 7), "opd-jsd-7": ("opd-jsd", 7)}


def rows_by_policy(accuracy: Path) -> dict[str, dict]:
    if not accuracy.is_file():
        return {}
    return {row["policy"]: row for row in json.loads(accuracy.read_text())["tables"]["all"]}


def training_cost(root: Path, run: str, first: int | None = None) -> dict:
    """Updates (or SFT's optimizer steps) and tokens the run sampled, from its metrics.jsonl; of its `first` updates
    alone when given."""
    path = root / run / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    updates = [r for r in rows if "response/length_mean" in r][:first]
    if updates:
        config = (root / run / "config.yaml").read_text()
        batch = int(next(line.split(":")[1] for line in config.splitlines() if line.startswith("total_batch_size")))
        tokens = round(sum(r["response/length_mean"] * batch for r in updates))
        return {"updates": len(updates), "sampled_tokens": tokens}
    return {"optimizer_steps": max((r["step"] for r in rows), default=0), "sampled_tokens": 0}


def checkpoint_cost(root: Path, run: str, updates: int, wall: dict) -> tuple[float | None, dict]:
    """A checkpoint's share of its run: the run's wall time less the updates after it (their perf/update_total_s),
    and the cost of its first `updates` updates."""
    rows = [json.loads(line) for line in (root / run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = sum(r["perf/update_total_s"] for r in rows if "perf/update_total_s" in r and r["step"] > updates)
    seconds = wall[run] - later if run in wall else None
    return seconds, training_cost(root, run, updates)


def paired(value: float | None, bounds: list) -> str:
    return "" if value is None else f"{value:+.3f} [{bounds[0]:+.3f}, {bounds[1]:+.3f}]"


def main(root: Path) -> None:
    wall = {}
    if (root / "wall_seconds.tsv").is_file():
        for line in (root / "wall_seconds.tsv").read_text().splitlines():
            name, seconds = line.split("\t")
            wall[name] = float(seconds)
    mul, add = rows_by_policy(root / "eval" / "accuracy.json"), rows_by_policy(root / "eval-add" / "accuracy.json")
    curve = rows_by_policy(root / "eval-curve" / "accuracy.json")  # its base rows are the same greedy answers
    mul |= {policy: row for policy, row in curve.items() if policy != "base"}
    records = []
    for policy, row in mul.items():
        run = TRAINED.get(policy)
        cost = training_cost(root, run) if run else {}
        seconds = wall.get(run) if run else None
        if policy in CHECKPOINTS:
            seconds, cost = checkpoint_cost(root, *CHECKPOINTS[policy], wall)
        if policy == "sft" and "teacher-answers" in wall:  # off-policy distillation also pays for the answers
            seconds = (seconds or 0) + wall["teacher-answers"]
            answers = rows_by_policy(root / "teacher-answers" / "accuracy.json").get("teacher", {})
            cost["sampled_tokens"] = round(answers.get("length", 0) * answers.get("problems", 0))  # the teacher's
        records.append({
            "policy": policy,
            "accuracy": row["greedy_accuracy"],
            "accuracy_interval": [row["greedy_accuracy_low"], row["greedy_accuracy_high"]],
            "minus_base": row.get("greedy_minus_first"),
            "minus_base_interval": [row.get("greedy_minus_first_low"), row.get("greedy_minus_first_high")],
            "length": row["length"], "eos_rate": row["eos_rate"],
            "add_accuracy": add.get(policy, {}).get("greedy_accuracy"),
            "add_minus_base": add.get(policy, {}).get("greedy_minus_first"),
            "add_minus_base_interval": [add.get(policy, {}).get("greedy_minus_first_low"),
                                        add.get(policy, {}).get("greedy_minus_first_high")],
            "wall_seconds": seconds, **cost,
        })
    (root / "table.json").write_text(json.dumps(records, indent=1))
    print("| model | held-out `mul` accuracy | minus base (paired) | `add` accuracy | `add` minus base (paired) "
          "| training wall time | updates (steps) | tokens sampled | answer tokens | EOS rate |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in records:
        low, high = r["accuracy_interval"]
        minus = paired(r["minus_base"], r["minus_base_interval"])
        add_minus = paired(r["add_minus_base"], r["add_minus_base_interval"])
        add_acc = "" if r["add_accuracy"] is None else f"{r['add_accuracy']:.3f}"
        wall_time = "" if r["wall_seconds"] is None else f"{r['wall_seconds'] / 60:.1f} min"
        steps = r.get("updates", r.get("optimizer_steps", ""))
        print(f"| {r['policy']} | {r['accuracy']:.3f} [{low:.3f}, {high:.3f}] | {minus} | {add_acc} | {add_minus} | "
              f"{wall_time} | {steps} | {r.get('sampled_tokens', '')} | {r['length']:.1f} | {r['eos_rate']:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
