"""SFT, RM and DPO on real TL;DR data: seconds for one epoch, ours beside TRL 1.13 at its defaults and with its
padding-free and packing options, in the same invocation. One JSON line per trainer.

    pip install -e ".[bench]"
    python benchmarks/compare_trl_epoch.py --trainers sft,rm,dpo --sft-examples 64 --pairs 32
    python benchmarks/compare_trl_epoch.py --trainers sft,rm,dpo --model tiny --sft-examples 8 --pairs 4   # smoke

Where `compare_trl.py` times steps of fixed-length random rows, this reads real rows, whose lengths vary, so
what each side does with padding shows: the first `--sft-examples` posts of the SFT sample
(../shared/data/tldr-sft-sample, query + reference summary) and the first `--pairs` human comparisons of batch 13
(../shared/data/summarize-from-feedback-comparisons), tokenized once by rlhfkit's own pipeline (the presets'
query format and length limits) and handed to both sides as the same token ids (TRL's DPO takes text, so it
gets the decoded text and re-tokenizes it; `trl_real_tokens` shows what it got back).

The presets' batch settings (tldr-sft: 128 rows a step in micro-batches of 8; tldr-rm and tldr-dpo: 64 pairs in
micro-batches of 4), each step no larger than the examples; fp32 (or `--bf16` autocast) on both sides; AdamW,
lr, schedule, clipping, gradient checkpointing off and dropout off as in `compare_trl.py`.

Sides (every run a child process, the sides alternating over `--repeats`):
    ours              `SupervisedStage` as `rlhfkit sft|rm|dpo` builds it: micro-batches cut from each step's
                      examples in order of length (`supervised.batch_indices`), RM pairs and (shared_prefix=auto)
                      DPO pairs one row each with the query read once; DPO's reference pass counts in its epoch
    ours_rows         dpo only: shared_prefix=off, a row per response (what the shared rows save)
    trl               TRL's defaults: pad each micro-batch to its longest row, examples in random order; DPO
                      computes the reference's log-probabilities inside every step (precompute_ref_log_probs=False)
    trl_padding_free  sft only: `padding_free=True`, each micro-batch one row with position ids restarting per
                      example (TRL 1.13 has no such option for RM, and switches it off for DPO)
    trl_packing       sft only: `packing=True` (best-fit decreasing into rows of max_length 1024)

Fields per side: `{side}_epoch_s` (ours: the sum of its steps' `perf/step_s`, plus the reference pass for DPO;
TRL: from the start of its first step to the end of its last, batches fetched and collated included),
`{side}_steps`, `{side}_epoch_s_runs` (every repeat), `{side}_peak_rss_bytes`; the ratios
`{side}_over_ours` (above 1: ours is faster); `real_tokens` (the examples' tokens, a row per response).
The losses the sides compute are equal up to float order: bucketing only reorders a step's examples
(tests/runs/test_checkpoint_tracking.py) and DPO's shared rows give the loss and gradient of rows of their
own (tests/trainers/test_dpo.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from compare_trl import (
    GRAD_CLIP,
    SUPERVISED_PRESETS,
    child_env,
    prepare_model,
    require_trl,
    run_child,
    step_timer,
    trl_common,
    write_result,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SOURCES = {
    "sft": DATA / "tldr-sft-sample" / "tldr_sft_sample.jsonl.gz",
    "rm": DATA / "summarize-from-feedback-comparisons" / "batch13.jsonl.gz",
}
SOURCES["dpo"] = SOURCES["rm"]
SIDES = {
    "sft": ("ours", "trl", "trl_padding_free", "trl_packing"),
    "rm": ("ours", "trl"),
    "dpo": ("ours", "ours_rows", "trl"),
}
# padding-free TRL takes no max_length unless it packs: the rows are cut to the preset's limits already
TRL_OPTIONS = {
    "trl": {},
    "trl_padding_free": {"padding_free": True, "max_length": None},
    "trl_packing": {"packing": True},
}


# ---------------------------------------------------------------- parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", default="sft,rm,dpo", help="comma separated, from sft, rm, dpo")
    parser.add_argument("--model", default="smollm2-135m", help="embedded name, HF directory, or 'tiny'")
    parser.add_argument("--sft-examples", type=int, default=64, help="SFT posts in the epoch")
    parser.add_argument("--pairs", type=int, default=32, help="RM and DPO comparisons in the epoch")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides")
    parser.add_argument("--worker", choices=["prepare", *TRL_OPTIONS, "ours", "ours_rows"], help=argparse.SUPPRESS)
    parser.add_argument("--trainer", choices=list(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    unknown = sorted(set(args.trainers) - set(SIDES))
    if unknown:
        parser.error(f"unknown trainers {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    return args


def launch(args: argparse.Namespace, worker: str, out_dir: Path, model_dir: Path, trainer: str | None = None) -> dict:
    out_dir.mkdir(parents=True)
    settings = [f"--{key.replace('_', '-')}={getattr(args, key)}" for key in ("model", "sft_examples", "pairs")]
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        f"--worker={worker}",
        f"--model-dir={model_dir}",
        f"--out-dir={out_dir}",
        f"--threads={args.threads}",
        f"--device={args.device}",
        *settings,
        *(["--bf16"] if args.bf16 else []),
        *([f"--trainer={trainer}"] if trainer else []),
    ]
    return run_child(command, child_env(args.threads, args.device), out_dir, f"the {worker} run of {trainer}")


def compare(args: argparse.Namespace, trainer: str, model_dir: Path, scratch: Path) -> dict:
    sides = SIDES[trainer]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side in sides:
            run = launch(args, side, scratch / f"{trainer}-{side}-{repeat}", model_dir, trainer)
            runs[side].append(run)
            print(f"{trainer} {side} run {repeat + 1}: {run['epoch_s']:.2f} s", file=sys.stderr, flush=True)
    first = runs["ours"][0]
    row = {
        "benchmark": "compare_trl_epoch",
        "trainer": trainer,
        "model": args.model,
        "examples": first["examples"],
        "example_unit": "posts" if trainer == "sft" else "pairs",
        "real_tokens": first["real_tokens"],
        "total_batch_size": first["total_batch_size"],
        "micro_batch_size": first["micro_batch_size"],
        "repeats": args.repeats,
        "threads": args.threads,
        "precision": "bf16-autocast" if args.bf16 else "fp32",
    }
    for side, side_runs in runs.items():
        epochs = [run["epoch_s"] for run in side_runs]
        row |= {
            f"{side}_epoch_s": round(statistics.median(epochs), 3),
            f"{side}_epoch_s_runs": [round(e, 3) for e in epochs],
            f"{side}_steps": side_runs[0]["steps"],
            f"{side}_peak_rss_bytes": int(statistics.median(run["peak_rss_bytes"] for run in side_runs)),
        }
        row |= {f"{side}_{key}": value for key, value in side_runs[0].get("extra", {}).items()}
    for side in sides[1:]:
        row[f"{side}_over_ours"] = round(row[f"{side}_epoch_s"] / row["ours_epoch_s"], 3)
    trl_run = runs["trl"][0]
    return row | {"trl_version": trl_run["trl_version"]} | trl_run["machine"]


def main_parent(args: argparse.Namespace) -> None:
    require_trl(args.trainers)
    with tempfile.TemporaryDirectory(prefix="compare-trl-epoch-") as tmp:
        scratch = Path(tmp)
        model_dir = scratch / "model"
        launch(args, "prepare", scratch / "prepare", model_dir)
        for trainer in args.trainers:
            print(json.dumps(compare(args, trainer, model_dir, scratch)), flush=True)


# ---------------------------------------------------------------- children


def our_config(args: argparse.Namespace, trainer: str, run_dir: Path, examples: int, rows: bool = False):
    """The stage's preset on the real data, each step no larger than the epoch's examples."""
    from rlhfkit.stages import resolve

    preset = resolve(trainer, SUPERVISED_PRESETS[trainer], None, {"data": str(SOURCES[trainer])})
    total = min(preset.total_batch_size, examples)
    micro = min(preset.micro_batch_size, total)
    total -= total % micro  # whole micro-batches
    overrides = {
        "model": str(args.model_dir),
        "data": str(SOURCES[trainer]),
        "output_dir": str(run_dir),
        "total_batch_size": total,
        "micro_batch_size": micro,
        "max_steps": examples // total,
        "max_grad_norm": GRAD_CLIP,
        "report_to": [],
        "log_every": 1,
        "save_every": 0,
        "eval_every": 0,
        "gradient_checkpointing": False,
        "mixed_precision": "bf16" if args.bf16 else "no",
    }
    if trainer == "dpo":
        overrides |= {"forward_batch_size": micro} | ({"shared_prefix": "off"} if rows else {})
    return resolve(trainer, SUPERVISED_PRESETS[trainer], None, overrides)


def real_examples(args: argparse.Namespace, trainer: str, tokenizer) -> list:
    """The epoch's examples, tokenized as `rlhfkit <trainer>` tokenizes them (SFT examples or pairs)."""
    from rlhfkit.stages import resolve

    cfg = resolve(trainer, SUPERVISED_PRESETS[trainer], None, {"data": str(SOURCES[trainer])})
    if trainer == "sft":
        from rlhfkit.data import load_sft
        from rlhfkit.data.examples import tokenize_sft

        records, _ = load_sft(cfg.data)
        return tokenize_sft(records[: args.sft_examples], tokenizer, cfg.max_query_length, cfg.max_response_length)[0]
    from rlhfkit.data.examples import prepare_pairs
    from rlhfkit.data.split import split_comparisons

    records, _, _ = split_comparisons(cfg.pair_selection)  # the training side of the split `rlhfkit rm` makes
    return prepare_pairs(cfg.lengths, tokenizer, records[: args.pairs])[0]


def rows_of(trainer: str, example) -> list[list[int]]:
    """An example's rows as a padded layout reads them: query + response, one per response."""
    if trainer == "sft":
        return [example.query.ids + example.response]
    return [example.query.ids + example.chosen, example.query.ids + example.rejected]


def run_ours(args: argparse.Namespace, trainer: str, run_dir: Path, rows: bool) -> dict:
    from rlhfkit.checkpoint import seed_everything
    from rlhfkit.models import load_policy
    from rlhfkit.tracking import read_metrics
    from rlhfkit.trainers.supervised import SupervisedStage, train

    policy, tokenizer = load_policy(str(args.model_dir))
    examples = real_examples(args, trainer, tokenizer)
    cfg = our_config(args, trainer, run_dir, len(examples), rows)
    seed_everything(cfg.seed)
    pad = tokenizer.pad_token_id
    reference_s = 0.0
    if trainer == "sft":
        from rlhfkit.trainers.sft import collate_sft, sft_loss

        stage = SupervisedStage(
            "sft",
            policy,
            tokenizer,
            examples,
            lambda b: collate_sft(b, pad, cfg.loss_on_query),
            sft_loss,
            length=lambda e: e.width(),
        )
    elif trainer == "rm":
        from rlhfkit.reward_models import ScalarModel
        from rlhfkit.scoring import collate_packed_pairs
        from rlhfkit.trainers.reward import make_pair_loss

        stage = SupervisedStage(
            "rm",
            ScalarModel.from_policy(policy),
            tokenizer,
            examples,
            lambda b: collate_packed_pairs(b, pad),
            make_pair_loss(),
            length=lambda e: e.packed_width(),
        )
    else:
        from rlhfkit.trainers.dpo import (
            REFERENCE_CACHE,
            collate_dpo,
            make_dpo_loss,
            shares_queries,
            visited_with_reference,
        )

        reference = load_policy(str(args.model_dir))[0].to(args.device).eval().requires_grad_(False)
        began = time.perf_counter()
        with_reference = visited_with_reference(reference, cfg.model, examples, pad, cfg, run_dir / REFERENCE_CACHE)
        reference_s = time.perf_counter() - began
        shared = shares_queries(policy, cfg.shared_prefix)
        stage = SupervisedStage(
            "dpo",
            policy,
            tokenizer,
            with_reference,
            lambda b: collate_dpo(b, pad, shared),
            make_dpo_loss(cfg.beta),
            length=lambda e: e.pair.packed_width() if shared else e.width(),
        )
    train(cfg, stage, run_dir)
    steps = [row["perf/step_s"] for row in read_metrics(run_dir) if "perf/step_s" in row]
    extra = {"reference_s": round(reference_s, 3)} if trainer == "dpo" else {}
    return {
        "epoch_s": sum(steps) + reference_s,
        "steps": len(steps),
        "extra": extra,
    } | epoch_fields(trainer, examples, cfg)


def epoch_fields(trainer: str, examples: list, cfg) -> dict:
    return {
        "examples": len(examples),
        "real_tokens": sum(len(row) for e in examples for row in rows_of(trainer, e)),
        "total_batch_size": cfg.total_batch_size,
        "micro_batch_size": cfg.micro_batch_size,
    }


def trl_dataset(trainer: str, examples: list, tokenizer):
    """The same examples as TRL takes them: token ids with labels (SFT), chosen and rejected ids (RM), text (DPO)."""
    from datasets import Dataset

    if trainer == "sft":
        return Dataset.from_dict(
            {
                "input_ids": [e.query.ids + e.response for e in examples],
                "labels": [[-100] * len(e.query.ids) + e.response for e in examples],
            }
        )
    if trainer == "rm":
        return Dataset.from_dict(
            {
                "chosen_ids": [e.query.ids + e.chosen for e in examples],
                "rejected_ids": [e.query.ids + e.rejected for e in examples],
            }
        )

    def text(ids: list[int]) -> str:  # without the EOS, which DPOTrainer appends to the text itself
        return tokenizer.decode(ids[:-1] if ids and ids[-1] == tokenizer.eos_token_id else ids)

    return Dataset.from_dict(
        {
            "prompt": [tokenizer.decode(e.query.ids) for e in examples],
            "chosen": [text(e.chosen) for e in examples],
            "rejected": [text(e.rejected) for e in examples],
        }
    )


def run_trl(args: argparse.Namespace, trainer: str, side: str, run_dir: Path) -> dict:
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from rlhfkit.models import load_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    examples = real_examples(args, trainer, load_tokenizer(str(args.model_dir)))
    cfg = our_config(args, trainer, run_dir, len(examples))
    accumulation = cfg.total_batch_size // cfg.micro_batch_size
    common = trl_common(args, cfg, run_dir, cfg.max_steps, cfg.micro_batch_size, accumulation)
    common |= {"max_steps": -1, "num_train_epochs": 1}  # an epoch: packing changes how many steps it takes
    data, timer = trl_dataset(trainer, examples, tokenizer), step_timer()
    if trainer == "sft":
        config = trl.SFTConfig(**common, **TRL_OPTIONS[side])
        model = AutoModelForCausalLM.from_pretrained(str(args.model_dir), dtype=torch.float32)
        built = trl.SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
        )
    elif trainer == "rm":
        config = trl.RewardConfig(**common)
        model = AutoModelForSequenceClassification.from_pretrained(
            str(args.model_dir), num_labels=1, dtype=torch.float32
        )
        built = trl.RewardTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
        )
    else:
        config = trl.DPOConfig(**common, beta=cfg.beta)
        model = AutoModelForCausalLM.from_pretrained(str(args.model_dir), dtype=torch.float32)
        built = trl.DPOTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
        )
    built.train()
    extra = {}
    if trainer == "dpo":  # what TRL's re-tokenization of the text gave back
        extra["real_tokens"] = sum(
            2 * len(row["prompt_ids"]) + len(row["chosen_ids"]) + len(row["rejected_ids"])
            for row in built.train_dataset
        )
    return {
        "epoch_s": timer.ends[-1] - timer.ends[0],
        "steps": len(timer.inside),
        "extra": extra,
        "trl_version": trl.__version__,
    } | epoch_fields(trainer, examples, cfg)


def run_worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.worker == "prepare":  # as compare_trl.py's: the weights once, and the matmul peak beside them
        prepare_model(args)
        return
    run_dir = Path(args.out_dir) / "run"
    run_dir.mkdir()
    if args.worker in TRL_OPTIONS:
        result = run_trl(args, args.trainer, args.worker, run_dir)
    else:
        result = run_ours(args, args.trainer, run_dir, rows=args.worker == "ours_rows")
    write_result(args, result)


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
    else:
        main_parent(args)


if __name__ == "__main__":
    main()
