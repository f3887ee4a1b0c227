"""`rlhfkit data analyze`: what is in a dataset before anything trains on it.

Counts per split, batch, policy pair and confidence (Details 1, 6), token-length histograms of
queries, references, chosen and rejected responses (Detail 4, the paper's Figures 9-10), how many
queries needed truncation (Detail 2), the edge-case table of seed 002 (ties, too-short responses)
and the length bias of human preferences, plus every skipped record by reason.

Any format a stage reads can be analysed (docs/data-formats.md): `dataset=auto` detects it from the
first record's columns, as pair data, SFT data or prompts, in that order, and prints what it read.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..config import AnalyzeConfig, to_yaml
from ..errors import ConfigError
from ..models import load_tokenizer
from ..plots import pyplot, save
from . import (
    AUTO,
    PAIRS,
    PROMPTS,
    SFT,
    STANDARD_NAMES,
    Role,
    detected,
    first_record,
    format_columns,
    load_role,
    usable,
)
from .examples import query_limits, tokenize_pairs, tokenize_sft
from .records import MissingColumns, SkipLog

TOO_SHORT_TOKENS = 3  # responses below this many tokens (EOS excluded) are counted as too short
NO_LENGTH_LIMIT = 10**9


def describe(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {"count": 0}
    a = np.asarray(lengths)
    return {
        "count": int(a.size),
        "min": int(a.min()),
        "median": float(np.median(a)),
        "mean": round(float(a.mean()), 2),
        "std": round(float(a.std()), 2),
        "p95": round(float(np.percentile(a, 95)), 2),
        "max": int(a.max()),
    }


def counts(values: list[Any]) -> dict[str, int]:
    return {str(k): n for k, n in Counter(values).most_common()}


def truncation_stats(queries: list) -> dict[str, Any]:
    truncated = [q for q in queries if q.truncated]
    removed = [q.original_length - len(q.ids) for q in truncated]
    return {
        "queries": len(queries),
        "truncated": len(truncated),
        "truncated_fraction": round(len(truncated) / max(len(queries), 1), 4),
        "paragraphs_dropped": describe([q.paragraphs_dropped for q in truncated]),
        "token_cut_fallback": sum(q.token_cut for q in queries),
        "tokens_removed": describe(removed),
    }


def length_bias(chosen: list[int], rejected: list[int]) -> dict[str, float]:
    c, r = np.asarray(chosen), np.asarray(rejected)
    n = max(len(c), 1)
    return {
        "chosen_mean": round(float(c.mean()), 2) if len(c) else 0.0,
        "rejected_mean": round(float(r.mean()), 2) if len(r) else 0.0,
        "chosen_median": float(np.median(c)) if len(c) else 0.0,
        "rejected_median": float(np.median(r)) if len(r) else 0.0,
        "chosen_longer_fraction": round(float((c > r).sum()) / n, 4),
        "equal_length_fraction": round(float((c == r).sum()) / n, 4),
        "chosen_shorter_fraction": round(float((c < r).sum()) / n, 4),
    }


def edge_cases(raw_total: int, ties: int, chosen: list[int], rejected: list[int]) -> list[dict[str, Any]]:
    """Seed 002's edge-case table; percentages are of all records read."""
    rows = [
        ("valid pairs", len(chosen)),
        ("ties (identical responses)", ties),
        (f"chosen too short (< {TOO_SHORT_TOKENS} tokens)", sum(n < TOO_SHORT_TOKENS for n in chosen)),
        (f"rejected too short (< {TOO_SHORT_TOKENS} tokens)", sum(n < TOO_SHORT_TOKENS for n in rejected)),
    ]
    return [{"condition": c, "count": n, "percent": round(100 * n / max(raw_total, 1), 2)} for c, n in rows]


# auto tries pair data first: its columns (chosen, rejected) are the most specific; prompts last, since any SFT data
# has a prompt. A name two roles share (tldr-sft, gsm8k, hh) is read as SFT data or as pairs.
DETECTION_ORDER = (PAIRS, SFT, PROMPTS)
NAMED_ORDER = (SFT, PAIRS, PROMPTS)


def analysis_role(dataset: str, paths: list[str], hf_split: str) -> Role:
    """What `dataset` reads `paths` as: the role that names it, or with `auto` the first whose formats fit
    the first record's columns."""
    if dataset != AUTO:
        return next(role for role in NAMED_ORDER if dataset in role.names)
    row, record = first_record(paths, hf_split)
    role = next((role for role in DETECTION_ORDER if detected(role, record, STANDARD_NAMES)), None)
    if role is None:
        formats = {name: format_columns(r, name, STANDARD_NAMES) for r in DETECTION_ORDER for name in r.detection_order}
        accepted = "; ".join(f"{name} ({columns})" for name, columns in formats.items())
        raise MissingColumns(
            f"{row.where}: no data format has the columns {', '.join(record) or '(none)'}; accepted: {accepted} "
            "(see docs/data-formats.md)",
            record,
        )
    return role


def analyze_sft(
    paths: list[str],
    tokenizer: PreTrainedTokenizerBase,
    max_query_length: int,
    hf_split: str = "",
    dataset: str = "tldr-sft",
    role: Role = SFT,
) -> dict:
    """SFT data or prompts: query and reference lengths (a prompt without a reference has length 0)."""
    records, log = usable(
        load_role(role, dataset, paths, hf_split, STANDARD_NAMES), paths, "examples", f"dataset={dataset}"
    )
    examples, _ = tokenize_sft(
        tqdm(records, desc="tokenizing", unit="record"), tokenizer, max_query_length, NO_LENGTH_LIMIT
    )
    by_subreddit = all("subreddit" in r.fields for r in records)
    return {
        "records": log.to_dict(),
        "counts": {"subreddit": counts([r.fields["subreddit"] for r in records])}
        if by_subreddit
        else {"task": counts([r.task for r in records])},
        "token_lengths": {
            "query_before_truncation": describe([e.query.original_length for e in examples]),
            "query": describe([len(e.query.ids) for e in examples]),
            "reference": describe([len(e.response) - 1 for e in examples]),
        },
        "truncation": truncation_stats([e.query for e in examples]),
        "_lengths": {
            "query": [len(e.query.ids) for e in examples],
            "reference": [len(e.response) - 1 for e in examples],
        },
    }


def analyze_pairs(
    paths: list[str], tokenizer: PreTrainedTokenizerBase, limits: dict[str, int], fmt: str, hf_split: str = ""
) -> dict:
    records, log = usable(load_role(PAIRS, fmt, paths, hf_split, STANDARD_NAMES), paths, "pairs", f"dataset={fmt}")
    examples, _ = tokenize_pairs(tqdm(records, desc="tokenizing", unit="pair"), tokenizer, limits, NO_LENGTH_LIMIT)
    chosen = [len(e.chosen) - 1 for e in examples]
    rejected = [len(e.rejected) - 1 for e in examples]
    result = {
        "records": log.to_dict(),
        "counts": {
            "task": counts([r.task for r in records]),
            "split": counts([r.split for r in records]),
            "batch": counts([r.batch for r in records]),
            "confidence": counts([r.confidence for r in records]),
            "policy_pair": counts([r.policy_pair for r in records]),
            "distinct_prompts": len({r.prompt_id for r in records}),
        },
        "token_lengths": {
            "query_before_truncation": describe([e.query.original_length for e in examples]),
            "query": describe([len(e.query.ids) for e in examples]),
            "chosen": describe(chosen),
            "rejected": describe(rejected),
        },
        "truncation": truncation_stats([e.query for e in examples]),
        "truncation_by_task": {
            t: truncation_stats([e.query for e in examples if e.record.task == t])
            for t in sorted({r.task for r in records})
        },
        "edge_cases": edge_cases(log.kept + log.skipped, log.counts.get("tie", 0), chosen, rejected),
        "length_bias": {"all": length_bias(chosen, rejected)},
        "_lengths": {"query": [len(e.query.ids) for e in examples], "chosen": chosen, "rejected": rejected},
    }
    for attribute in ("task", "split"):
        for value in sorted({getattr(r, attribute) for r in records}):
            idx = [i for i, e in enumerate(examples) if getattr(e.record, attribute) == value]
            result["length_bias"][f"{attribute}={value}"] = length_bias(
                [chosen[i] for i in idx], [rejected[i] for i in idx]
            )
    if fmt != "hh":  # Detail 6: validation comparisons span far more policy pairs (out of distribution)
        result["counts"]["policy_pairs_distinct_by_split"] = {
            s: len({r.policy_pair for r in records if r.split == s}) for s in sorted({r.split for r in records})
        }
    return result


def plot_histograms(lengths: dict[str, list[int]], out: Path) -> list[str]:
    plt = pyplot()
    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lengths["query"], bins=50, color="tab:gray")
    ax.set(title="Query token length (after truncation)", xlabel="tokens", ylabel="records")
    save(fig, out / "query_lengths.png")
    files.append("query_lengths.png")
    responses = {k: v for k, v in lengths.items() if k != "query"}
    fig, ax = plt.subplots(figsize=(7, 4))
    top = max(max(v) for v in responses.values() if v) if any(responses.values()) else 1
    bins = np.linspace(0, top + 1, 50)
    for name, values in responses.items():
        ax.hist(values, bins=bins, alpha=0.55, label=f"{name} (median {np.median(values):.0f})")
    ax.set(title="Response token length (EOS excluded)", xlabel="tokens", ylabel="records")
    ax.legend()
    save(fig, out / "response_lengths.png")
    files.append("response_lengths.png")
    if "chosen" in lengths:
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter(lengths["rejected"], lengths["chosen"], s=4, alpha=0.4)
        ax.plot([0, top], [0, top], color="black", lw=1)
        ax.set(title="Length bias: chosen vs rejected", xlabel="rejected tokens", ylabel="chosen tokens")
        save(fig, out / "length_bias.png")
        files.append("length_bias.png")
    return files


def plot_counts(result_counts: dict[str, Any], out: Path) -> list[str]:
    plt = pyplot()
    files = []
    for name, table in result_counts.items():
        if not isinstance(table, dict) or len(table) < 2 or name.endswith("by_split"):
            continue
        items = list(table.items())[:25]
        fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * len(items) + 1)))
        ax.barh([k for k, _ in items][::-1], [v for _, v in items][::-1], color="tab:blue")
        ax.set(title=f"Records per {name}" + (" (top 25)" if len(table) > 25 else ""), xlabel="records")
        ax.tick_params(axis="y", labelsize=7)
        save(fig, out / f"counts_{name}.png")
        files.append(f"counts_{name}.png")
    return files


def run_analysis(
    dataset: str,
    paths: list[str],
    tokenizer: PreTrainedTokenizerBase,
    out: str,
    max_query_length: int,
    max_article_query_length: int,
    hf_split: str = "",
) -> dict:
    """Analyse `paths` as `dataset` (a format name, or auto), write analysis.json and PNG plots to `out`,
    return the result."""
    role = analysis_role(dataset, paths, hf_split)
    if role is PAIRS:
        result = analyze_pairs(
            paths, tokenizer, query_limits(max_query_length, max_article_query_length), dataset, hf_split
        )
    else:
        result = analyze_sft(paths, tokenizer, max_query_length, hf_split, dataset, role)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    lengths = result.pop("_lengths")
    plots = plot_histograms(lengths, folder) + plot_counts(result["counts"], folder) if lengths["query"] else []
    result = {
        "dataset": dataset,
        "read_as": f"{role.what} data",
        "paths": paths,
        "tokenizer": getattr(tokenizer, "name_or_path", ""),
        "max_query_length": max_query_length,
        "max_article_query_length": max_article_query_length,
        **result,
        "plots": plots,
    }
    (folder / "analysis.json").write_text(json.dumps(result, indent=2))
    return result


def headline(result: dict) -> str:
    """A few lines for the terminal: what was kept, skipped, truncated, and the length bias."""
    log = SkipLog()
    log.kept = result["records"]["kept"]
    log.counts.update(result["records"]["by_reason"])
    log.examples = result["records"]["examples"]
    lines = [
        log.summary(),
        f"queries truncated: {result['truncation']['truncated']} of {result['truncation']['queries']}",
    ]
    if "length_bias" in result:
        bias = result["length_bias"]["all"]
        lines.append(
            f"chosen longer than rejected in {100 * bias['chosen_longer_fraction']:.1f}% of pairs "
            f"(median tokens chosen {bias['chosen_median']:.0f}, rejected {bias['rejected_median']:.0f})"
        )
    return "\n".join(lines)


def run(cfg: AnalyzeConfig) -> int:
    """`rlhfkit data analyze`: the analysis of `cfg.path`, its config and plots in `cfg.out`."""
    if not cfg.path:
        raise ConfigError("data analyze needs --path (files, folders or a hub dataset id)")
    tokenizer = load_tokenizer(cfg.model)
    result = run_analysis(
        cfg.dataset, cfg.path, tokenizer, cfg.out, cfg.max_query_length, cfg.max_article_query_length, cfg.hf_split
    )
    (Path(cfg.out) / "config.yaml").write_text(to_yaml(cfg, "data-analyze"))
    print(headline(result))
    print(f"wrote {cfg.out}/analysis.json, config.yaml and {len(result['plots'])} plots")
    return 0
