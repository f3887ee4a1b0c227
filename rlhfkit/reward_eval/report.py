"""What `rlhfkit rm-eval` writes: rm_eval.json, confident_errors.jsonl, the PNG plots, probes.md, and a
terminal headline.

It sits on top of the other modules of the reward-model evaluation: `evaluate.evaluate_rewards` computes the
result, `figures` draws it, `probes` checks and renders the probe table; the HTML `report.html` that embeds these
files is written through `rlhfkit/report/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..report.report import json_safe
from .figures import plot_accuracy_bars, plot_calibration, plot_length_bias, plot_margin_histogram
from .metrics import UNKNOWN, reward_pair
from .probes import probe_checks, render_probe_table_markdown


def write_rm_eval(
    out_dir: str | Path,
    result: dict[str, Any],
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any = None,
    rejected_lengths: Any = None,
    probe_rows: Sequence[dict[str, Any]] | None = None,
) -> list[str]:
    """Write rm_eval.json, confident_errors.jsonl, the plots and (with probe rows) probes.md; return the
    file names.

    `result` is `evaluate_rewards(...)`; its confident errors go to confident_errors.jsonl, one per
    line, and rm_eval.json keeps their count. length_bias.png needs the response lengths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen, rejected = reward_pair(chosen_rewards, rejected_rewards)
    files: list[str] = []
    summary = {k: v for k, v in result.items() if k != "confident_errors"}
    errors = result.get("confident_errors") or []
    with (out / "confident_errors.jsonl").open("w", encoding="utf-8") as handle:
        for error in errors:
            handle.write(json.dumps(json_safe(error), ensure_ascii=False) + "\n")
    summary["confident_errors"] = {"file": "confident_errors.jsonl", "count": len(errors)}
    files.append("confident_errors.jsonl")
    if "calibration" in result:
        files.append(plot_calibration(result["calibration"], out / "calibration.png").name)
    if chosen_lengths is not None and rejected_lengths is not None:
        unit = result.get("length_bias", {}).get("unit", "tokens")
        files.append(
            plot_length_bias(
                chosen, rejected, chosen_lengths, rejected_lengths, out / "length_bias.png", unit
            ).name
        )
    table = result.get("breakdown", {})
    overall = result.get("accuracy", float((chosen > rejected).mean()))
    for attribute in ("confidence", "batch"):
        groups = table.get(attribute, {})
        if groups and set(map(str, groups)) != {UNKNOWN}:  # HH has neither: a lone "unknown" bar says nothing
            title = f"Validation accuracy by {attribute} (Table 5)"
            files.append(
                plot_accuracy_bars(
                    groups, overall, title, attribute, out / f"accuracy_by_{attribute}.png"
                ).name
            )
    files.append(plot_margin_histogram(chosen, rejected, out / "margin_histogram.png").name)
    if probe_rows:
        checks = probe_checks(probe_rows)
        summary["probes"] = {"rows": list(probe_rows), "checks": checks}
        (out / "probes.md").write_text(render_probe_table_markdown(probe_rows, checks), encoding="utf-8")
        files.append("probes.md")
    summary["files"] = ["rm_eval.json", *files]
    (out / "rm_eval.json").write_text(
        json.dumps(json_safe(summary), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return summary["files"]


def with_interval(value: float | None, low: float | None, high: float | None, sign: str = "") -> str:
    """"0.612 [0.560, 0.664]"; `sign="+"` marks differences; "n/a" for a mean over no pairs."""
    if value is None:
        return "n/a"
    return f"{value:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def accuracy_cells(stats: dict[str, Any]) -> dict[str, Any]:
    """A `breakdown` row as table cells: every accuracy with its interval, beside the length rule."""
    return {
        "accuracy": with_interval(stats["accuracy"], stats["low"], stats["high"]),
        "always-longer": with_interval(
            stats["length_rule"], stats["length_rule_low"], stats["length_rule_high"]
        ),
        "model - longer": with_interval(
            stats["model_minus_rule"], stats["model_minus_rule_low"], stats["model_minus_rule_high"], "+"
        ),
        "chosen-shorter accuracy": with_interval(
            stats["chosen_shorter_accuracy"], stats["chosen_shorter_low"], stats["chosen_shorter_high"]
        ),
        "chosen-shorter pairs": stats["chosen_shorter_count"],
        "pairs": stats["count"],
        "stderr": stats["stderr"],
    }


def versus_length_rule(stats: dict[str, Any]) -> str:
    """Read off the paired interval: only one that excludes 0 separates the model from the length rule."""
    if stats["model_minus_rule_low"] > 0:
        return "beats always-longer by more than noise"
    if stats["model_minus_rule_high"] < 0:
        return "worse than always-longer by more than noise"
    return "not distinguishable from always-longer"


def protocol_note(result: dict[str, Any]) -> str:
    intervals = result["intervals"]
    return (
        f"{intervals['confidence']:.0%} {intervals['method']} ({intervals['resamples']} resamples, "
        f"seed {intervals['seed']}); lengths in {result['length_bias']['unit']}"
    )


def headline(result: dict[str, Any]) -> str:
    """A few lines for the terminal: accuracy beside the length rule, loss, calibration and length bias."""
    overall, calib, bias = result["breakdown"]["overall"], result["calibration"], result["length_bias"]
    rho, cells = bias["spearman"], accuracy_cells(overall)
    lines = [
        f"pairs {result['pairs']}: accuracy {cells['accuracy']} | always-longer {overall['length_rule']:.3f}"
        f" | model - longer {cells['model - longer']}"
        f" | chosen-shorter pairs ({overall['chosen_shorter_count']}): {cells['chosen-shorter accuracy']}",
        f"  {versus_length_rule(overall)}; {protocol_note(result)}",
        f"loss {result['loss']:.4f}, calibration ECE {calib['ece']:.4f} over {len(calib['bins'])} bins",
        f"reward vs length ({bias['unit']}) Spearman {rho:.3f}"
        if rho is not None
        else "reward vs length: undefined (constant)",
    ]
    if bias["humans_prefer_longer"] is not None and bias["model_prefers_longer"] is not None:
        lines.append(
            f"longer response preferred by humans {bias['humans_prefer_longer']:.1%}, "
            f"by the RM {bias['model_prefers_longer']:.1%}"
        )
    if "odin_reward_plus_length_head" in result:
        both = accuracy_cells(result["odin_reward_plus_length_head"])
        lines.append(f"ODIN reward + length head (not the reward RL uses): accuracy {both['accuracy']}"
                     f" | model - longer {both['model - longer']}")
    return "\n".join(lines)
