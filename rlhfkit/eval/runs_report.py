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

from ..config import ConfigError, RunsReportConfig
from ..plots import pyplot, save
from ..tracking import read_metrics
from .report import image_html, table_html, write_report

HEADLINE = ["objective/scores", "objective/kl", "response/length_mean", "response/eos_rate", "val/accuracy", "val/loss",
            "train/loss", "train/margin"]


def load_run(folder: Path) -> dict[str, Any]:
    if not (folder / "metrics.jsonl").is_file():
        raise ConfigError(f"{folder} has no metrics.jsonl: give run directories written by rlhfkit stages")
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else {}
    evaluation = json.loads((folder / "eval.json").read_text()) if (folder / "eval.json").is_file() else {}
    return {"name": folder.name, "stage": config.get("stage", "?"), "config": config, "rows": read_metrics(folder), "eval": evaluation}


def shared_metrics(runs: list[dict[str, Any]]) -> list[str]:
    """Numeric metrics logged by at least two runs (all of them when only one run is given), headline ones first."""
    counts: dict[str, int] = {}
    for run in runs:
        for key in {k for row in run["rows"] for k, v in row.items() if isinstance(v, int | float) and k not in ("step", "episodes")}:
            counts[key] = counts.get(key, 0) + 1
    needed = min(2, len(runs))
    keys = sorted(k for k, c in counts.items() if c >= needed and not k.startswith("perf/"))
    return [k for k in HEADLINE if k in keys] + [k for k in keys if k not in HEADLINE]


def x_axis(runs: list[dict[str, Any]]) -> str:
    return "episodes" if all(any("episodes" in r for r in run["rows"]) for run in runs) else "step"


def plot_metric(runs: list[dict[str, Any]], key: str, axis: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for run in runs:
        points = [(r[axis], r[key]) for r in run["rows"] if isinstance(r.get(key), int | float) and axis in r]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 40 else None,
                    label=f"{run['name']} ({run['stage']})")
    ax.set(title=key, xlabel=axis)
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
        row = {"run": run["name"], "stage": run["stage"], "learning rate": config.get("learning_rate", ""),
               "steps": max((r.get("step", 0) for r in run["rows"]), default=0),
               "episodes": max((r.get("episodes", 0) for r in run["rows"]), default="")}
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
    sections = [("Runs (last logged values)", table_html(summary_rows(runs, [k for k in HEADLINE if k in keys]),
                                                          ["run", "stage", "learning rate", "steps", "episodes", *[k for k in HEADLINE if k in keys]]))]
    evaluated = [{"run": r["name"], **{k: v for k, v in r["eval"].items() if isinstance(v, int | float)}} for r in runs if r["eval"]]
    if evaluated:
        columns = ["run", *sorted({k for row in evaluated for k in row if k != "run"})]
        sections.append(("Held-out evaluation (eval.json)", table_html(evaluated, columns)))
    for key in keys[: cfg.max_plots]:
        sections.append((key, image_html(plot_metric(runs, key, axis, out / "plots" / (key.replace("/", "_") + ".png")))))
    report = write_report(out, f"{len(runs)} runs: {', '.join(r['name'] for r in runs)}", sections)
    print(f"report: {report} ({len(keys)} shared metrics against {axis})")
    return 0
