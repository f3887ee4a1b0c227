"""Generation in fp32 beside generation under bf16 autocast, on the tiny model and SmolLM2-135M, as
one JSON line per model and precision mode.

    python benchmarks/generation_precision.py --frozen                     # tiny and smollm2-135m: ~2 min on 2 quiet
    CPU cores
    python benchmarks/generation_precision.py --models tiny --prompts 2 --batch 2 --new-tokens 4 --repeats 1   # smoke
    test

Modes, each run the way the trainers run generation (`rlhfkit.generation.generate` in eval mode inside
`devices.autocast(device, precision)`, as the on-policy rollouts do):

- `fp32`: `mixed_precision=no`.
- `bf16_recast`: bf16 autocast with the bf16 cache switched off, the preallocated KV cache held
  in fp32: autocast then casts every layer's whole cache to bf16 at every decoded token.
- `bf16`: bf16 autocast as it runs now, the cache held in bf16 (`decoding.eager.cache_dtype`).
- `bf16_frozen_recast`, `bf16_frozen` (`--frozen`): the same two with weights that do not require
  grad (LoRA's base weights, a reference). Autocast keeps its bf16 copy of a weight only for weights
  that require grad, so with the cast-once switched off too (`bf16_frozen_recast`) these are cast again at
  every forward; `generate` has autocast keep them (`decoding.eager.frozen_weights_cast_once`).

Queries are real TL;DR posts (the SFT sample in ../shared/data) cut to `--query-length` tokens and
left-padded, the longest first. Decoding is greedy and ignores EOS, so every mode decodes exactly
`--new-tokens` positions: the same work. The modes alternate `--repeats` times in one process after
one untimed warm-up each, and each mode's median is reported with its ratio to fp32's median
(`ratio_to_fp32` < 1: faster than fp32). Other processes on a shared machine only ever add time, and
can add several times a run's length to one run in three, so the fastest run of each mode and the
ratios of those (`min_*`) are reported too. Prefill (the first forward) and decode (the rest) are timed
apart. `same_tokens_as_fp32` compares greedy tokens with fp32's (bf16 rounding changes near-ties);
`identical_to` names a mode whose tokens and log-probabilities this one reproduces bit for bit.
`weight_casts` and `cache_casts` count, in one untimed call of 4 new tokens, the casts of the
model's weights and of a whole layer cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchmark_common import best_device, machine_fields
from generation import DEFAULT_DATA, load, tldr_queries
from torch.utils._python_dispatch import TorchDispatchMode

MODES = {  # name: (precision, bf16 cache and frozen-weight cast-once switched off, frozen weights)
    "fp32": ("no", False, False),
    "bf16_recast": ("bf16", True, False),
    "bf16": ("bf16", False, False),
    "bf16_frozen_recast": ("bf16", True, True),
    "bf16_frozen": ("bf16", False, True),
}
FROZEN = ("bf16_frozen_recast", "bf16_frozen")


def cpu_model() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "")


@contextlib.contextmanager
def mode_of(model: torch.nn.Module, name: str, device: torch.device):
    """The model and process as mode `name` runs generation: eval mode, autocast, frozen weights, and
    for the recast modes an fp32 cache and no cast cache for frozen weights."""
    from rlhfkit.decoding import eager
    from rlhfkit.devices import autocast, evaluation_mode

    precision, recast, frozen = MODES[name]
    current = eager.cache_dtype, eager.frozen_weights_cast_once
    trainable = [p for p in model.parameters() if p.requires_grad]
    if recast:
        eager.cache_dtype = lambda keys, values: torch.promote_types(keys.dtype, values.dtype)
        eager.frozen_weights_cast_once = lambda model, device: contextlib.nullcontext()
    if frozen:
        model.requires_grad_(False)
    try:
        with evaluation_mode(model), autocast(device, precision):
            yield
    finally:
        eager.cache_dtype, eager.frozen_weights_cast_once = current
        for p in trainable:
            p.requires_grad_(True)


class ForwardTimes:
    """Wall-clock start and end of every forward of `model`: the first is the prefill."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.marks: list[float] = []
        sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

        def mark(*_args):
            sync()
            self.marks.append(time.perf_counter())

        model.register_forward_pre_hook(mark)
        model.register_forward_hook(mark)


class Casts(TorchDispatchMode):
    """Counts casts of the model's weights and of tensors shaped like a whole layer cache (batch,
    heads, `length`, head dim)."""

    def __init__(self, model: torch.nn.Module, length: int):
        super().__init__()
        self.weights, self.length = {p.data_ptr() for p in model.parameters()}, length
        self.weight_casts = self.cache_casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.weight_casts += args[0].data_ptr() in self.weights
            self.cache_casts += args[0].dim() == 4 and args[0].size(2) == self.length
        return func(*args, **(kwargs or {}))


def generate_all(model, batches: list[dict], new_tokens: int, pad_id: int):
    from rlhfkit.generation import SamplingParams, generate

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    # eos_id -1 never comes: every row decodes `new_tokens` positions in every mode
    return [generate(model, b["input_ids"], b["attention_mask"], params, -1, pad_id) for b in batches]


def picked_logprobs(
    model, batches: list[dict], new_tokens: int, pad_id: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(responses, log-probabilities of the picked tokens under the logits they were picked from) of each
    batch, from an untimed pass: generation keeps no log-probabilities, so they are taken as the tokens
    are picked, to tell bit-identical modes apart."""
    from rlhfkit import generation
    from rlhfkit.ops import logprobs_from_logits

    pick_next, steps = generation.pick_next, []

    def recording(logits, params, generators, pad_id=None):
        token = pick_next(logits, params, generators, pad_id)
        steps.append(logprobs_from_logits(logits, token, params.temperature))
        return token

    outputs = []
    generation.pick_next = recording
    try:
        for batch in batches:
            steps.clear()
            responses = generate_all(model, [batch], new_tokens, pad_id)[0].responses
            outputs.append((responses, torch.stack(steps, dim=1)))
    finally:
        generation.pick_next = pick_next
    return outputs


def measure(model_name: str, args, device: torch.device, machine: dict) -> list[dict]:
    from rlhfkit.data.collate import left_pad_queries

    model, _, _, tokenizer = load(model_name, device, torch.float32)
    queries = tldr_queries(tokenizer, args.data, args.prompts, args.query_length)
    batches = [
        {k: v.to(device) for k, v in left_pad_queries(queries[i : i + args.batch], tokenizer.pad_token_id).items()}
        for i in range(0, len(queries), args.batch)
    ]
    modes = [m for m in MODES if args.frozen or m not in FROZEN]
    forwards = ForwardTimes(model, device)
    runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}  # (total, prefill, decode) seconds
    outputs = {}
    for name in modes:  # warm-up: oneDNN primitives, autocast's weight casts, allocator
        with mode_of(model, name, device):
            generate_all(model, batches, min(4, args.new_tokens), tokenizer.pad_token_id)
    for _ in range(args.repeats):
        for name in modes:
            with mode_of(model, name, device):
                forwards.marks.clear()
                began = time.perf_counter()
                generate_all(model, batches, args.new_tokens, tokenizer.pad_token_id)
                total = time.perf_counter() - began
            marks, per_batch = forwards.marks, 2 * args.new_tokens  # a start and an end mark per forward
            prefill = sum(marks[i * per_batch + 1] - marks[i * per_batch] for i in range(len(batches)))
            runs[name].append((total, prefill, total - prefill))
    for name in modes:
        with mode_of(model, name, device):
            outputs[name] = picked_logprobs(model, batches, args.new_tokens, tokenizer.pad_token_id)
    casts = {}
    for name in modes:
        first = batches[0]
        with mode_of(model, name, device), Casts(model, first["input_ids"].size(1) + 4) as counter:
            generate_all(model, [first], 4, tokenizer.pad_token_id)
        casts[name] = {"weight_casts": counter.weight_casts, "cache_casts": counter.cache_casts}

    def median(name: str, part: int) -> float:
        return statistics.median(run[part] for run in runs[name])

    def least(name: str, part: int) -> float:
        """Part `part` of the fastest run."""
        return min(runs[name])[part]

    def same(a: str, b: str, logprobs: bool) -> bool:
        pairs = zip(outputs[a], outputs[b], strict=True)
        return all(torch.equal(x[0], y[0]) and (not logprobs or torch.equal(x[1], y[1])) for x, y in pairs)

    rows = []
    decoded = len(queries) * (args.new_tokens - 1)  # positions after the one the prefill predicts
    for name in modes:
        identical = next((other for other in modes[: modes.index(name)] if same(name, other, logprobs=True)), None)
        rows.append(
            {
                "benchmark": "generation_precision",
                "model": model_name,
                "mode": name,
                "precision": MODES[name][0],
                "prompts": len(queries),
                "batch": args.batch,
                "query_tokens_max": batches[0]["input_ids"].size(1),
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "s": round(median(name, 0), 4),
                "prefill_s": round(median(name, 1), 4),
                "decode_s": round(median(name, 2), 4),
                "s_runs": [round(run[0], 3) for run in runs[name]],
                "tokens_per_s": round(len(queries) * args.new_tokens / median(name, 0), 1),
                "decode_tokens_per_s": round(decoded / median(name, 2), 1),
                "ratio_to_fp32": round(median(name, 0) / median("fp32", 0), 3),
                "prefill_ratio_to_fp32": round(median(name, 1) / median("fp32", 1), 3),
                "decode_ratio_to_fp32": round(median(name, 2) / median("fp32", 2), 3),
                "min_s": round(least(name, 0), 4),
                "min_prefill_s": round(least(name, 1), 4),
                "min_decode_s": round(least(name, 2), 4),
                "min_ratio_to_fp32": round(least(name, 0) / least("fp32", 0), 3),
                "min_decode_ratio_to_fp32": round(least(name, 2) / least("fp32", 2), 3),
                "same_tokens_as_fp32": same(name, "fp32", logprobs=False),
                "identical_to": identical,
            }
            | casts[name]
            | machine
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", default="tiny,smollm2-135m", help="comma separated: embedded name, HF directory, hub id, or 'tiny'"
    )
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="TL;DR SFT jsonl(.gz) whose posts are the queries"
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="rows per generate call (DPO's forward_batch_size is 8)")
    parser.add_argument("--query-length", type=int, default=256, help="query tokens at most")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed runs per mode")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--frozen", action="store_true", help="also time bf16 autocast with weights that do not require grad"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from rlhfkit.trainers.run import native_bf16

    device = best_device()
    machine = {"cpu_model": cpu_model(), "auto_precision": "bf16" if native_bf16() else "no"}
    with torch.no_grad():
        for name in args.models.split(","):
            for row in measure(name, args, device, machine):
                print(json.dumps(row | machine_fields(device)))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
