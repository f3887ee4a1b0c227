"""`rlhfkit report runs=a,b,...`: several runs in one report.html, their curves on shared axes.

Each run directory's `metrics.jsonl` and `config.yaml` are read (and `eval.json` where a run wrote
one). Every metric logged by at least two runs gets one panel with a line per run, against
episodes when every run logged them (on-policy runs of different batch sizes then line up), else
against the optimizer step. A table puts each run's stage, budget and last values side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..config import RunsReportConfig
from ..errors import ConfigError
from ..plots import integer_steps, pyplot, save
from ..tracking import read_metrics
from .caveats import budget_caveat
from .report import Report, scalar_items, trained_amount

HEADLINE = ["objective/scores", "objective/kl", "response/length_mean", "response/eos_rate", "val/accuracy", "val/loss",
            "train/loss", "train/margin"]


def load_run(folder: Path) -> dict[str, Any]:
    if not (folder / "metrics.jsonl").is_file():
        raise ConfigError(f"{folder} has no metrics.jsonl: give run directories written by rlhfkit stages")
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else {}
    evaluation = json.loads((folder / "eval.json").read_text()) if (folder / "eval.json").is_file() else {}
    return {
        "name": folder.name,
        "stage": config.get("stage", "?"),
        "config": config,
        "rows": read_metrics(folder),
        "eval": evaluation,
    }


def shared_metrics(runs: list[dict[str, Any]]) -> list[str]:
    """Numeric metrics logged by at least two runs (all of them when only one run is given), headline ones first."""
    counts: dict[str, int] = {}
    for run in runs:
        for key in {
            k
            for row in run["rows"]
            for k, v in row.items()
            if isinstance(v, int | float) and k not in ("step", "episodes")
        }:
            counts[key] = counts.get(key, 0) + 1
    needed = min(2, len(runs))
    keys = sorted(k for k, c in counts.items() if c >= needed and not k.startswith("perf/"))
    return [k for k in HEADLINE if k in keys] + [k for k in keys if k not in HEADLINE]


def x_axis(runs: list[dict[str, Any]]) -> str:
    return "episodes" if all(any("episodes" in r for r in run["rows"]) for run in runs) else "step"


def plot_metric(runs: list[dict[str, Any]], key: str, axis: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for run in runs:
        points = [(r[axis], r[key]) for r in run["rows"] if isinstance(r.get(key), int | float) and axis in r]
        if points:
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="." if len(points) < 40 else None,
                label=f"{run['name']} ({run['stage']})",
            )
    ax.set(title=key, xlabel=axis)
    integer_steps(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path)


def last_value(run: dict[str, Any], key: str) -> Any:
    values = [r[key] for r in run["rows"] if isinstance(r.get(key), int | float)]
    return values[-1] if values else ""


def summary_rows(runs: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        config = run["config"]
        row = {
            "run": run["name"],
            "stage": run["stage"],
            "learning rate": config.get("learning_rate", ""),
            "steps": max((r.get("step", 0) for r in run["rows"]), default=0),
            "episodes": max((r.get("episodes", 0) for r in run["rows"]), default=""),
        }
        rows.append(row | {key: last_value(run, key) for key in keys})
    return rows


def run(cfg: RunsReportConfig) -> int:
    if not cfg.runs:
        raise ConfigError("report needs runs=<run dir>[,<run dir>...]")
    runs = [load_run(Path(folder)) for folder in cfg.runs]
    out = Path(cfg.out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    keys = shared_metrics(runs)
    axis = x_axis(runs)
    report = Report(
        f"{len(runs)} runs: {', '.join(r['name'] for r in runs)}",
        {
            "runs": "\n".join(
                f"{r['name']} ({r['stage']}): {folder}" for r, folder in zip(runs, cfg.runs, strict=True)
            ),
            "x axis": axis,
            "metrics logged by at least two runs": len(keys),
        },
    )
    for r in runs:
        line = budget_caveat(r["stage"], trained_amount(r["rows"], int(r["config"].get("total_batch_size") or 0)))
        report.caveat(f"{r['name']}: {line}" if line else "")
    headline = [k for k in HEADLINE if k in keys]
    report.table(
        "Runs (last logged values)",
        summary_rows(runs, headline),
        ["run", "stage", "learning rate", "steps", "episodes", *headline],
    )
    evaluated = [{"run": r["name"], **dict(scalar_items(r["eval"]))} for r in runs if r["eval"]]
    report.table(
        "Held-out evaluation (eval.json)",
        evaluated,
        ["run", *sorted({k for row in evaluated for k in row if k != "run"})],
    )
    for key in keys[: cfg.max_plots]:
        report.figure(key, plot_metric(runs, key, axis, out / "plots" / (key.replace("/", "_") + ".png")))
    path = report.write(out)
    print(f"report: {path} ({len(keys)} shared metrics against {axis})")
    return 0
