"""Our rollout generation (`rlhfkit.generation.generate`, each way its steps can run) beside `transformers`
`generate` (eager, with its static cache, and with its static cache compiled) on the same model, queries
and sampling settings, printed as one JSON line per batch size.

    python benchmarks/generation.py --model shape:smollm2-135m --batches 16,64,256 --bf16          # on a GPU
    python benchmarks/generation.py --model smollm2-135m --batches 1,8,32                           # on a CPU
    python benchmarks/generation.py --model tiny --batches 2 --repeats 1 --new-tokens 8             # smoke test
    python benchmarks/generation.py --model smollm2-135m --batches 8 --group 4 --query-length 400 --profile
                                                                        # GRPO's shape, with each side's profile

Sides (`--sides`; on a GPU all but ours-buckets by default, on a CPU ours-eager, ours-buckets, hf-eager):
    ours-eager    `generate` with decoding=eager: one forward call per token over the whole batch
    ours-graphs   decoding=cuda-graphs: each batch-size bucket's step replayed as a CUDA graph, finished
                  rows dropped (rlhfkit/decoding/buckets.py); `ours-graphs_decoding` says what ran
    ours-buckets  decoding=buckets: the same buffers and row dropping, steps run eagerly
    hf-eager      `model.generate` with its default (growing) cache
    hf-static     `model.generate(cache_implementation="static", disable_compile=True)`
    hf-compiled   `model.generate(cache_implementation="static")`, which compiles the forward on a GPU

Models: an embedded name, HF directory or hub id (queries: real TL;DR posts in the SFT query format,
cut to `--query-length` tokens, Detail 2), 'tiny', or `shape:NAME` for random weights built from the
published config shipped in rlhfkit/model_configs (smollm2-135m, pythia-1b-deduped, llama-3.2-1b, ...),
whose queries are random tokens with TL;DR's query lengths (`TLDR_QUERY_LENGTHS`). Random weights seldom
emit EOS, so every row decodes `--new-tokens` positions. Every batch holds the longest queries first.
With `--group G` a batch of B rows is B / G queries, each sampled G times as GRPO and RLOO sample: ours
encodes each query once and repeats its KV cache G times (`samples_per_prompt`); `generate` is given
each query G times, as TRL gives it, and encodes every copy.

Measured per side, medians of `--repeats` rounds timed alternately after one untimed round (which also
compiles and captures): seconds for the whole call, seconds for the prompt alone (max_new_tokens=1),
ms per decoding step = (whole - prompt) / (decoded positions - 1), tokens/s = rows x decoded positions
/ whole seconds, and the peak memory (CUDA: `max_memory_allocated` during the side's own calls, the
buffers a side keeps between calls included; CPU: the process's peak RSS). Greedy (`--temperature 0`,
the default) outputs are compared token for token with the first side's (`<side>_identical`).

Each row also states a decoding step's memory limit: the time to read, once, what a step must read,
at the machine's bandwidth, measured after the row's timed runs by memory_bandwidth.py in a child process
(its tensors would otherwise raise the process's peak RSS) with the benchmark's thread count:
    memory_copy_gb_per_s, memory_read_gb_per_s   a 256 MB fp32 copy (read + written) and sum (read)
    memory_gb_per_s             the faster of the two: the limit's bandwidth
    step_weight_bytes           every weight in the dtype it runs in, a tied embedding once (as the LM
                                head), an untied input embedding not at all (a step reads only its rows)
    step_kv_cache_bytes         layers x 2 x kv heads x head dim x bytes x rows x the mean position a step
                                attends to: the padded query width + half the first side's decoded positions
    step_bytes, step_limit_ms   their sum, and that sum over memory_gb_per_s
    <side>_ms_per_step_over_limit   the side's ms per step over step_limit_ms (1 would be the limit)
The limit is a floor, not a target every step can reach: at a few rows a step's matmuls also need
about 2 x rows FLOPs per weight, which the CPU's matmul peak bounds too (docs/performance.md).
With `--profile` each side's generation is run once more under `torch.profiler`, and the top operators
by self CPU time per decoding step ((whole call - prompt call) / (decoded positions - 1), as ms per
step is) are printed as `<side>_step_top_ops`: [operator, self ms per step, calls per step], with their
total as `<side>_step_profiled_ms`. A difference of two profiles: noisy where the prompt's time dominates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from benchmark_common import (
    best_device,
    decode_weight_bytes,
    kv_cache_bytes_per_position,
    machine_fields,
    shape_special_ids,
    shaped_model,
)

DEFAULT_DATA = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tldr-sft-sample" / "tldr_sft_sample.jsonl.gz"
)
# TL;DR query lengths in SmolLM2 tokens (the SFT query format, cut at 512): the 16 quantiles at
# (i + 0.5) / 16 of the 1,944 posts in ../shared/data/tldr-sft-sample
TLDR_QUERY_LENGTHS = (188, 217, 242, 263, 284, 301, 321, 344, 363, 386, 405, 424, 441, 459, 477, 500)
OURS = {"ours-eager": "eager", "ours-graphs": "cuda-graphs", "ours-buckets": "buckets"}
THEIRS = {
    "hf-eager": {},
    "hf-static": {"cache_implementation": "static", "disable_compile": True},
    "hf-compiled": {"cache_implementation": "static"},
}
decoded_by: dict[str, str] = {}  # side -> how our steps last ran (Rollout.decoding)
GPU_SIDES = "ours-eager,ours-graphs,hf-eager,hf-static,hf-compiled"
CPU_SIDES = "ours-eager,ours-buckets,hf-eager"


def load(model_name: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, int, int, object]:
    """(model, eos id, pad id, tokenizer or None for random-weight shapes)."""
    from rlhfkit.models import load_policy
    from rlhfkit.tiny_models import tiny_policy

    if model_name.startswith("shape:"):
        model = shaped_model(model_name.removeprefix("shape:"))
        eos, pad = shape_special_ids(model)
        return model.to(device, dtype=dtype).eval(), eos, pad, None
    model, tokenizer = tiny_policy() if model_name == "tiny" else load_policy(model_name)
    return model.to(device, dtype=dtype).eval(), tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer


def tldr_queries(tokenizer, data: Path, count: int, query_length: int) -> list[list[int]]:
    """The `count` longest of the first 4 x count posts, tokenised as `rlhfkit sft` does."""
    from rlhfkit.data import load_sft
    from rlhfkit.data.examples import tokenize_sft

    records, _ = load_sft([str(data)])
    examples, _ = tokenize_sft(records[: 4 * count], tokenizer, query_length, 10**9)
    return sorted((e.query.ids for e in examples), key=len, reverse=True)[:count]


def random_queries(count: int, vocab: int, query_length: int, pad: int, eos: int) -> list[list[int]]:
    """`count` queries of random tokens (never PAD or EOS) whose lengths spread over TL;DR's, longest first."""
    generator = torch.Generator().manual_seed(0)
    spread = len(TLDR_QUERY_LENGTHS)
    lengths = sorted((min(TLDR_QUERY_LENGTHS[i * spread // count], query_length) for i in range(count)), reverse=True)
    queries = []
    for length in lengths:
        ids = torch.randint(100, vocab - 1, (length,), generator=generator)
        queries.append(torch.where((ids == pad) | (ids == eos), 100, ids).tolist())
    return queries


def timed(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began, result


def side_call(side: str, model, batch: dict, new_tokens: int, args, eos: int, pad: int) -> Callable[[], torch.Tensor]:
    """The side's generation of `new_tokens` tokens for `batch`, each query `args.group` times, returning
    the response tokens; ours also notes which way its steps ran (`decoded_by`)."""
    from rlhfkit.generation import SamplingParams, generate

    if side in OURS:

        def ours() -> torch.Tensor:
            params = SamplingParams(max_new_tokens=new_tokens, temperature=args.temperature, decoding=OURS[side])
            rollout = generate(
                model, batch["input_ids"], batch["attention_mask"], params, eos, pad, samples_per_prompt=args.group
            )
            decoded_by[side] = rollout.decoding
            return rollout.responses

        return ours
    sampling = (
        {"do_sample": False}
        if args.temperature <= 0
        else {"do_sample": True, "temperature": args.temperature, "top_k": 0, "top_p": 1.0}
    )

    repeated = {k: v.repeat_interleave(args.group, dim=0) for k, v in batch.items()}

    def theirs() -> torch.Tensor:
        out = model.generate(
            input_ids=repeated["input_ids"],
            attention_mask=repeated["attention_mask"],
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling,
            **THEIRS[side],
        )
        return out[:, batch["input_ids"].size(1) :]

    return theirs


def same_responses(a: torch.Tensor, b: torch.Tensor, eos_id: int) -> bool:
    """Token-for-token equal up to and including each row's first EOS (what follows is padding)."""
    from rlhfkit.ops import truncate_after_eos

    width = max(a.size(1), b.size(1))
    a, b = (torch.nn.functional.pad(t, (0, width - t.size(1)), value=-1) for t in (a, b))
    return bool(torch.equal(truncate_after_eos(a, eos_id, -1), truncate_after_eos(b, eos_id, -1)))


def measured_bandwidth() -> dict[str, float]:
    """memory_bandwidth.py's copy and read GB/s, run in a child process at this process's thread count."""
    script = Path(__file__).with_name("memory_bandwidth.py")
    done = subprocess.run(
        [sys.executable, str(script), "--threads", str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        check=True,
    )
    probe = json.loads(done.stdout.splitlines()[-1])
    return {"copy": probe["copy_gb_per_s"], "read": probe["read_gb_per_s"]}


def memory_limit(model, rows: int, width: int, positions: int) -> dict:
    """A decoding step's bytes read and the time reading them takes at the bandwidth measured now: rows of
    `width` query positions decoding `positions` tokens, whose steps attend on average to width +
    positions / 2 positions (step s, from 0 to positions - 2, to width + s + 1)."""
    bandwidth = measured_bandwidth()
    best = max(bandwidth.values())
    weights = decode_weight_bytes(model)
    per_position = kv_cache_bytes_per_position(model.config, next(model.parameters()).dtype)
    kv = round(per_position * rows * (width + positions / 2))
    return {
        "memory_copy_gb_per_s": bandwidth["copy"],
        "memory_read_gb_per_s": bandwidth["read"],
        "memory_gb_per_s": best,
        "step_weight_bytes": weights,
        "step_kv_cache_bytes": kv,
        "step_bytes": weights + kv,
        "step_limit_ms": round(1000 * (weights + kv) / (best * 1e9), 3),
    }


def step_profile(whole: Callable[[], torch.Tensor], prompt: Callable[[], torch.Tensor], positions: int) -> dict:
    """Self CPU time per decoding step by operator: a profiled whole call less a profiled prompt call,
    over the decoded positions - 1, as ms per step is timed. The total, and the top 8 operators as
    [operator, self ms per step, calls per step]."""
    from torch.profiler import ProfilerActivity, profile

    per_op: dict[str, list[float]] = {}
    for sign, call in ((1, whole), (-1, prompt)):
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            call()
        for event in profiled.key_averages():
            totals = per_op.setdefault(event.key, [0.0, 0])
            totals[0] += sign * event.self_cpu_time_total / 1000
            totals[1] += sign * event.count
    steps = max(1, positions - 1)
    ranked = sorted(per_op.items(), key=lambda item: -item[1][0])
    return {
        "step_profiled_ms": round(sum(ms for ms, _ in per_op.values()) / steps, 3),
        "step_top_ops": [[name, round(ms / steps, 3), round(calls / steps, 1)] for name, (ms, calls) in ranked[:8]],
    }


def compare(model, queries: list[list[int]], sides: list[str], args, device, eos: int, pad: int) -> dict:
    from rlhfkit.data.collate import left_pad_queries

    batch = {k: v.to(device) for k, v in left_pad_queries(queries, pad).items()}
    whole = {side: side_call(side, model, batch, args.new_tokens, args, eos, pad) for side in sides}
    prompt = {side: side_call(side, model, batch, 1, args, eos, pad) for side in sides}
    seconds = {side: {"whole": [], "prompt": []} for side in sides}
    outputs, peaks = {}, {}
    for repeat in range(args.repeats + 1):  # round 0 is untimed: compiling, capturing, allocator warm-up
        for side in sides:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            whole_s, outputs[side] = timed(whole[side], device)
            prompt_s, _ = timed(prompt[side], device)
            peaks[side] = machine_fields(device)["peak_memory_bytes"]
            if repeat:
                seconds[side]["whole"].append(whole_s)
                seconds[side]["prompt"].append(prompt_s)
    rows, width = len(queries) * args.group, batch["input_ids"].size(1)
    row = {
        "benchmark": "generation",
        "model": args.model,
        "batch": rows,
        "group": args.group,
        "query_tokens_max": width,
        "query_tokens_mean": round(sum(map(len, queries)) / len(queries), 1),
        "max_new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
        "sides": sides,
    } | memory_limit(model, rows, width, outputs[sides[0]].size(1))
    for side in sides:
        whole_s, prompt_s = (statistics.median(seconds[side][k]) for k in ("whole", "prompt"))
        positions = outputs[side].size(1)
        row |= {
            f"{side}_s": round(whole_s, 4),
            f"{side}_s_runs": [round(t, 3) for t in seconds[side]["whole"]],
            f"{side}_prompt_s": round(prompt_s, 4),
            f"{side}_decoded_positions": positions,
            f"{side}_ms_per_step": round(1000 * (whole_s - prompt_s) / max(1, positions - 1), 3),
            f"{side}_tokens_per_s": round(rows * positions / whole_s, 1),
            f"{side}_peak_memory_bytes": peaks[side],
        }
        row[f"{side}_ms_per_step_over_limit"] = round(row[f"{side}_ms_per_step"] / row["step_limit_ms"], 2)
        if args.profile:
            row |= {f"{side}_{k}": v for k, v in step_profile(whole[side], prompt[side], positions).items()}
        if side in OURS:
            row[f"{side}_decoding"] = decoded_by[side]
        if args.temperature <= 0:
            row[f"{side}_identical"] = same_responses(outputs[side], outputs[sides[0]], eos)
    if "hf-eager" in sides:
        for side in sides:
            row[f"{side}_speedup_vs_hf-eager"] = round(row[f"{side}_tokens_per_s"] / row["hf-eager_tokens_per_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="smollm2-135m", help="embedded name, HF directory, hub id, 'tiny', or shape:NAME"
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="TL;DR SFT jsonl(.gz) whose posts are the queries"
    )
    parser.add_argument("--batches", default="1,8,32", help="batch sizes in rows, comma separated")
    parser.add_argument("--group", type=int, default=1, help="samples per query (GRPO's G): batch / G queries")
    parser.add_argument(
        "--sides", default="", help=f"comma separated (default: {GPU_SIDES} on a GPU, {CPU_SIDES} on a CPU)"
    )
    parser.add_argument("--query-length", type=int, default=512, help="query tokens at most (Detail 2)")
    parser.add_argument("--new-tokens", type=int, default=53, help="response tokens at most (Detail 4)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, outputs compared")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed rounds per side")
    parser.add_argument("--bf16", action="store_true", help="load the weights in bf16 (every side)")
    parser.add_argument("--profile", action="store_true", help="each side's top operators per decoding step")
    args = parser.parse_args()

    device = best_device()
    sides = (args.sides or (GPU_SIDES if device.type == "cuda" else CPU_SIDES)).split(",")
    unknown = [s for s in sides if s not in OURS | THEIRS]
    if unknown:
        parser.error(f"unknown sides {unknown}; choose from {sorted(OURS | THEIRS)}")
    sizes = [int(b) for b in args.batches.split(",")]
    if any(size % args.group for size in sizes):
        parser.error(f"--batches {args.batches}: each must be a multiple of --group {args.group}")
    model, eos, pad, tokenizer = load(args.model, device, torch.bfloat16 if args.bf16 else torch.float32)
    with torch.inference_mode():
        for size in sizes:
            prompts = size // args.group
            if tokenizer is not None and args.data.is_file():
                queries = tldr_queries(tokenizer, args.data, prompts, args.query_length)
            else:
                queries = random_queries(prompts, model.config.vocab_size, args.query_length, pad, eos)
            print(
                json.dumps(
                    compare(model, queries, sides, args, device, eos, pad)
                    | {"bf16": args.bf16}
                    | machine_fields(device)
                )
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
