"""A reward model, or a DPO policy's implicit reward (Detail 19), evaluated on human comparisons (Section 6,
Details 13 and 16-18): the library `rlhfkit rm`, `rlhfkit dpo` and `rlhfkit rm-eval` (`command.py`) share.

`evaluate_reward_model` scores the pairs through `rlhfkit.scoring` and writes everything `rm_eval.json`
holds (`evaluate_rewards`: `metrics` and `calibration`), its plots and tables (`report`), the probes and the
Detail 13 dump of the head's output at every response token; `rlhfkit rm` and `rlhfkit dpo` call it on their
validation pairs, and `write_rm_report` puts their run in report.html.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import ops
from ..data.examples import PairExample
from ..data.formats import encode_completion, encode_query
from ..data.tldr import Comparison
from ..report.caveats import budget_caveat, few_prompts_caveat, read_json, reward_model_caveat
from ..report.report import Report, Table, config_text, trained_amount, training_summary
from ..reward_features import FeatureCache
from ..reward_models import ScalarModel
from ..scoring import collate_scored, response_lengths, score_pair_heads, score_texts
from ..tracking import read_metrics
from . import metrics
from . import report as reward_report
from .calibration import calibration, length_bias
from .figures import plot_reward_logits
from .probes import DEFAULT_PROBES, load_probes, probe_items, probe_table


def dump_reward_logits(model: ScalarModel, tokenizer, examples: list[PairExample], out: Path) -> list[dict[str, Any]]:
    """Detail 13: the head's output at every response position; only the EOS one is a valid reward."""
    dumps = []
    for e in examples:
        batch = collate_scored([e.query.ids], [e.chosen], tokenizer.pad_token_id)
        device = next(model.parameters()).device
        with torch.no_grad():
            scores = model.per_token_scores(batch["input_ids"].to(device), batch["attention_mask"].to(device))[0].cpu()
        start = len(e.query.ids)
        tokens = [tokenizer.decode([t]) for t in e.chosen]  # readable text, not byte-level pieces
        dumps.append(
            {"tokens": tokens, "scores": scores[start : start + len(e.chosen)].tolist(), "eos_index": len(e.chosen) - 1}
        )
    (out / "reward_logits.json").write_text(json.dumps(dumps, indent=2))
    if dumps:
        plot_reward_logits(dumps[0], out / "reward_logits.png")
    return dumps


def score_probes(model: ScalarModel, tokenizer, probes_path: str, limits: dict[str, int]) -> list[dict[str, Any]]:
    if not probes_path:
        return []
    probes = load_probes(DEFAULT_PROBES if probes_path == "builtin" else probes_path)
    items = probe_items(probes)
    queries = [encode_query(tokenizer, it["task"], it["fields"], limits[it["task"]]).ids for it in items]
    responses = [encode_completion(tokenizer, it["text"]) for it in items]
    scores = score_texts(model, tokenizer.pad_token_id, queries, responses, 8, "probes")
    return probe_table(probes, scores.tolist())


def builtin_probes_for(comparisons: list[Comparison], probes: str) -> str:
    """The shipped probes are TL;DR posts: they say nothing about a reward model of other data."""
    return "" if probes == "builtin" and not any(c.task == "tldr" for c in comparisons) else probes


def evaluate_reward_model(
    model: ScalarModel,
    tokenizer,
    examples: list[PairExample],
    out: Path,
    *,
    batch_size: int,
    probes: str,
    limits: dict[str, int],
    errors: int = 20,
    bins: int = 10,
    dump: int = 1,
    length_penalty: float = 0.0,
    seed: int = 0,
    features: FeatureCache | None = None,
) -> dict[str, Any]:
    """Everything `rm_eval.json` holds, plus plots, confident errors, probes and Detail 13 dumps. With
    `length_penalty` alpha every reward is score - alpha x response tokens, as PPO would see it."""
    out.mkdir(parents=True, exist_ok=True)
    heads = score_pair_heads(model, tokenizer.pad_token_id, examples, batch_size, features=features)
    chosen, rejected = heads["chosen"], heads["rejected"]
    lengths = response_lengths(examples)
    lengths_c, lengths_r = lengths["chosen_lengths"].numpy(), lengths["rejected_lengths"].numpy()
    if length_penalty:
        chosen = ops.length_penalised_scores(
            torch.from_numpy(chosen), lengths["chosen_lengths"], length_penalty
        ).numpy()
        rejected = ops.length_penalised_scores(
            torch.from_numpy(rejected), lengths["rejected_lengths"], length_penalty
        ).numpy()
    comparisons = [e.record for e in examples]
    result = evaluate_rewards(
        comparisons, chosen, rejected, lengths_c, lengths_r, "tokens", bins, errors, seed=seed
    )
    result["length_penalty"] = length_penalty
    if "chosen_length" in heads:  # ODIN: is the pair still modelled once both heads are summed?
        both = heads["chosen"] + heads["chosen_length"] > heads["rejected"] + heads["rejected_length"]
        result["odin_reward_plus_length_head"] = metrics.accuracy_with_baseline(
            both.astype(float),
            metrics.length_rule_hits(lengths_c, lengths_r),
            metrics.chosen_shorter_mask(lengths_c, lengths_r),
            seed,
        )
    probe_rows = score_probes(model, tokenizer, probes, limits)
    reward_report.write_rm_eval(out, result, chosen, rejected, lengths_c, lengths_r, probe_rows=probe_rows or None)
    if dump and model.head_type == "eos-linear":
        dump_reward_logits(model, tokenizer, examples[:dump], out)
    return result


def write_rm_report(
    run_dir: Path,
    stage: str,
    model: str,
    pairs_per_step: int,
    notes: list[str],
    evaluation: dict[str, Any],
    eval_dir: Path,
    title: str = "Reward model",
    extra: Sequence[Table] = (),
) -> Path:
    """report.html of a reward-model or DPO run: validation accuracy beside the always-longer rule,
    accuracy by group, calibration bins, plots and probes; `model` is the model it started from, `pairs_per_step`
    the pairs of one optimizer step."""
    history = read_metrics(run_dir)
    report = Report(
        f"{title} run {run_dir.name}",
        training_summary(run_dir, model, notes, history, pairs_per_step, "pairs"),
        config=config_text(run_dir),
    )
    report.caveat(budget_caveat(stage, trained_amount(history, pairs_per_step)))
    if "breakdown" in evaluation:
        accuracy_numbers(report, evaluation)
        for name in ("confidence", "batch", "split", "task"):
            groups = evaluation["breakdown"].get(name, {})
            report.table(
                f"Accuracy by {name} (Detail 16)",
                [{name: g, **reward_report.accuracy_cells(stats)} for g, stats in groups.items()],
            )
        report.table(
            "Calibration bins (Figure 5 right)",
            [
                {
                    "mean |margin|": b["mean_margin"],
                    "accuracy": b["accuracy"],
                    "stderr": b["stderr"],
                    "pairs": b["count"],
                }
                for b in evaluation["calibration"]["bins"]
            ],
        )
    report.tables += list(extra)
    for png in sorted([*(run_dir / "plots").glob("*.png"), *eval_dir.glob("*.png")]):
        report.figure(png.stem.replace("_", " "), png)
    probes = (read_json(eval_dir / "rm_eval.json") or {}).get("probes", {}).get("checks", [])
    report.table(
        "Probes: scores along quality and length ladders",
        [
            {
                "probe": c["probe"],
                "ladder": c["ladder"],
                "scores": [round(x, 3) for x in c["scores"]],
                "Spearman": c["spearman"],
                "verdict": c["verdict"],
            }
            for c in probes
        ],
    )
    return report.write(run_dir)


def accuracy_numbers(report: Report, evaluation: dict[str, Any]) -> None:
    overall = evaluation["breakdown"]["overall"]
    report.number(
        "held-out accuracy",
        (overall["accuracy"], overall["low"], overall["high"]),
        (overall["length_rule"], overall["length_rule_low"], overall["length_rule_high"]),
        "always prefer the longer response",
        reward_model_caveat(overall["accuracy"], overall["length_rule"], overall["model_minus_rule_low"]),
    )
    report.number(
        f"accuracy minus always-longer (paired): {reward_report.versus_length_rule(overall)}",
        (overall["model_minus_rule"], overall["model_minus_rule_low"], overall["model_minus_rule_high"]),
        0,
        "no difference",
    )
    report.number(
        f"accuracy where humans chose the shorter ({overall['chosen_shorter_count']} pairs)",
        (overall["chosen_shorter_accuracy"], overall["chosen_shorter_low"], overall["chosen_shorter_high"]),
        0,
        "always prefer the longer response",
    )
    report.number("validation loss", evaluation.get("loss"), math.log(2), "a constant score (ln 2)")
    report.number("calibration error (ECE)", evaluation["calibration"]["ece"])
    report.caveat(few_prompts_caveat(overall["count"], "held-out pairs"))
    report.summary["intervals"] = reward_report.protocol_note(evaluation)


# ---------------------------------------------------------------------------------------------
# Everything at once


def evaluate_rewards(
    comparisons: Sequence[Comparison],
    chosen_rewards: Any,
    rejected_rewards: Any,
    chosen_lengths: Any = None,
    rejected_lengths: Any = None,
    length_unit: str = "tokens",
    n_bins: int = 10,
    k_errors: int = 20,
    seed: int = 0,
    resamples: int = metrics.RESAMPLES,
) -> dict[str, Any]:
    """Every number of `metrics` and `calibration` for one set of rewards; lengths default to characters."""
    chosen, rejected = metrics.reward_pair(chosen_rewards, rejected_rewards)
    metrics.check_aligned(comparisons, chosen)
    chosen_lengths, rejected_lengths, length_unit = metrics.response_lengths(
        comparisons, chosen_lengths, rejected_lengths, length_unit
    )
    correct = chosen > rejected
    return {
        "pairs": int(chosen.size),
        "accuracy": float(correct.mean()),
        "loss": metrics.pairwise_loss(chosen, rejected),
        "rewards": {
            "all": metrics.reward_stats(np.concatenate([chosen, rejected])),
            "chosen": metrics.reward_stats(chosen),
            "rejected": metrics.reward_stats(rejected),
            "margin": metrics.reward_stats(chosen - rejected),
        },
        "breakdown": metrics.breakdown(comparisons, correct, chosen_lengths, rejected_lengths, seed, resamples),
        "intervals": {
            "method": "percentile bootstrap over pairs",
            "confidence": metrics.CONFIDENCE,
            "resamples": resamples,
            "seed": seed,
        },
        "calibration": calibration(chosen, rejected, n_bins),
        "length_bias": length_bias(chosen, rejected, chosen_lengths, rejected_lengths, length_unit),
        "confident_errors": metrics.most_confident_errors(comparisons, chosen, rejected, k_errors),
    }
