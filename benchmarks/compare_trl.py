"""rlhfkit's trainers against TRL's: seconds per step, tokens/s and peak RSS, one JSON line per trainer.

    pip install -e ".[bench]"      # TRL 1.13.0, the version these settings were checked against
    python benchmarks/compare_trl.py --trainers sft,rm,dpo,grpo,rloo,ppo --model smollm2-135m \\
        --steps 4 --warmup 1 --repeats 2 --threads 2
    python benchmarks/compare_trl.py --trainers sft --model tiny --steps 2 --warmup 1 --repeats 1 --bf16
    python benchmarks/compare_trl.py --trainers grpo,rloo --update-epochs 1,4 --before-after eed19da --steps 1 \
        --warmup 1 --repeats 1        # ours now beside ours at a commit and TRL, at K = 1 and K = 4
    python benchmarks/compare_trl.py --device cuda --bf16 ...                          # both sides on the GPU

For each trainer the parent process runs ours, TRL, ours, TRL, ... (`--repeats` of each), every run in a
child process of this script (`--worker ours|trl`), so each run's peak RSS (`ru_maxrss`) is its own. The
parent never imports torch: a child started from a large process inherits that process's peak RSS.
Each child loads a fresh copy of the same weights (saved once by a `--worker prepare` child), builds
the same random-token rows, sets the same thread count and runs `--warmup` + `--steps` steps; the
parent drops the warm-up steps, takes each run's mean seconds per step, and prints the median over the
repeats, the per-run step times (so the noise is visible), tokens/s, peak RSS and ours/TRL ratios.

What runs on each side
    ours: the real training loops. SFT, RM and DPO build the trainer's `SupervisedStage` (its collate and loss
    function) and call `supervised.train`, which times every step itself (`perf/step_s` in metrics.jsonl:
    collation, forward, backward, clipping, AdamW and schedule). GRPO, RLOO and PPO call
    `rlhfkit.onpolicy.trainer.train_on_policy` on models built by `onpolicy_throughput.build` with the stage's preset;
    a step is one update (`perf/update_total_s`: generation, scoring, K epochs of updates).
    TRL: `SFTTrainer`, `RewardTrainer`, `DPOTrainer`, `GRPOTrainer`, `RLOOTrainer`, timed by a callback
    from the end of one optimizer step to the end of the next (so batch fetching and collation count,
    as in ours); for GRPO and RLOO a step is one generation cycle, i.e. `num_iterations` = K optimizer
    steps, so both sides time the same work. TRL 1.x has no PPO trainer: `ppo` runs ours alone and
    reports its phases (generation, scoring, update) and its generation speed.

Shapes (all rows unpadded, so tokens per step = non-padding tokens, counted alike on both sides)
    sft: `--sft-rows` rows of `--sft-length` tokens (the paper's 4 x 562), loss on the last
        `--response-length` tokens (the response; our `loss_on_query: false`).
    rm, dpo: `--pairs` pairs of `--pair-length`-token rows, chosen and rejected both counted.
    grpo, rloo, ppo: `--episodes` completions per update, `--group` per prompt (PPO: 1), prompts of
        `--query-length` tokens, completions of exactly `--response-length` tokens (TRL: forced with
        `min_new_tokens`; ours: random-word prompts almost never draw EOS, and the measured response
        length of both sides is printed), micro-batches of `--micro-batch`, K = `--update-epochs`.
    The random rows are drawn from space-prefixed word tokens, so the text TRL re-tokenizes (DPO,
    GRPO and RLOO take text) gives back exactly the same token ids; the TRL worker checks this.

Settings made equal: weights, shapes, batch and gradient accumulation, AdamW (lr, eps, no weight
decay, not fused), gradient clipping at 1.0, the schedule (our presets': cosine for SFT/RM/DPO, linear
on-policy), fp32 or, with `--bf16`, bf16 autocast (ours `mixed_precision: bf16`, TRL `use_cpu=True,
bf16=True`), gradient checkpointing off (TRL's default is on), dropout off, no evaluation, checkpoint
or hub work during training, threads (`torch.set_num_threads` and OMP_NUM_THREADS). From
our presets: DPO beta 0.05; GRPO/RLOO temperature 0.7, KL coefficient (TRL beta) 0.05, clip 0.2,
K = 4 (TRL `num_iterations`), G = 4 (TRL `num_generations`).

Differences that remain (each side runs as its users would run it)
    - SFT: TRL runs at its default `loss_type="chunked_nll"` (its real speed path since 1.x: the LM
      head runs only on labelled tokens, in chunks), as ours does.
    - DPO: both sides compute the reference log-probabilities once before training (ours always; TRL
      `precompute_ref_log_probs=True`, not its default), so a step is one policy pass on each side. Ours reads
      each pair's query once (`shared_prefix=auto`, as `rlhfkit dpo` does), as it does for RM pairs; TRL reads
      a row per response for both.
      Our run keeps the frozen reference in memory, as `rlhfkit dpo` does for its evaluation; TRL
      frees it after the precompute. This counts in peak RSS.
    - Per-step metrics with `.item()` syncs are part of each trainer's step: TRL's entropy and token
      accuracy (SFT, DPO), reward statistics (RM, GRPO, RLOO); our loss extras and rollout metrics.
    - GRPO/RLOO generation: ours encodes each prompt once per group and repeats its KV cache (and
      stops early only if every row drew EOS); TRL's `generate` prefills each of the G copies.
      TRL's reward model is `AutoModelForSequenceClassification` (same backbone, random score head)
      and scores re-tokenized prompt+completion text; ours (`ScalarModel`, random head) scores the
      sampled token ids at the EOS position. The loss formulas differ (TRL GRPO's default `dapo`
      normalisation, TRL RLOO's sequence-level ratio and KL) but not the work: one policy forward
      and backward per micro-batch, plus one old-policy, one reference and one reward forward per
      update, on both sides (TRL GRPO skips the old-policy forward when K = 1).
    - Between steps: TRL's end-to-end time includes its (cheap, everything off) callbacks and
      `_maybe_log_save_evaluate`; ours appends one metrics.jsonl row and updates its progress bar
      after `perf/step_s` is taken (the engine passes `disable=` to tqdm, so TQDM_DISABLE cannot
      turn it off). `trl_inside_s_per_step` is TRL's time from on_step_begin to on_step_end, without
      fetching and collating the batch: the two bracket TRL's step.
    - Peak RSS includes each side's imports (TRL pulls in `datasets`); ours writes a checkpoint at
      the end and TRL tokenizes datasets at construction: both outside the timed steps, but inside
      the peak.

`--before-after COMMIT` adds the `before` side: this repository at COMMIT, checked out into a temporary git
worktree, its own `compare_trl.py --worker ours` importing its own rlhfkit (checked), in the same alternation;
the line then has `before_*` fields, `after_over_before_s_per_step` and `before_s_per_step_ratio` (before / TRL).
`--update-epochs 1,4` prints one on-policy line per K. `--device cuda` runs every child on the GPU (TRL without
`use_cpu`), timing marks wait for the GPU, and each side adds `peak_cuda_bytes`; `--device cpu` (the default)
hides any GPU from the children.

Output, one JSON line per trainer (and per K for on-policy trainers): the shapes (`batch`, `row_length` or
`query_length`, `response_length`, ...), `steps`, `warmup`, `repeats`, `threads`, `precision`; for each side (`ours_`,
`trl_`) `s_per_step`, `tokens_per_step`, `tokens_per_s`, `peak_rss_bytes` (medians over the repeats),
`step_s_runs` and `peak_rss_runs` (every run's timed steps and peak), the measured
`response_length_mean` (on-policy) and our phase times (`ours_generation_s`, `ours_scoring_s`,
`ours_update_s`, `ours_generated_tokens_per_s`); the ratios ours/TRL `tokens_per_s_ratio`,
`s_per_step_ratio`, `peak_rss_ratio`; TRL's version and settings; and `machine_fields` as the children
saw the machine, with `peak_memory_bytes` the largest peak RSS of any run. SFT, RM and DPO lines add
each side's `mfu` against `matmul_peak_gflops`, the peak of the runs' precision measured once by the
`prepare` child (benchmarks/flops.py counts the model FLOPs).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAIRED = ("sft", "rm", "dpo", "grpo", "rloo")
TRAINERS = (*PAIRED, "ppo")
ON_POLICY = ("grpo", "rloo", "ppo")
SUPERVISED_PRESETS = {"sft": "tldr-sft", "rm": "tldr-rm", "dpo": "tldr-dpo"}
GRAD_CLIP = 1.0
STEP_UNITS = {False: "optimizer step", True: "update (generation, scoring, K optimizer steps)"}
PEAK_FILE = "matmul_peak.json"


# ---------------------------------------------------------------- parent: alternate the runs, aggregate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", default=",".join(PAIRED), help=f"comma separated, from {', '.join(TRAINERS)}")
    parser.add_argument("--model", default="smollm2-135m", help="embedded name, HF directory, or 'tiny'")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per run (on-policy: updates)")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and not timed")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side, alternating ours and TRL")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where both sides run (cpu hides any GPU from the children; cuda: TRL without use_cpu)",
    )
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides")
    parser.add_argument("--sft-rows", type=int, default=4)
    parser.add_argument("--sft-length", type=int, default=562, help="tokens per SFT row (paper: 562)")
    parser.add_argument("--pairs", type=int, default=2, help="RM and DPO pairs per step")
    parser.add_argument("--pair-length", type=int, default=638, help="tokens per chosen or rejected row (paper: 638)")
    parser.add_argument("--episodes", type=int, default=8, help="on-policy completions per update")
    parser.add_argument("--group", type=int, default=4, help="GRPO/RLOO completions per prompt")
    parser.add_argument("--query-length", type=int, default=400, help="on-policy prompt tokens")
    parser.add_argument("--response-length", type=int, default=53, help="response tokens, EOS included (Detail 4)")
    parser.add_argument("--micro-batch", type=int, default=4, help="on-policy rows per forward/backward")
    parser.add_argument(
        "--update-epochs",
        default="4",
        help="K passes over each rollout (Table 7); comma separated (e.g. 1,4) for one on-policy line per K",
    )
    parser.add_argument(
        "--before-after",
        metavar="COMMIT",
        help="also run ours as it was at COMMIT (a temporary git worktree, its own compare_trl.py worker) in the "
        "same alternation: the `before` side, beside `ours` (after) and TRL",
    )
    parser.add_argument(
        "--unshared",
        action="store_true",
        help="grpo, rloo: also run ours with shared-prefix rows and K=1 reuse switched off (shared_prefix=off, "
        "reuse_update_forward=false) in the same alternation",
    )
    parser.add_argument("--worker", choices=["prepare", "ours", "unshared", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--trainer", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    unknown = sorted(set(args.trainers) - set(TRAINERS))
    if unknown:
        parser.error(f"unknown trainers {', '.join(unknown)}; choose from {', '.join(TRAINERS)}")
    if args.episodes % args.micro_batch or args.episodes % args.group:
        parser.error("--episodes must be a multiple of --micro-batch and of --group")
    try:
        args.update_epochs_list = [int(k) for k in str(args.update_epochs).split(",")]
    except ValueError:
        parser.error(f"--update-epochs takes whole numbers separated by commas, not {args.update_epochs!r}")
    args.update_epochs = args.update_epochs_list[0]
    return args


def require_trl(trainers: list[str]) -> None:
    if any(t in PAIRED for t in trainers) and importlib.util.find_spec("trl") is None:
        sys.exit('compare_trl.py runs TRL\'s trainers, which are not installed: pip install -e ".[bench]"')


def child_env(threads: int, device: str) -> dict[str, str]:
    """Same threads on both sides; no hub access or telemetry; progress bars off where a variable can.
    On `cpu` the children see no GPU, so neither side's device choice can pick one."""
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    return (
        os.environ
        | hidden
        | {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TQDM_DISABLE": "1",
            "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        }
    )


def shape_argv(args: argparse.Namespace) -> list[str]:
    """The parent's settings, handed on to every child."""
    keys = [
        "model",
        "steps",
        "warmup",
        "threads",
        "sft_rows",
        "sft_length",
        "pairs",
        "pair_length",
        "episodes",
        "group",
        "query_length",
        "response_length",
        "micro_batch",
        "update_epochs",
    ]
    argv = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys]
    # --device only off the default, so that a `--before-after` worker from an older commit parses the rest
    return argv + (["--bf16"] if args.bf16 else []) + ([f"--device={args.device}"] if args.device != "cpu" else [])


def launch(args: argparse.Namespace, worker: str, out_dir: Path, model_dir: Path, trainer: str | None = None) -> dict:
    """Run one child; its result is the JSON it leaves in `out_dir/result.json`. The `before` side is our worker
    of the `--before-after` commit, in its worktree, importing that commit's rlhfkit."""
    out_dir.mkdir(parents=True)
    script, env = Path(__file__).resolve(), child_env(args.threads, args.device)
    if worker == "before":
        script, env = args.before_root / "benchmarks" / "compare_trl.py", env | {"PYTHONPATH": str(args.before_root)}
        worker = "ours"
    command = [
        sys.executable,
        str(script),
        f"--worker={worker}",
        f"--model-dir={model_dir}",
        f"--out-dir={out_dir}",
        *shape_argv(args),
    ] + ([f"--trainer={trainer}"] if trainer else [])
    return run_child(command, env, out_dir, f"the {worker} run of {trainer or 'model preparation'}")


def run_child(command: list[str], env: dict[str, str], out_dir: Path, label: str) -> dict:
    """Run one child process to its end; its result is the JSON it leaves in `out_dir/result.json`."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{label} failed (exit {done.returncode}):\n" + done.stderr[-4000:])
    result_file = out_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    shutil.rmtree(out_dir)  # checkpoints of a 135M model are over 1 GB; keep the disk free between runs
    return result


def steady_state(run: dict, warmup: int) -> tuple[list[float], float, float]:
    """(timed step seconds, mean seconds per step, mean tokens per step) of one run, warm-up dropped."""
    times, tokens = run["step_s"][warmup:], run["tokens"][warmup:]
    return times, statistics.fmean(times), statistics.fmean(tokens)


def side_summary(runs: list[dict], warmup: int, side: str) -> dict:
    """Median over the repeats of each run's steady state, plus every run's raw step times."""
    steady = [steady_state(run, warmup) for run in runs]
    s_per_step = statistics.median(s for _, s, _ in steady)
    tokens = statistics.median(t for _, _, t in steady)
    peaks = [run["peak_rss_bytes"] for run in runs]
    out = {
        f"{side}_s_per_step": round(s_per_step, 4),
        f"{side}_tokens_per_step": round(tokens, 1),
        f"{side}_tokens_per_s": round(tokens / s_per_step, 1),
        f"{side}_peak_rss_bytes": int(statistics.median(peaks)),
        f"{side}_step_s_runs": [[round(t, 4) for t in times] for times, _, _ in steady],
        f"{side}_peak_rss_runs": peaks,
    }
    if "peak_cuda_bytes" in runs[0]:
        out[f"{side}_peak_cuda_bytes"] = int(statistics.median(run["peak_cuda_bytes"] for run in runs))
    for key in runs[0].get("extra", {}):  # phase times and lengths: medians over the runs
        out[f"{side}_{key}"] = round(statistics.median(run["extra"][key] for run in runs), 4)
    return out


def utilisation(row: dict, sides: tuple[str, ...], model_dir: Path, length: int) -> dict:
    """Each side's model FLOPs utilisation against the matmul peak measured when the weights were saved."""
    from flops import mfu, training_flops_per_token

    config = argparse.Namespace(**json.loads((model_dir / "config.json").read_text()))
    peak = json.loads((model_dir / PEAK_FILE).read_text())["matmul_peak_gflops"]
    per_token = training_flops_per_token(config, length)
    mfus = {f"{side}_mfu": mfu(row[f"{side}_tokens_per_s"], per_token, peak) for side in sides}
    return {"matmul_peak_gflops": peak} | mfus


def ratios(row: dict) -> dict:
    """ours / TRL: above 1 is better for ours in tokens/s, worse in seconds and memory."""
    return {
        "tokens_per_s_ratio": round(row["ours_tokens_per_s"] / row["trl_tokens_per_s"], 3),
        "s_per_step_ratio": round(row["ours_s_per_step"] / row["trl_s_per_step"], 3),
        "peak_rss_ratio": round(row["ours_peak_rss_bytes"] / row["trl_peak_rss_bytes"], 3),
    }


def shared_over_unshared(row: dict, with_trl: bool) -> dict:
    """Ours / ours unshared: seconds per update and scoring seconds (below 1: shared rows and K=1 reuse are faster),
    and unshared / TRL."""
    out = {
        "ours_over_unshared_s_per_step": round(row["ours_s_per_step"] / row["unshared_s_per_step"], 3),
        "ours_over_unshared_scoring_s": round(row["ours_scoring_s"] / row["unshared_scoring_s"], 3),
        "ours_over_unshared_peak_rss": round(row["ours_peak_rss_bytes"] / row["unshared_peak_rss_bytes"], 3),
    }
    if with_trl:
        out["unshared_s_per_step_ratio"] = round(row["unshared_s_per_step"] / row["trl_s_per_step"], 3)
    return out


def after_over_before(row: dict, with_trl: bool) -> dict:
    """Ours now / ours at the `--before-after` commit (below 1: faster now), and before / TRL."""
    out = {
        "after_over_before_s_per_step": round(row["ours_s_per_step"] / row["before_s_per_step"], 3),
        "after_over_before_peak_rss": round(row["ours_peak_rss_bytes"] / row["before_peak_rss_bytes"], 3),
    }
    if with_trl:
        out["before_s_per_step_ratio"] = round(row["before_s_per_step"] / row["trl_s_per_step"], 3)
    return out


def shape_fields(args: argparse.Namespace, trainer: str) -> dict:
    if trainer == "sft":
        return {
            "batch": args.sft_rows,
            "batch_unit": "rows",
            "row_length": args.sft_length,
            "response_length": args.response_length,
        }
    if trainer in ("rm", "dpo"):
        return {
            "batch": args.pairs,
            "batch_unit": "pairs (2 rows each)",
            "row_length": args.pair_length,
            "response_length": args.response_length,
        }
    return {
        "batch": args.episodes,
        "batch_unit": "completions",
        "group_size": 1 if trainer == "ppo" else args.group,
        "query_length": args.query_length,
        "response_length": args.response_length,
        "micro_batch": args.micro_batch,
        "update_epochs": args.update_epochs,
    }


# the `unshared` side: ours with shared-prefix rows and K = 1 reuse of the update's forward switched off
UNSHARED = {"shared_prefix": "off", "reuse_update_forward": False}


def compare(args: argparse.Namespace, trainer: str, model_dir: Path, scratch: Path) -> dict:
    sides = ("ours", "trl") if trainer in PAIRED else ("ours",)
    if args.unshared and trainer in ("grpo", "rloo"):
        sides = ("unshared", *sides)
    if args.before_after:
        sides = ("before", *sides)
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side in sides:  # alternate, so slow drift of the machine hits both sides alike
            run = launch(args, side, scratch / f"{trainer}-{side}-k{args.update_epochs}-{repeat}", model_dir, trainer)
            runs[side].append(run)
            print(
                f"{trainer} {side} run {repeat + 1}/{args.repeats}: {[round(t, 3) for t in run['step_s']]} s/step",
                file=sys.stderr,
                flush=True,
            )
    row = {
        "benchmark": "compare_trl",
        "trainer": trainer,
        "model": args.model,
        **shape_fields(args, trainer),
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "threads": args.threads,
        "step_unit": STEP_UNITS[trainer in ON_POLICY],
        "precision": "bf16-autocast" if args.bf16 else "fp32",
    }
    for side in sides:
        row |= side_summary(runs[side], args.warmup, side)
    if trainer not in ON_POLICY:
        row |= utilisation(row, sides, model_dir, row["row_length"])
    if "unshared" in runs:
        row |= shared_over_unshared(row, "trl" in runs)
    if "before" in runs:
        row |= after_over_before(row, "trl" in runs) | {"before_commit": args.before_after}
    if "trl" in runs:
        row |= ratios(row) | {
            "trl_version": runs["trl"][0]["trl_version"],
            "trl_settings": runs["trl"][0]["settings"],
        }
    else:
        row["trl"] = "none: TRL 1.x has no PPO trainer"
    everyone = [run for side_runs in runs.values() for run in side_runs]
    # the machine as the children saw it; its peak is the largest of any run's
    peak = "peak_cuda_bytes" if args.device == "cuda" else "peak_rss_bytes"
    return row | everyone[0]["machine"] | {"peak_memory_bytes": max(run[peak] for run in everyone)}


def run_comparison(args: argparse.Namespace) -> None:
    require_trl(args.trainers)
    with tempfile.TemporaryDirectory(prefix="compare-trl-") as tmp:
        scratch = Path(tmp)
        model_dir = scratch / "model"
        launch(args, "prepare", scratch / "prepare", model_dir)
        with before_worktree(args.before_after, scratch) as args.before_root:
            for trainer in args.trainers:
                for epochs in args.update_epochs_list if trainer in ON_POLICY else args.update_epochs_list[:1]:
                    args.update_epochs = epochs
                    print(json.dumps(compare(args, trainer, model_dir, scratch)), flush=True)


@contextlib.contextmanager
def before_worktree(commit: str | None, scratch: Path):
    """A detached git worktree of this repository at `commit` for the `before` side (None without
    --before-after), removed afterwards; its workers must import that tree's rlhfkit, which is checked."""
    if commit is None:
        yield None
        return
    repository, root = Path(__file__).resolve().parents[1], scratch / "before"
    git = ["git", "-C", str(repository)]
    made = subprocess.run([*git, "worktree", "add", "--detach", str(root), commit], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"--before-after {commit}: git worktree add failed: {made.stderr.strip()}")
    try:
        probe = "import rlhfkit, pathlib; print(pathlib.Path(rlhfkit.__file__).resolve())"
        found = subprocess.run(
            [sys.executable, "-P", "-c", probe],  # -P: as a script, without the working directory first
            env=os.environ | {"PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not found.startswith(str(root.resolve())):
            sys.exit(f"--before-after: the worker imports rlhfkit from {found}, not from the worktree {root}")
        yield root
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(root)], capture_output=True, check=False)


# ---------------------------------------------------------------- children: one run each


def prepare_model(args: argparse.Namespace) -> None:
    """Save the policy (with our [PAD] token and dropout off) once: every run loads this copy, and TRL
    reloads its reference from it (`model.config._name_or_path`)."""
    from rlhfkit.models import load_policy
    from rlhfkit.tiny_models import tiny_policy

    model, tokenizer = tiny_policy() if args.model == "tiny" else load_policy(args.model)
    model.save_pretrained(args.model_dir)
    tokenizer.save_pretrained(args.model_dir)
    measure_peak(args)


def measure_peak(args: argparse.Namespace) -> None:
    """The matmul peak of the runs' precision on this machine, beside the weights (for the MFU)."""
    import torch
    from benchmark_common import matmul_peak_gflops

    peak = matmul_peak_gflops(torch.bfloat16 if args.bf16 else torch.float32, torch.device(args.device))
    (Path(args.model_dir) / PEAK_FILE).write_text(json.dumps({"matmul_peak_gflops": peak}))


def word_rows(tokenizer, rows: int, length: int, seed: int) -> list[list[int]]:
    """Random rows of space-prefixed lowercase word tokens: decoding and re-tokenizing gives the same ids."""
    import re

    import numpy as np

    words = sorted(i for token, i in tokenizer.get_vocab().items() if re.fullmatch("\u0120[a-z]{2,}", token))
    return np.random.default_rng(seed).choice(words, size=(rows, length)).tolist()


def supervised_rows(
    args: argparse.Namespace, trainer: str, tokenizer
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """(queries, responses, rejected responses) for every step of the run; responses end with EOS."""
    total = args.warmup + args.steps
    rows = total * (args.sft_rows if trainer == "sft" else args.pairs)
    length = args.sft_length if trainer == "sft" else args.pair_length
    query_length = length - args.response_length
    queries = word_rows(tokenizer, rows, query_length, seed=1)
    chosen, rejected = (
        [r[:-1] + [tokenizer.eos_token_id] for r in word_rows(tokenizer, rows, args.response_length, seed)]
        for seed in (2, 3)
    )
    return queries, chosen, rejected


def supervised_tokens(args: argparse.Namespace, trainer: str) -> int:
    return args.sft_rows * args.sft_length if trainer == "sft" else 2 * args.pairs * args.pair_length


def on_policy_prompts(args: argparse.Namespace, trainer: str, tokenizer) -> list[list[int]]:
    group = 1 if trainer == "ppo" else args.group
    return word_rows(tokenizer, (args.warmup + args.steps) * args.episodes // group, args.query_length, seed=4)


def our_config(args: argparse.Namespace, trainer: str, run_dir: Path, unshared: bool = False):
    """Our preset for the stage with the benchmark's shapes; TRL reads its hyperparameters from here too.
    `unshared`: shared-prefix rows and K = 1 reuse switched off (UNSHARED)."""
    from rlhfkit.stages import resolve

    common = {
        "model": str(args.model_dir),
        "output_dir": str(run_dir),
        "max_steps": args.warmup + args.steps,
        "max_grad_norm": GRAD_CLIP,
        "report_to": [],
        "log_every": 1,
        "save_every": 0,
        "eval_every": 0,
        "gradient_checkpointing": False,
        "mixed_precision": "bf16" if args.bf16 else "no",
    }
    if trainer in SUPERVISED_PRESETS:
        rows = args.sft_rows if trainer == "sft" else args.pairs
        extra = {"forward_batch_size": args.pairs} if trainer == "dpo" else {}
        return resolve(
            trainer,
            SUPERVISED_PRESETS[trainer],
            None,
            common | {"total_batch_size": rows, "micro_batch_size": rows} | extra,
        )
    from onpolicy_throughput import PRESETS

    return resolve(
        trainer,
        PRESETS[trainer],
        None,
        common
        | {
            "total_batch_size": args.episodes,
            "micro_batch_size": args.micro_batch,
            "generation_batch_size": args.episodes,
            "forward_batch_size": args.micro_batch,
            "max_response_length": args.response_length,
            "update_epochs": args.update_epochs,
            "reward_model": "unused",
            "sample_every": 0,
        }
        | (UNSHARED if unshared else {}),
    )


def our_stage(args: argparse.Namespace, trainer: str, cfg, run_dir: Path):
    """(the stage `rlhfkit <trainer>` would train, models its run keeps in memory beside it)."""
    from rlhfkit.checkpoint import seed_everything
    from rlhfkit.data.examples import PairExample, SFTExample
    from rlhfkit.data.formats import QueryTokens
    from rlhfkit.models import load_policy
    from rlhfkit.reward_models import ScalarModel
    from rlhfkit.trainers.supervised import SupervisedStage

    seed_everything(cfg.seed)  # as start_run does before any model is built (the reward head's init)
    policy, tokenizer = load_policy(cfg.model)
    pad = tokenizer.pad_token_id
    queries, chosen, rejected = supervised_rows(args, trainer, tokenizer)
    encoded = [QueryTokens(q, "", len(q), 0, False) for q in queries]
    if trainer == "sft":
        from rlhfkit.trainers.sft import collate_sft, sft_loss

        examples = [SFTExample(None, q, r) for q, r in zip(encoded, chosen, strict=True)]
        return SupervisedStage(
            "sft", policy, tokenizer, examples, lambda b: collate_sft(b, pad, cfg.loss_on_query), sft_loss
        ), []
    pairs = [PairExample(None, q, c, r) for q, c, r in zip(encoded, chosen, rejected, strict=True)]
    if trainer == "rm":
        from rlhfkit.scoring import collate_packed_pairs
        from rlhfkit.trainers.reward import make_pair_loss

        model = ScalarModel.from_policy(policy)
        return SupervisedStage(
            "rm", model, tokenizer, pairs, lambda b: collate_packed_pairs(b, pad), make_pair_loss()
        ), []
    from rlhfkit.trainers.dpo import (
        REFERENCE_CACHE,
        collate_dpo,
        make_dpo_loss,
        shares_queries,
        visited_with_reference,
    )

    reference = load_policy(cfg.model)[0].to(args.device).eval().requires_grad_(False)
    examples = visited_with_reference(reference, cfg.model, pairs, pad, cfg, run_dir / REFERENCE_CACHE)
    shared = shares_queries(policy, cfg.shared_prefix)  # as `rlhfkit dpo` reads the pairs: each query once
    return SupervisedStage(
        "dpo", policy, tokenizer, examples, lambda b: collate_dpo(b, pad, shared), make_dpo_loss(cfg.beta)
    ), [reference]


def run_ours(args: argparse.Namespace, trainer: str, run_dir: Path, unshared: bool = False) -> dict:
    from rlhfkit.tracking import read_metrics

    cfg = our_config(args, trainer, run_dir, unshared)
    if trainer in ON_POLICY:
        return run_ours_on_policy(args, trainer, cfg, run_dir)
    from rlhfkit.trainers.supervised import train

    # the DPO reference stays referenced until training ends, as `rlhfkit dpo` keeps it for its evaluation
    stage, _kept_in_memory = our_stage(args, trainer, cfg, run_dir)
    train(cfg, stage, run_dir)
    times = [row["perf/step_s"] for row in read_metrics(run_dir)]
    return {"step_s": times, "tokens": [supervised_tokens(args, trainer)] * len(times)}


def run_ours_on_policy(args: argparse.Namespace, trainer: str, cfg, run_dir: Path) -> dict:
    import torch
    from onpolicy_throughput import build

    from rlhfkit.onpolicy.trainer import Launch, train_on_policy, update_plan
    from rlhfkit.tracking import read_metrics
    from rlhfkit.trainers.run import autocast_precision

    models = build(cfg.model, torch.device(args.device), with_value=trainer == "ppo")
    plan = update_plan(models, cfg, autocast_precision(cfg))
    prompts = on_policy_prompts(args, trainer, models.tokenizer)
    train_on_policy(models, prompts, cfg, run_dir, launch=Launch.of(cfg), plan=plan)
    rows = read_metrics(run_dir)
    timed = rows[args.warmup :]
    phases = {
        name: statistics.fmean(row[f"perf/{name}"] for row in timed)
        for name in ("generation_s", "scoring_s", "update_s", "generated_tokens_per_s")
    }
    return {
        "step_s": [row["perf/update_total_s"] for row in rows],
        "tokens": [args.episodes * (args.query_length + row["response/length_mean"]) for row in rows],
        "extra": phases | {"response_length_mean": statistics.fmean(row["response/length_mean"] for row in timed)},
    }


def step_timer():
    """A TrainerCallback noting when each optimizer step begins and ends, and the tokens TRL has seen. On a GPU
    each mark waits for the queued kernels first, as our `.item()` of each step's loss does."""
    import torch
    from transformers import TrainerCallback

    def now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def differences(marks: list[float]) -> list[float]:
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            # on_step_begin to on_step_end: without fetching and collating the batch
            self.inside: list[float] = []
            self.tokens_seen: list[int] = []
            self.began = 0.0

        def on_epoch_begin(self, args, state, control, **kwargs):
            if not self.ends:  # the first step is timed from here: before its batch is fetched, as ours is
                self.ends.append(now())

        def on_step_begin(self, args, state, control, **kwargs):
            self.began = now()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(now())
            self.inside.append(self.ends[-1] - self.began)
            self.tokens_seen.append(state.num_input_tokens_seen)

        def cycles(self, size: int) -> tuple[list[float], list[float], list[int]]:
            """(seconds end to end, seconds inside the steps, tokens seen) per `size` consecutive steps."""
            inside = [sum(self.inside[i : i + size]) for i in range(0, len(self.inside), size)]
            return (
                differences(self.ends[::size]),
                inside,
                differences([0, *self.tokens_seen[size - 1 :: size]]),
            )

    return StepTimer()


def trl_common(
    args: argparse.Namespace, cfg, run_dir: Path, steps: int, per_device: int, accumulation: int = 1
) -> dict:
    return {
        "output_dir": str(run_dir),
        "max_steps": steps,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        "learning_rate": cfg.learning_rate,
        "adam_epsilon": cfg.adam_eps,
        "weight_decay": cfg.weight_decay,
        "lr_scheduler_type": cfg.lr_scheduler,
        "max_grad_norm": GRAD_CLIP,
        "optim": "adamw_torch",  # ours: torch.optim.AdamW, not fused (TRL's default is the fused one)
        "use_cpu": args.device == "cpu",
        "bf16": args.bf16,
        "gradient_checkpointing": False,
        "seed": cfg.seed,
        "report_to": "none",
        "logging_strategy": "no",
        "save_strategy": "no",
        "eval_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
    }


def trl_supervised(args: argparse.Namespace, trainer: str, cfg, run_dir: Path, timer):
    """TRL's trainer for sft/rm/dpo on the same rows as ours, and the settings worth printing."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    queries, chosen, rejected = supervised_rows(args, trainer, tokenizer)
    steps = args.warmup + args.steps
    if trainer == "sft":
        labels = [[-100] * len(q) + r for q, r in zip(queries, chosen, strict=True)]
        data = Dataset.from_dict({"input_ids": [q + r for q, r in zip(queries, chosen, strict=True)], "labels": labels})
        config = trl.SFTConfig(**trl_common(args, cfg, run_dir, steps, args.sft_rows), max_length=args.sft_length)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
        built = trl.SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
        )
        return built, {"loss_type": config.loss_type}
    if trainer == "rm":
        data = Dataset.from_dict(
            {
                "chosen_ids": [q + c for q, c in zip(queries, chosen, strict=True)],
                "rejected_ids": [q + r for q, r in zip(queries, rejected, strict=True)],
            }
        )
        config = trl.RewardConfig(**trl_common(args, cfg, run_dir, steps, args.pairs), max_length=args.pair_length)
        model = AutoModelForSequenceClassification.from_pretrained(cfg.model, num_labels=1, dtype=torch.float32)
        built = trl.RewardTrainer(
            model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
        )
        return built, {"model": "AutoModelForSequenceClassification"}
    text = tokenizer.batch_decode
    # without their EOS: DPOTrainer appends it to the text
    data = Dataset.from_dict(
        {
            "prompt": text(queries),
            "chosen": text([c[:-1] for c in chosen]),
            "rejected": text([r[:-1] for r in rejected]),
        }
    )
    config = trl.DPOConfig(
        **trl_common(args, cfg, run_dir, steps, args.pairs),
        max_length=args.pair_length,
        beta=cfg.beta,
        precompute_ref_log_probs=True,
        precompute_ref_batch_size=args.pairs,
    )
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    built = trl.DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer])
    check_dpo_lengths(built.train_dataset, args.pair_length)
    return built, {"beta": config.beta, "loss_type": config.loss_type, "precompute_ref_log_probs": True}


def check_dpo_lengths(dataset, length: int) -> None:
    """TRL re-tokenizes DPO text: make sure it got back rows of exactly our length."""
    for row in dataset:
        for side in ("chosen_ids", "rejected_ids"):
            if len(row["prompt_ids"]) + len(row[side]) != length:
                raise RuntimeError(
                    f"TRL tokenized a DPO {side[:-4]} row to "
                    f"{len(row['prompt_ids']) + len(row[side])} tokens, not {length}"
                )


def trl_on_policy(args: argparse.Namespace, trainer: str, cfg, run_dir: Path, timer):
    """GRPOTrainer or RLOOTrainer with our preset's sampling, KL, clipping, K and G, and a reward model of the
    same size as ours."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    prompts = on_policy_prompts(args, trainer, tokenizer)
    texts = tokenizer.batch_decode(prompts)
    if tokenizer(texts)["input_ids"] != prompts:
        raise RuntimeError("the prompts do not re-tokenize to the same ids; TRL would train on other lengths")
    steps = (args.warmup + args.steps) * cfg.update_epochs
    common = trl_common(args, cfg, run_dir, steps, args.micro_batch, args.episodes // args.micro_batch)
    settings = {
        "num_generations": cfg.samples_per_prompt,
        "max_completion_length": args.response_length,
        "generation_kwargs": {"min_new_tokens": args.response_length},
        "temperature": cfg.temperature,
        "beta": cfg.kl_coef,
        "epsilon": cfg.clip_range,
        "num_iterations": cfg.update_epochs,
        "disable_dropout": True,
        "shuffle_dataset": False,
    }
    config_class, trainer_class = (
        (trl.GRPOConfig, trl.GRPOTrainer) if trainer == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    )
    config = config_class(**common, **settings)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(cfg.model, num_labels=1, dtype=torch.float32)
    built = trainer_class(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": texts}),
        processing_class=tokenizer,
        reward_processing_classes=tokenizer,
        callbacks=[timer],
    )
    return built, settings | {"reward": "AutoModelForSequenceClassification (same backbone)"}


def run_trl(args: argparse.Namespace, trainer: str, run_dir: Path) -> dict:
    import trl

    cfg = our_config(args, trainer, run_dir)
    timer = step_timer()
    build = trl_on_policy if trainer in ON_POLICY else trl_supervised
    built, settings = build(args, trainer, cfg, run_dir, timer)
    built.train()
    times, inside, tokens = timer.cycles(cfg.update_epochs if trainer in ON_POLICY else 1)
    extra = {"inside_s_per_step": statistics.fmean(inside[args.warmup :])}
    if trainer in ON_POLICY:
        extra["response_length_mean"] = statistics.fmean(
            t / args.episodes - args.query_length for t in tokens[args.warmup :]
        )
    else:  # TRL counts no tokens for these trainers unless asked to; the rows are unpadded, so this is exact
        tokens = [supervised_tokens(args, trainer)] * len(times)
    return {
        "step_s": times,
        "tokens": tokens,
        "extra": extra,
        "trl_version": trl.__version__,
        "settings": settings,
    }


def run_worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.worker == "prepare":
        prepare_model(args)
        return
    run_dir = Path(args.out_dir) / "run"
    run_dir.mkdir()
    if args.worker == "trl":
        result = run_trl(args, args.trainer, run_dir)
    else:
        result = run_ours(args, args.trainer, run_dir, unshared=args.worker == "unshared")
    write_result(args, result)


def write_result(args: argparse.Namespace, result: dict) -> None:
    """A child's result, with the machine as it saw it and its peaks (RSS; on a GPU also CUDA's), where the
    parent reads it (`run_child`)."""
    import torch
    from benchmark_common import machine_fields

    device = torch.device(args.device)
    machine = machine_fields(device)
    result |= {"peak_rss_bytes": machine_fields(torch.device("cpu"))["peak_memory_bytes"], "machine": machine}
    if device.type == "cuda":
        result["peak_cuda_bytes"] = machine["peak_memory_bytes"]
    (Path(args.out_dir) / "result.json").write_text(json.dumps(result))


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
    else:
        run_comparison(args)


if __name__ == "__main__":
    main()
