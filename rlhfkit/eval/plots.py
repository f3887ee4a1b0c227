"""matplotlib figures of the evaluation, written as PNG files (embedded later by `report.py`).

- `pyplot` (the one entry point to matplotlib, Agg backend) and `save`, which every figure ends with;
- reward-model evaluation: calibration (Detail 18, Figure 5 right), reward against length, accuracy
  per group (Detail 16, Table 5) and the margin histogram, drawn from the results of `rm_metrics`;
- training curves: the 2x2 `rm_training.png` of the reward model and DPO from metrics.jsonl rows,
  and `plot_curves`, one panel per metric, for SFT and the on-policy stages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .rm_metrics import pearson, spearman


def pyplot():
    """matplotlib's pyplot on the Agg backend: files only, no display on training machines."""
    import matplotlib

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
# Reward-model evaluation


def plot_calibration(calib: dict[str, Any], path: Path) -> Path:
    """Figure 5 right: accuracy of the RM's preferred response against |margin|, with the perfectly
    calibrated curve 1/(1+e^-margin); points below the curve are over-confident."""
    plt = pyplot()
    bins = calib["bins"]
    x = np.array([b["mean_margin"] for b in bins])
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    grid = np.linspace(0, max(float(x.max()) * 1.1, 1.0), 200)
    ax.plot(
        grid, 1 / (1 + np.exp(-grid)), color="black", lw=1.2, label="perfect calibration $1/(1+e^{-\\Delta})$"
    )
    ax.errorbar(
        x,
        [b["accuracy"] for b in bins],
        yerr=[b["stderr"] for b in bins],
        fmt="o-",
        color="tab:blue",
        capsize=3,
        label="reward model",
    )
    for b in bins:
        ax.annotate(
            f"n={b['count']}",
            (b["mean_margin"], b["accuracy"]),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=7,
        )
    ax.set(
        title=f"RM calibration (ECE {calib['ece']:.3f})",
        xlabel="|score difference| $\\Delta$",
        ylabel="accuracy",
        # below 0.5 the model is confidently wrong: keep such bins on the chart
        ylim=(min(0.3, min(b["accuracy"] - b["stderr"] for b in bins) - 0.03), 1.02),
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save(fig, path)


def plot_length_bias(
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any,
    rejected_lengths: Any,
    path: Path,
    unit: str = "tokens",
) -> Path:
    """Reward against length for every response, with a least-squares line: a rising line on
    responses of similar quality means the RM pays for length."""
    plt = pyplot()
    rewards = np.concatenate(
        [np.asarray(chosen_rewards, dtype=np.float64), np.asarray(rejected_rewards, dtype=np.float64)]
    )
    lengths = np.concatenate(
        [np.asarray(chosen_lengths, dtype=np.float64), np.asarray(rejected_lengths, dtype=np.float64)]
    )
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    n = len(rewards) // 2
    ax.scatter(lengths[:n], rewards[:n], s=5, alpha=0.4, label="chosen")
    ax.scatter(lengths[n:], rewards[n:], s=5, alpha=0.4, label="rejected")
    if lengths.std() > 0:
        slope, intercept = np.polyfit(lengths, rewards, 1)
        grid = np.linspace(lengths.min(), lengths.max(), 2)
        ax.plot(
            grid,
            slope * grid + intercept,
            color="black",
            lw=1.2,
            label=f"fit: {slope:+.3f} per {unit[:-1] if unit.endswith('s') else unit}",
        )
    r, rho = pearson(lengths, rewards), spearman(lengths, rewards)
    ax.set(
        title=f"Reward vs length (Pearson {r if r is not None else float('nan'):.2f}, "
        f"Spearman {rho if rho is not None else float('nan'):.2f})",
        xlabel=f"response length ({unit})",
        ylabel="reward",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_accuracy_bars(
    table: dict[Any, dict[str, float]], overall: float, title: str, xlabel: str, path: Path
) -> Path:
    """Table 5 as a bar chart: accuracy per group with stderr bars and the count above each bar, so a
    striking bar on a handful of pairs is not over-read."""
    plt = pyplot()
    labels = [str(k) for k in table]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(labels) + 2), 4.2))
    positions = np.arange(len(labels))
    accuracies = [v["accuracy"] for v in table.values()]
    ax.bar(
        positions,
        accuracies,
        yerr=[v["stderr"] for v in table.values()],
        color="tab:blue",
        alpha=0.8,
        capsize=3,
    )
    for x, value in zip(positions, table.values(), strict=True):
        ax.text(
            x, 0.02, f"n={value['count']}", ha="center", va="bottom", rotation=90, fontsize=7, color="white"
        )
    ax.axhline(overall, color="black", ls="--", lw=1, label=f"overall {overall:.3f}")
    ax.axhline(0.5, color="gray", ls=":", lw=1, label="chance")
    ax.set_xticks(
        positions,
        labels,
        rotation=45 if len(labels) > 6 else 0,
        ha="right" if len(labels) > 6 else "center",
        fontsize=8,
    )
    ax.set(title=title, xlabel=xlabel, ylabel="accuracy", ylim=(0, 1.08))
    ax.legend(fontsize=8, loc="upper right")
    return save(fig, path)


def plot_margin_histogram(chosen_rewards: Any, rejected_rewards: Any, path: Path) -> Path:
    """Distribution of r_c - r_r; everything left of 0 is an error, and a tall wall at 0 means the RM
    barely separates the responses."""
    plt = pyplot()
    margins = np.asarray(chosen_rewards, dtype=np.float64) - np.asarray(rejected_rewards, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    bins = np.histogram_bin_edges(margins, bins=50)
    ax.hist(
        margins[margins > 0],
        bins=bins,
        color="tab:green",
        alpha=0.7,
        label=f"correct ({(margins > 0).mean():.1%})",
    )
    ax.hist(margins[margins <= 0], bins=bins, color="tab:red", alpha=0.7, label="wrong")
    ax.axvline(0, color="black", lw=1)
    ax.set(title="Reward margin r(chosen) - r(rejected)", xlabel="margin", ylabel="pairs")
    ax.legend(fontsize=8)
    return save(fig, path)


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
        ax.grid(alpha=0.3)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return save(fig, out / "rm_training.png")


def plot_curves(rows: list[dict[str, Any]], keys: list[str], out: Path, title: str) -> Path | None:
    """One panel per metric key present in `rows` (from metrics.jsonl), against step."""
    plt = pyplot()

    present = [k for k in keys if any(isinstance(r.get(k), int | float) for r in rows)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.4), squeeze=False)
    for ax, key in zip(axes[0], present, strict=True):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None)
        ax.set(title=key, xlabel="step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, out)


def plot_reward_vs_kl(points: dict[str, tuple[float, float]], path: Path) -> Path:
    """Each policy at (KL to the reference, mean RM score): the trade-off of the paper's Figure 7."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, (kl, score) in points.items():
        ax.scatter([kl], [score])
        ax.annotate(name, (kl, score), textcoords="offset points", xytext=(5, 5))
    ax.set(xlabel="KL to the reference (nats per response)", ylabel="mean RM score", title="RM score vs KL")
    ax.grid(alpha=0.3)
    return save(fig, path)
