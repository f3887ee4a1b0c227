"""One JSON line per stage of a finished `rlhfkit pipeline` run: its wall seconds (pipeline.json), the
median of each `perf/` metric over its logged steps (metrics.jsonl), the first and last training loss
or score, and its headline numbers.

    python benchmarks/pipeline_summary.py runs/gpu_suite/stages
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

FIRST_AND_LAST = ("train/loss", "objective/scores", "objective/kl")


def metric_rows(stage_dir: Path) -> list[dict]:
    path = stage_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_line(name: str, record: dict, stage_dir: Path) -> dict:
    rows = [row for row in metric_rows(stage_dir) if "step" in row]
    perf = sorted({key for row in rows for key in row if key.startswith("perf/")})
    line = {"stage": name, "seconds": record.get("seconds"), "logged_steps": len(rows)}
    for key in perf:
        values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
        if values:
            line[f"median {key}"] = round(statistics.median(values), 4)
    for key in FIRST_AND_LAST:
        values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
        if values:
            line[f"{key} first/last"] = [round(values[0], 4), round(values[-1], 4)]
    line["headline"] = record.get("headline")
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the pipeline's output_dir")
    args = parser.parse_args()
    stages = json.loads((args.run / "pipeline.json").read_text())
    for name, record in stages.items():
        print(json.dumps(stage_line(name, record, args.run / name)))


if __name__ == "__main__":
    main()
