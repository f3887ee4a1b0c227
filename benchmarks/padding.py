"""Tokens computed per epoch with and without length-bucketed micro-batches, on real TL;DR data under a
preset's schedule, as one JSON line per stage. Deterministic: it counts, it does not time.

    python benchmarks/padding.py
    python benchmarks/padding.py --stages sft --limit 64 --total-batch 16 --micro-batch 4   # smoke test

Each optimizer step's examples are the supervised trainer's (`batch_indices`: the same seed and permutation as a
run); a micro-batch is right-padded to its longest row, so the rows it computes are micro batch x that
width. Bucketing cuts a step's examples into micro-batches in order of length; the step still sees the
same examples. SFT rows are query + reference summary (the SFT sample); RM and DPO rows are query +
the longer of the pair's two summaries, each pair two rows (human comparisons, batches 13 and 18).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PRESETS = {"sft": "tldr-sft", "rm": "tldr-rm", "dpo": "tldr-dpo"}
SOURCES = {
    "sft": ["tldr-sft-sample/tldr_sft_sample.jsonl.gz"],
    "rm": [
        "summarize-from-feedback-comparisons/batch13.jsonl.gz",
        "summarize-from-feedback-comparisons/batch18.jsonl.gz",
    ],
}
SOURCES["dpo"] = SOURCES["rm"]


def examples_for(stage: str, cfg, tokenizer) -> list:
    if stage == "sft":
        from rlhfkit.data import load_sft
        from rlhfkit.data.examples import tokenize_sft

        records, _ = load_sft(cfg.data)
        return tokenize_sft(records, tokenizer, cfg.max_query_length, cfg.max_response_length)[0]
    from rlhfkit.data.examples import prepare_pairs
    from rlhfkit.data.split import split_comparisons

    train_records, _, _ = split_comparisons(cfg.pair_selection)
    return prepare_pairs(cfg.lengths, tokenizer, train_records)[0]


def epoch_tokens(schedule, seed: int, widths: list[int], rows_per_example: int, bucketed: bool) -> tuple[int, int]:
    """(tokens computed, padding included; tokens of the examples themselves) over one epoch."""
    from rlhfkit.trainers.supervised import batch_indices

    computed = real = 0
    for step in range(schedule.steps_per_epoch):
        for micro in batch_indices(schedule, seed, step, 0, widths if bucketed else None):
            computed += rows_per_example * len(micro) * max(widths[i] for i in micro)
            real += rows_per_example * sum(widths[i] for i in micro)
    return computed, real


def count(stage: str, args, tokenizer) -> dict:
    from rlhfkit.stages import resolve
    from rlhfkit.trainers.supervised import plan_schedule

    overrides = {"data": ",".join(str(DATA / s) for s in SOURCES[stage])}
    overrides |= {
        key: value
        for key, value in (("total_batch_size", args.total_batch), ("micro_batch_size", args.micro_batch))
        if value
    }
    cfg = resolve(stage, PRESETS[stage], None, overrides)
    examples = examples_for(stage, cfg, tokenizer)[: args.limit or None]
    widths = [e.width() for e in examples]
    schedule = plan_schedule(cfg, len(examples), 1)
    rows = 1 if stage == "sft" else 2
    plain, real = epoch_tokens(schedule, cfg.seed, widths, rows, bucketed=False)
    bucketed, _ = epoch_tokens(schedule, cfg.seed, widths, rows, bucketed=True)
    return {
        "benchmark": "padding",
        "stage": stage,
        "preset": PRESETS[stage],
        "examples": len(examples),
        "total_batch_size": cfg.total_batch_size,
        "micro_batch_size": cfg.micro_batch_size,
        "steps": schedule.steps_per_epoch,
        "real_tokens": real,
        "computed_tokens_plain": plain,
        "computed_tokens_bucketed": bucketed,
        "padding_share_plain": round(1 - real / plain, 4),
        "padding_share_bucketed": round(1 - real / bucketed, 4),
        "bucketed_over_plain": round(bucketed / plain, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default="sft,rm,dpo")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N examples (0: all)")
    parser.add_argument("--total-batch", type=int, default=0, help="override the preset's total_batch_size")
    parser.add_argument("--micro-batch", type=int, default=0, help="override the preset's micro_batch_size")
    args = parser.parse_args()
    from rlhfkit.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    for stage in args.stages.split(","):
        print(json.dumps(count(stage, args, tokenizer)))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
