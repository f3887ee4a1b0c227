"""Our rollout generation (`rlhfkit.generation.generate`) against `transformers` `generate` on the same
model, queries and sampling settings, printed as one JSON line per batch size.

    python benchmarks/generation.py --model smollm2-135m --batches 1,8,32
    python benchmarks/generation.py --model tiny --batches 2 --repeats 1 --new-tokens 8   # smoke test

Queries are real TL;DR posts (`--data`, the SFT sample in ../shared/data) in the SFT query format,
cut to `--query-length` tokens (Detail 2) and left-padded; every batch holds the longest posts first,
as `generate_texts` orders them. Both sides decode greedily (`--temperature 0`, the default) so their
outputs can be compared token for token (`identical`), and both stop when every row has emitted EOS,
so they do the same work. The two are timed alternately `--repeats` times in one process; each
side's median is reported, with tokens/s = rows x decoded positions / seconds (prefill included).
On CUDA the peak is `max_memory_allocated` of each side's own calls; on CPU the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from benchmark_common import best_device, machine_fields

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tldr-sft-sample" / "tldr_sft_sample.jsonl.gz"


def load(model_name: str):
    from rlhfkit.models import load_policy, tiny_policy

    return tiny_policy() if model_name == "tiny" else load_policy(model_name)


def tldr_queries(tokenizer, data: Path, count: int, query_length: int) -> list[list[int]]:
    """The `count` longest of the first 4 x count posts, tokenised as `rlhfkit sft` does."""
    from rlhfkit.data import load_sft
    from rlhfkit.data.examples import tokenize_sft

    records, _ = load_sft([str(data)])
    examples, _ = tokenize_sft(records[: 4 * count], tokenizer, query_length, 10**9)
    return sorted((e.query.ids for e in examples), key=len, reverse=True)[:count]


def timed(fn, device: torch.device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began, result


def ours(model, tokenizer, batch: dict, new_tokens: int, temperature: float) -> torch.Tensor:
    from rlhfkit.generation import SamplingParams, generate

    params = SamplingParams(max_new_tokens=new_tokens, temperature=temperature)
    rollout = generate(model, batch["input_ids"], batch["attention_mask"], params, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return rollout.responses


def theirs(model, tokenizer, batch: dict, new_tokens: int, temperature: float) -> torch.Tensor:
    sampling = {"do_sample": False} if temperature <= 0 else {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=new_tokens,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **sampling)
    return out[:, batch["input_ids"].size(1):]


def same_responses(a: torch.Tensor, b: torch.Tensor, eos_id: int) -> bool:
    """Token-for-token equal up to and including each row's first EOS (what follows is padding)."""
    from rlhfkit.ops import truncate_after_eos

    width = max(a.size(1), b.size(1))
    a, b = (torch.nn.functional.pad(t, (0, width - t.size(1)), value=-1) for t in (a, b))
    return bool(torch.equal(truncate_after_eos(a, eos_id, -1), truncate_after_eos(b, eos_id, -1)))


def compare(model, tokenizer, queries: list[list[int]], args, device) -> dict:
    from rlhfkit.data.collate import left_pad_queries

    batch = {k: v.to(device) for k, v in left_pad_queries(queries, tokenizer.pad_token_id).items()}
    sides = {"ours": ours, "transformers": theirs}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, torch.Tensor] = {}
    peaks: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            elapsed, outputs[name] = timed(lambda fn=fn: fn(model, tokenizer, batch, args.new_tokens, args.temperature), device)
            seconds[name].append(elapsed)
            peaks[name] = machine_fields(device)["peak_memory_bytes"]
    row = {"benchmark": "generation", "model": args.model, "batch": len(queries), "query_tokens_max": batch["input_ids"].size(1),
           "max_new_tokens": args.new_tokens, "temperature": args.temperature, "repeats": args.repeats}
    for name in sides:
        median = statistics.median(seconds[name])
        positions = outputs[name].size(1)
        row |= {f"{name}_s": round(median, 4), f"{name}_s_runs": [round(t, 3) for t in seconds[name]], f"{name}_decoded_positions": positions,
                f"{name}_tokens_per_s": round(len(queries) * positions / median, 1), f"{name}_peak_memory_bytes": peaks[name]}
    row["speedup"] = round(row["ours_tokens_per_s"] / row["transformers_tokens_per_s"], 3)
    if args.temperature <= 0:
        row["identical"] = same_responses(outputs["ours"], outputs["transformers"], tokenizer.eos_token_id)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="embedded name, HF directory, hub id, or 'tiny'")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="TL;DR SFT jsonl(.gz) whose posts are the queries")
    parser.add_argument("--batches", default="1,8,32", help="batch sizes, comma separated")
    parser.add_argument("--query-length", type=int, default=512, help="query tokens at most (Detail 2)")
    parser.add_argument("--new-tokens", type=int, default=53, help="response tokens at most (Detail 4)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, outputs compared")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed calls per side")
    parser.add_argument("--bf16", action="store_true", help="load the weights in bf16 (both sides)")
    args = parser.parse_args()

    device = best_device()
    model, tokenizer = load(args.model)
    model.to(device, dtype=torch.bfloat16 if args.bf16 else torch.float32).eval()
    sizes = [int(b) for b in args.batches.split(",")]
    queries = tldr_queries(tokenizer, args.data, max(sizes), args.query_length)
    with torch.inference_mode():
        compare(model, tokenizer, queries[:1], argparse.Namespace(**vars(args) | {"repeats": 1}), device)  # warm-up
        for size in sizes:
            print(json.dumps(compare(model, tokenizer, queries[:size], args, device) | {"bf16": args.bf16} | machine_fields(device)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
