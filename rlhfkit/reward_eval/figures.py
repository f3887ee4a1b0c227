"""matplotlib figures of a reward model's evaluation, written as PNG files (embedded later by the report):
calibration (Detail 18, Figure 5 right), reward against length, accuracy per group (Detail 16, Table 5), the
margin histogram, drawn from the results of `metrics` and `calibration`, and the head's output at every response
token (Detail 13).

`pyplot` and `save` come from `rlhfkit/plots.py`, with the training curves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..plots import pyplot, save
from .calibration import pearson, spearman


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
    label_bin_counts(ax, [(b["mean_margin"], b["accuracy"], b["count"]) for b in bins], float(grid[-1]))
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


def label_bin_counts(ax: Any, points: list[tuple[float, float, int]], x_span: float) -> None:
    """`n=` beside each bin, skipping a bin too close to the last labelled one and alternating above
    and below, so that neighbouring labels never overlap."""
    last_x, above = None, True
    for x, y, count in sorted(points):
        if last_x is not None and x - last_x < 0.09 * x_span:
            continue
        ax.annotate(f"n={count}", (x, y), textcoords="offset points", xytext=(4, 8 if above else -14), fontsize=7)
        last_x, above = x, not above


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


def plot_reward_logits(dump: dict[str, Any], path: Path) -> Path:
    """Detail 13: the head's output at each response token of one `dump_reward_logits` entry, EOS in red."""
    fig, ax = pyplot().subplots(figsize=(max(6, 0.25 * len(dump["tokens"])), 3.5))
    colors = ["tab:red" if i == dump["eos_index"] else "tab:gray" for i in range(len(dump["tokens"]))]
    ax.bar(range(len(dump["scores"])), dump["scores"], color=colors)
    ax.set_xticks(range(len(dump["tokens"])), dump["tokens"], rotation=90, fontsize=7)
    ax.set(title="Reward logits per response token (red: EOS, the only valid reward; Detail 13)", ylabel="head output")
    return save(fig, path)


# ---------------------------------------------------------------------------------------------
# Policy comparison
