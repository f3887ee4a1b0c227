"""`rlhfkit judge-eval`: how far to trust a judge before trusting its win rates.

The judge compares the two responses of labelled human comparisons (TL;DR, CNN/DM, HH-RLHF or preference pairs).
Reported, each beside the trivial "always prefer the longer response" rule on the same pairs:
- agreement with the human label, overall and by split, batch, confidence, policy pair and task
  (`reward_metrics.breakdown`, as for a reward model), with a bootstrap interval;
- length bias: the share of its votes that went to the longer response, beside the humans' share;
- position bias: every pair is judged in both orders; the share of votes for the response shown
  first (0.5 for an unbiased judge), and the share of pairs whose two verdicts pick the same response;
- failed calls (no reply after the last attempt) apart from unparseable replies, ties, calls, cache
  hits, tokens and cost; a run that received no verdict at all stops with the first failure's reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from ..config import JudgeEvalConfig
from ..data import load_pairs, usable
from ..data.split import filter_comparisons
from ..data.tldr import Comparison
from ..errors import ConfigError
from ..intervals import bootstrap_interval
from ..report.caveats import judge_caveat
from ..report.report import Report, json_safe, key_values
from ..reward_eval import metrics as reward_metrics
from .judges import ApiOptions, Pair, Verdict, make_judge


def pairs_of(comparisons: list[Comparison]) -> list[Pair]:
    """The human-chosen response as A: a verdict "A" agrees with the human."""
    return [Pair(reward_metrics.prompt_text(c), c.chosen.strip(), c.rejected.strip()) for c in comparisons]


def reversed_pairs(pairs: list[Pair]) -> list[Pair]:
    return [Pair(p.prompt, p.response_b, p.response_a) for p in pairs]


@dataclass
class BothOrders:
    """Verdicts of each pair in the caller's order (chosen = A) and with the responses exchanged."""

    forward: list[Verdict]
    backward: list[Verdict]  # judged as (rejected, chosen): "B" here means the chosen response

    def picks_chosen(self) -> tuple[np.ndarray, np.ndarray]:
        """Per pair and order: 1 the chosen, 0 the rejected, 0.5 a tie, nan unparseable."""
        value = {"tie": 0.5, "unparseable": np.nan}
        forward = [value.get(v.winner, float(v.winner == "A")) for v in self.forward]
        backward = [value.get(v.winner, float(v.winner == "B")) for v in self.backward]
        return np.array(forward), np.array(backward)


def agreement_summary(picks: np.ndarray, seed: int) -> dict[str, Any]:
    votes = picks[~np.isnan(picks)]
    if votes.size == 0:
        return {"agreement": None, "low": None, "high": None, "votes": 0}
    low, high = bootstrap_interval(votes, np.mean, seed=seed)
    return {"agreement": float(votes.mean()), "low": low, "high": high, "votes": int(votes.size)}


def position_bias(orders: BothOrders) -> dict[str, Any]:
    """Share of votes for the response shown first, and the share of pairs whose verdicts in the two
    orders pick the same response (both votes, neither a tie)."""
    shown = [v.shown_winner for v in orders.forward + orders.backward if v.shown_winner in ("A", "B")]
    forward, backward = orders.picks_chosen()
    decided = ~np.isnan(forward) & ~np.isnan(backward) & (forward != 0.5) & (backward != 0.5)
    return {
        "first_position_share": float(np.mean([s == "A" for s in shown])) if shown else None,
        "first_position_votes": len(shown),
        "consistent_share": float(np.mean(forward[decided] == backward[decided])) if decided.any() else None,
        "pairs_decided_in_both_orders": int(decided.sum()),
    }


def longer_baseline(comparisons: list[Comparison]) -> dict[str, Any]:
    """ "Always prefer the longer response" (by characters) on the same pairs; equal length counts half."""
    chosen, rejected = reward_metrics.char_lengths(comparisons)
    picks = reward_metrics.length_rule_hits(chosen, rejected)
    return {
        "agreement": float(picks.mean()),
        "pairs": len(comparisons),
        "chosen_longer_share": float((chosen > rejected).mean()),
    }


def length_preference(comparisons: list[Comparison], orders: BothOrders) -> dict[str, Any]:
    """Share of the judge's votes that went to the longer response (by characters; pairs of equal
    length left out): 0.5 for a judge blind to length, beside the humans' share on the same pairs."""
    chosen, rejected = reward_metrics.char_lengths(comparisons)
    forward, backward = orders.picks_chosen()
    votes = np.concatenate([forward, backward])
    chosen_longer = np.concatenate([chosen > rejected] * 2)
    usable = ~np.isnan(votes) & (votes != 0.5) & np.concatenate([chosen != rejected] * 2)
    picks_longer = np.where(chosen_longer, votes, 1 - votes)[usable]
    humans = (chosen > rejected)[chosen != rejected]
    return {
        "judge_picks_longer": float(picks_longer.mean()) if picks_longer.size else None,
        "votes": int(picks_longer.size),
        "humans_pick_longer": float(humans.mean()) if humans.size else None,
    }


def summarise(comparisons: list[Comparison], orders: BothOrders, seed: int) -> dict[str, Any]:
    forward, backward = orders.picks_chosen()
    both = np.concatenate([forward, backward])
    stacked = np.stack([forward, backward])
    counted = (~np.isnan(stacked)).sum(0)
    kept = counted > 0  # pairs with at least one parseable verdict: the mean of their votes
    per_pair = np.where(kept, np.nan_to_num(stacked).sum(0) / np.maximum(counted, 1), np.nan)
    verdicts = orders.forward + orders.backward
    outcomes = [v.winner for v in verdicts if not v.error]
    judged = [c for c, k in zip(comparisons, kept, strict=True) if k]
    return {
        "pairs": len(comparisons),
        "agreement": agreement_summary(both, seed),
        "agreement_first_order_only": agreement_summary(forward, seed),
        "breakdown": reward_metrics.breakdown(judged, per_pair[kept], seed=seed) if kept.any() else {},
        "longer_baseline": longer_baseline(comparisons),
        "length_preference": length_preference(comparisons, orders),
        "position_bias": position_bias(orders),
        "unparseable": outcomes.count("unparseable"),
        "failed": len(verdicts) - len(outcomes),
        "ties": outcomes.count("tie"),
        "verdicts": len(verdicts),
    }


def verdict_rows(comparisons: list[Comparison], orders: BothOrders) -> list[dict[str, Any]]:
    rows = []
    for c, f, b in zip(comparisons, orders.forward, orders.backward, strict=True):
        rows.append(
            {
                "prompt_id": c.prompt_id,
                "split": c.split,
                "batch": c.batch,
                "confidence": c.confidence,
                "chosen_first": {"winner": f.winner, "swapped": f.swapped, "reply": f.raw, "cached": f.cached},
                "rejected_first": {"winner": b.winner, "swapped": b.swapped, "reply": b.raw, "cached": b.cached},
            }
        )
    return rows


def headline(summary: dict[str, Any], judge: str) -> str:
    agreement, baseline, bias = summary["agreement"], summary["longer_baseline"], summary["position_bias"]
    lines = [f"judge {judge} on {summary['pairs']} labelled pairs, each in both orders:"]
    if agreement["agreement"] is None:
        lines.append("  no parseable verdict: agreement undefined")
    else:
        lines.append(
            f"  agreement with humans {agreement['agreement']:.3f} [{agreement['low']:.3f}, {agreement['high']:.3f}] "
            f"over {agreement['votes']} votes; always-prefer-longer {baseline['agreement']:.3f}"
        )
    if summary["length_preference"]["judge_picks_longer"] is not None:
        lines.append(
            f"  votes for the longer response {summary['length_preference']['judge_picks_longer']:.3f} "
            f"(humans on the same pairs: {summary['length_preference']['humans_pick_longer']:.3f})"
        )
    if bias["first_position_share"] is not None:
        lines.append(f"  votes for the response shown first {bias['first_position_share']:.3f} (unbiased: 0.5)")
    if bias["consistent_share"] is not None:
        lines.append(
            f"  same pick in both orders {bias['consistent_share']:.3f} of {bias['pairs_decided_in_both_orders']} pairs"
        )
    lines.append(
        f"  unparseable {summary['unparseable']} of {summary['verdicts']} verdicts, failed calls {summary['failed']}, "
        f"ties {summary['ties']}"
    )
    return "\n".join(lines)


def load_comparisons(cfg: JudgeEvalConfig) -> tuple[list[Comparison], str]:
    records, log = usable(
        load_pairs(cfg.data_format, cfg.data, cfg.hf_split), cfg.data, "pairs", f"data_format={cfg.data_format}"
    )
    records = filter_comparisons(records, cfg.splits, cfg.batches)
    if not records:
        raise ConfigError(
            f"no comparisons left in {', '.join(cfg.data)} after splits={cfg.splits} batches={cfg.batches} "
            f"(loaded: {log.summary('pairs')})"
        )
    # a seeded sample rather than the first pairs: files are often sorted by batch or policy
    order = np.random.default_rng(cfg.seed).permutation(len(records))
    picked = [records[i] for i in sorted(order[: cfg.max_pairs])] if cfg.max_pairs else records
    return picked, log.summary("pairs")


def run(cfg: JudgeEvalConfig) -> int:
    if not cfg.judge or not cfg.data:
        raise ConfigError(
            "judge-eval needs judge=<spec> (e.g. hf:smollm2-135m, openai:gpt-4o-mini, rm:<folder>) and "
            "data=<comparisons>"
        )
    out = Path(cfg.out) if cfg.out else Path("runs") / f"judge-eval-{datetime.now():%Y%m%d-%H%M%S}"
    comparisons, note = load_comparisons(cfg)
    print(f"loaded: {note}; judging {len(comparisons)} pairs in both orders")
    options = ApiOptions(
        concurrency=cfg.concurrency, timeout=cfg.timeout, input_price=cfg.input_price, output_price=cfg.output_price
    )
    judge = make_judge(
        cfg.judge,
        template=cfg.template or None,
        cache_dir=cfg.cache_dir,
        seed=cfg.seed,
        options=options,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
    )
    pairs = pairs_of(comparisons)
    forward = judge.judge(pairs)
    judge.require_a_verdict()  # before the second order: a judge that cannot be reached fails in half the time
    orders = BothOrders(forward, judge.judge(reversed_pairs(pairs)))
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(comparisons, orders, cfg.seed) | {
        "judge": judge.describe(),
        "stats": judge.stats.as_dict(),
        "data": note,
    }
    (out / "judge_eval.json").write_text(json.dumps(json_safe(summary), indent=2))
    (out / "verdicts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in verdict_rows(comparisons, orders)))
    write_judge_report(out, summary)
    print(headline(summary, cfg.judge))
    judge.warn_of_failures()
    print(f"wrote {out / 'judge_eval.json'}")
    return 0


def write_judge_report(out: Path, summary: dict[str, Any]) -> Path:
    spec, agreement = summary["judge"]["judge"], summary["agreement"]
    measured = {**agreement, "pairs": summary["pairs"], "source": "this judge-eval"}
    report = Report(
        f"Judge evaluation: {spec}",
        {
            "folder": str(out),
            "judge": spec,
            "data": summary.get("data"),
            "pairs": summary["pairs"],
            "verdicts": summary["verdicts"],
            "unparseable verdicts": summary["unparseable"],
            "failed calls (no reply)": summary["failed"],
            "ties": summary["ties"],
        },
    )
    report.number(
        "agreement with humans (both orders)",
        (agreement["agreement"], agreement["low"], agreement["high"]),
        summary["longer_baseline"]["agreement"],
        "always prefer the longer response",
        judge_caveat(spec, measured),
    )
    report.number("agreement with humans, against chance", agreement["agreement"], 0.5, "chance (a coin)")
    bias, length = summary["position_bias"], summary["length_preference"]
    report.number("votes for the response shown first", bias["first_position_share"], 0.5, "a judge blind to position")
    report.number("same pick in both orders", bias["consistent_share"], 1.0, "a judge blind to position")
    report.number(
        "votes for the longer response",
        length["judge_picks_longer"],
        length["humans_pick_longer"],
        "humans on the same pairs",
    )
    for name in ("split", "batch", "confidence", "task"):
        groups = summary.get("breakdown", {}).get(name, {})
        report.table(
            f"Agreement by {name}", [{name: g, **s} for g, s in groups.items()], [name, "accuracy", "count", "stderr"]
        )
    report.table("Judge", key_values(summary["judge"]), ["key", "value"])
    report.table("Calls and cost", key_values(summary["stats"]), ["key", "value"])
    return report.write(out)
