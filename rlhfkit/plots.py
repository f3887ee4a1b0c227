"""matplotlib figures written as PNG files, for every layer (data analysis, training, evaluation).

- `pyplot` (the one entry point to matplotlib, Agg backend) and `save`, which every figure ends with;
- training curves: the 2x2 `rm_training.png` of the reward model and DPO from metrics.jsonl rows,
  and `plot_curves`, one panel per metric (at most three a row), for SFT and the on-policy stages.

The figures of a reward model's evaluation are in `rlhfkit/reward_eval/figures.py`, the policy comparison's in
`rlhfkit/eval/eval_report.py`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no window on a training machine), except in a Jupyter
    kernel: the backend is global, and the notebook's own plots need its inline one. Figures are closed once saved
    (`save`), so none of them shows up in a cell's output either way."""
    import matplotlib

    if "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Lay out `fig`, write it to `path` (PNG, 110 dpi) and close it; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Training curves


TRAINING_PANELS = (
    ("loss", ("loss",)),
    ("accuracy", ("accuracy",)),
    ("reward means", ("chosen_reward", "rejected_reward")),
    ("margin", ("margin",)),
)


def metric_series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) where `key` holds a finite number; a row without `step` uses its index."""
    steps, values = [], []
    for index, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(float(row.get("step", index)))
            values.append(float(value))
    return steps, values


def exponential_smoothing(values: list[float], alpha: float) -> list[float]:
    """TensorBoard-style EMA; seed 000 compared RM curves after smoothing with alpha = 0.92."""
    smoothed, last = [], values[0] if values else 0.0
    for value in values:
        last = alpha * last + (1 - alpha) * value
        smoothed.append(last)
    return smoothed


def plot_training_curves(
    metrics_rows: Sequence[dict[str, Any]], out_dir: str | Path, smoothing: float = 0.0
) -> Path | None:
    """Loss, accuracy, chosen and rejected reward means, and margin from metrics.jsonl rows in a 2x2
    `rm_training.png`. A key belongs to a panel by its last part (train/loss, val/loss, ...); missing
    keys leave a panel saying so, and with nothing to plot no file is written (returns None)."""
    keys = sorted({k for row in metrics_rows for k in row if k != "step"})
    panels = [
        (title, [k for k in keys if k.rsplit("/", 1)[-1] in suffixes]) for title, suffixes in TRAINING_PANELS
    ]
    series = {k: metric_series(metrics_rows, k) for _, members in panels for k in members}
    series = {k: v for k, v in series.items() if v[0]}
    if not series:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, members) in zip(axes.flat, panels, strict=True):
        present = [k for k in members if k in series]
        for key in present:
            steps, values = series[key]
            many = len(values) > 40
            if smoothing > 0 and many:
                line = ax.plot(steps, values, alpha=0.25)[0]
                ax.plot(steps, exponential_smoothing(values, smoothing), color=line.get_color(), label=key)
            else:
                ax.plot(steps, values, marker=None if many else ".", label=key)
        if present:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set(title=title, xlabel="step")
        integer_steps(ax)
        ax.grid(alpha=0.3)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save(fig, out / "rm_training.png")


PANELS_PER_ROW = 3  # wider rows cannot be read in a report 1400 px wide


def integer_steps(ax: Any) -> None:
    """Steps and episodes are counts: no tick at step 1.2."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_curves(rows: list[dict[str, Any]], keys: list[str], out: Path, title: str) -> Path | None:
    """One panel per metric key present in `rows` (from metrics.jsonl), against step, at most
    PANELS_PER_ROW panels a row."""
    plt = pyplot()

    present = [k for k in keys if any(isinstance(r.get(k), int | float) for r in rows)]
    if not present:
        return None
    columns = min(PANELS_PER_ROW, len(present))
    rows_of_panels = math.ceil(len(present) / columns)
    size = (4.6 * columns, 3.4 * rows_of_panels + 0.4)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=size, squeeze=False)
    for ax, key in zip(axes.flat, present, strict=False):
        steps, values = metric_series(rows, key)
        ax.plot(steps, values, marker="." if len(values) < 40 else None)
        ax.set(title=key, xlabel="step")
        integer_steps(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, out)
