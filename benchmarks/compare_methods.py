"""On-policy runs of different methods side by side on their held-out prompts: per run, the
trained policy's mean RM score with a 95% bootstrap interval over prompts, its paired difference from
the SFT policy on the same prompts (the trivial baseline: training changed nothing) with its
interval, the share of prompts where it outscores SFT (beside 0.5), length, EOS rate, ROUGE-L, the
share of summaries ending in a question (the template GRPO and RLOO collapsed to), and what the run
cost: episodes trained, responses sampled (dynamic sampling samples more), wall time.

    python benchmarks/compare_methods.py runs/tldr-grpo runs/tldr-dr-grpo runs/tldr-dapo

Each folder is an `rlhfkit grpo|rloo|ppo|reinforce` run that finished (eval_samples.jsonl, metrics.jsonl,
config.yaml). Prints one JSON object per line: the SFT policy first, then each run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhfkit.eval.alarms import ends_with_question  # noqa: E402
from rlhfkit.intervals import bootstrap_interval  # noqa: E402
from rlhfkit.tracking import read_jsonl, read_metrics  # noqa: E402


def interval(values: np.ndarray) -> list[float]:
    return [round(v, 4) for v in bootstrap_interval(values, np.mean)]


def policy_numbers(rows: list[dict], who: str, evaluation: dict[str, float]) -> dict[str, object]:
    scores = np.array([r[f"{who}_score"] for r in rows])
    return {"rm_score": round(float(scores.mean()), 4), "rm_score_interval": interval(scores),
            "tokens": round(float(np.mean([r[f"{who}_tokens"] for r in rows])), 2),
            "eos_rate": round(evaluation[f"eval/{who}_eos_rate"], 3),
            "rouge_l": round(float(np.mean([r[f"{who}_rouge_l"] for r in rows])), 4),
            "question_ending_share": round(float(np.mean([ends_with_question(r[who]) for r in rows])), 3)}


def run_numbers(run: Path) -> tuple[dict[str, object], list[dict], dict[str, float]]:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    name = cfg["stage"]
    rows = read_jsonl(run / "eval_samples.jsonl")
    evaluation = json.loads((run / "eval.json").read_text())
    history = read_metrics(run)
    paired = np.array([r[f"{name}_score"] - r["sft_score"] for r in rows])
    beats = np.array([float(r[f"{name}_score"] > r["sft_score"]) for r in rows])
    sampled = sum(r.get("sampling/draws", 1.0) * cfg["total_batch_size"] for r in history)
    numbers = (
        {"run": run.name, "command": name, "prompts": len(rows)}
        | policy_numbers(rows, name, evaluation)
        | {
            "minus_sft": round(float(paired.mean()), 4),
            "minus_sft_interval": interval(paired),
            "beats_sft": round(float(beats.mean()), 3),
            "beats_sft_interval": interval(beats),
            "beats_sft_baseline": 0.5,
            "kl_last_update": round(history[-1]["objective/kl"], 3),
            "episodes_trained": len(history) * cfg["total_batch_size"],
            "responses_sampled": int(sampled),
            "seconds": round(sum(r.get("perf/update_total_s", 0.0) for r in history), 1),
        }
    )
    return numbers, rows, evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    results = [run_numbers(run) for run in args.runs]
    prompts = {tuple(r["prompt_id"] for r in rows) for _, rows, _ in results}
    if len(prompts) != 1:
        raise SystemExit(
            "the runs were evaluated on different held-out prompts: give them the same data, seed, validation_posts "
            "and eval_samples"
        )
    _, sft_rows, evaluation = results[0]  # the SFT policy's samples are the same in every run
    print(json.dumps({"run": "sft", "prompts": len(sft_rows)} | policy_numbers(sft_rows, "sft", evaluation)))
    for numbers, _, _ in results:
        print(json.dumps(numbers))


if __name__ == "__main__":
    main()
