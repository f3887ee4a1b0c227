"""PPO, GRPO or RLOO seconds per update split into phases, generation tokens/s and peak memory, as one JSON line.

    python benchmarks/onpolicy_throughput.py --algorithm ppo --model smollm2-135m --batch 8 --query-length 400
    --updates 2
    python benchmarks/onpolicy_throughput.py --algorithm grpo --model tiny --batch 16
    python benchmarks/onpolicy_throughput.py --algorithm grpo --model shape:llama-3.2-1b --batch 512 --micro-batch 32
    --bf16  # a GPU

Runs the real on-policy loop of `rlhfkit ppo|grpo|rloo` with the algorithm's preset (generation, the
scoring forward passes, K update epochs of the policy and, for PPO, the value model) on random-token
queries of `--query-length` tokens: the policy and reference are `--model`, the reward (and value)
model its backbone with a fresh scalar head. GRPO and RLOO draw batch / 4 queries, 4 samples each,
each query encoded once. `shape:NAME` builds every model with random weights from a published config
shipped in rlhfkit/model_configs (the seeds' sizes: smollm2-135m, pythia-1b-deduped, llama-3.2-1b).
Random queries rarely end in EOS, so every response runs to `--response-length` tokens: the worst
case of Detail 23's fixed budget. `--warmup` updates are discarded, the median of the rest is shown.
On CUDA the peak is `max_memory_allocated`, also per phase (sampling and scoring; the K epochs of
updates); on CPU it is the process's peak RSS. `--decoding` is the stages' option (rlhfkit/decoding/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch
from benchmark_common import best_device, machine_fields, shape_special_ids, shaped_model

PRESETS = {"ppo": "tldr-ppo", "grpo": "tldr-grpo", "rloo": "tldr-rloo"}


@dataclass
class ShapeTokenizer:
    """What the on-policy loop reads of a tokenizer, for random-weight shapes that come without one."""

    eos_token_id: int
    pad_token_id: int
    vocab_size: int

    def __len__(self) -> int:
        return self.vocab_size

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def shape_policy(name: str):
    model = shaped_model(name)
    eos, pad = shape_special_ids(model)
    model.generation_config.pad_token_id = pad
    return model, ShapeTokenizer(eos, pad, model.config.vocab_size)


def build(model_name: str, device: torch.device, with_value: bool):
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.scoring import OnPolicyModels
    from rlhfkit.reward_models import ScalarModel
    from rlhfkit.tiny_models import tiny_policy

    def policy():
        if model_name.startswith("shape:"):
            return shape_policy(model_name.removeprefix("shape:"))
        return tiny_policy() if model_name == "tiny" else load_policy(model_name)

    trained, tokenizer = policy()
    reference, _ = policy()
    torch.manual_seed(0)
    reward = ScalarModel.from_policy(policy()[0])
    value = None
    if with_value:
        value = ScalarModel.from_policy(policy()[0])
        value.load_state_dict(reward.state_dict())
        value = value.to(device)
    return OnPolicyModels(trained.to(device), reference.to(device), reward.to(device), value, tokenizer)


def phase_peak(device: torch.device) -> float:
    """The CUDA peak since the last call (then reset), or the process's peak RSS so far on a CPU."""
    peak = machine_fields(device)["peak_memory_bytes"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return float(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=sorted(PRESETS), default="ppo")
    parser.add_argument("--model", default="smollm2-135m", help="embedded name, HF directory, hub id, or 'tiny'")
    parser.add_argument("--batch", type=int, default=8, help="episodes per update (total_batch_size)")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per forward/backward in the update")
    parser.add_argument("--query-length", type=int, default=400, help="query tokens (TL;DR posts: ~300-512)")
    parser.add_argument("--response-length", type=int, default=53)
    parser.add_argument("--update-epochs", type=int, default=4, help="Table 7: K = 4")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--generation-batch", type=int, default=0, help="rows per generation call (0: the whole batch)")
    parser.add_argument("--decoding", default="auto", help="auto, eager, cuda-graphs or buckets (rlhfkit/decoding/)")
    parser.add_argument(
        "--shared-prefix", default="auto", choices=["auto", "off"], help="grouped methods: read each prompt once"
    )
    parser.add_argument("--no-reuse", action="store_true", help="K = 1: a scoring pass for the old log-probs")
    args = parser.parse_args()

    from rlhfkit.onpolicy import trainer, update
    from rlhfkit.onpolicy.advantages import compute_advantages
    from rlhfkit.onpolicy.collect import RolloutSetup, collect
    from rlhfkit.stages import resolve

    device = best_device()
    models = build(args.model, device, with_value=args.algorithm == "ppo")
    cfg = resolve(
        args.algorithm,
        PRESETS[args.algorithm],
        None,
        {
            "total_batch_size": args.batch,
            "micro_batch_size": args.micro_batch,
            "generation_batch_size": args.generation_batch or args.batch,
            "forward_batch_size": args.micro_batch,
            "max_response_length": args.response_length,
            "update_epochs": args.update_epochs,
            "reward_model": "unused",
            "decoding": args.decoding,
            "shared_prefix": args.shared_prefix,
            "reuse_update_forward": not args.no_reuse,
        },
    )
    trainer.prepare_for_training(models, cfg)
    optimizers = trainer.build_optimizers(models, cfg, args.warmup + args.updates)
    generator = torch.Generator().manual_seed(0)
    queries = args.batch // cfg.samples_per_prompt
    prompts = torch.randint(100, len(models.tokenizer) - 1, (queries, args.query_length), generator=generator).tolist()
    precision = "bf16" if args.bf16 else "no"
    plan = trainer.update_plan(models, cfg, precision)
    setup = RolloutSetup(models, prompts, cfg.rollout_options, plan.scoring, precision)
    rows = []
    for index in range(args.warmup + args.updates):
        timings: dict[str, float] = {}
        began = time.perf_counter()
        phase_peak(device)
        collected = collect(setup, index, timings)
        batch = compute_advantages(collected, cfg.advantage_options, cfg.kl_coef, plan.old_logprobs)
        timings["collect_peak_bytes"] = phase_peak(device)
        tick = time.perf_counter()
        metrics = update.update_on_rollout(
            models=models, optimizers=optimizers, batch=batch, plan=plan, update=index + 1, kl_coef=cfg.kl_coef
        ).metrics
        if device.type == "cuda":
            torch.cuda.synchronize()
        timings["update_peak_bytes"] = phase_peak(device)
        timings["update"] = time.perf_counter() - tick
        timings["total"] = time.perf_counter() - began
        timings["generated_tokens"] = float(batch.lengths.sum())
        if index >= args.warmup:
            rows.append(timings)

    def median(key: str) -> float:
        values = sorted(r[key] for r in rows)
        return values[len(values) // 2]

    print(
        json.dumps(
            {
                "benchmark": f"{args.algorithm}_update",
                "samples_per_prompt": cfg.samples_per_prompt,
                "model": args.model,
                "batch": args.batch,
                "micro_batch": args.micro_batch,
                "generation_batch": args.generation_batch or args.batch,
                "query_length": args.query_length,
                "response_length": args.response_length,
                "update_epochs": args.update_epochs,
                "generation_s": round(median("generation"), 3),
                "scoring_s": round(median("scoring"), 3),
                "update_s": round(median("update"), 3),
                "update_total_s": round(median("total"), 3),
                "generation_share": round(median("generation") / median("total"), 3),
                "generation_tokens_per_s": round(median("generated_tokens") / median("generation"), 1),
                "decoding": args.decoding,
                "shared_prefix": args.shared_prefix,
                "shared_rows_used": bool(metrics["perf/shared_prefix"]),
                "old_logprobs_from_update": plan.old_logprobs == "update",
                "collect_peak_memory_bytes": int(max(r["collect_peak_bytes"] for r in rows)),
                "update_peak_memory_bytes": int(max(r["update_peak_bytes"] for r in rows)),
                "episodes_per_s": round(args.batch / median("total"), 3),
                "bf16": args.bf16,
            }
            | machine_fields(device)
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
