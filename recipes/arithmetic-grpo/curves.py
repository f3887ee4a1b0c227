"""The recipe's training curves in one image: exact match, digit credit, answer length and KL per update of each run.
Usage: python recipes/arithmetic-grpo/curves.py ROOT OUT.png   (ROOT holds grpo/ and rloo/ with their metrics.jsonl)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = {
    "rewards/gsm8k": "exact match (sampled answers, T = 0.7)",
    "rewards/digits": "digit credit",
    "response/length_mean": "answer tokens",
    "objective/kl": "KL to the start (nats per answer)",
}


def main(root: Path, out: Path) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 3.4))
    for run in ("grpo", "rloo"):
        path = root / run / "metrics.jsonl"
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for ax, key in zip(axes, PANELS, strict=True):
            points = [(r["step"], r[key]) for r in rows if key in r]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=run.upper())
    for ax, title in zip(axes, PANELS.values(), strict=True):
        ax.set(title=title, xlabel="update")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
