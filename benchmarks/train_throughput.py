"""Steady-state training throughput and peak memory of one stage, printed as one JSON line.

    python benchmarks/train_throughput.py --stage sft --model smollm2-135m --batch 4 --seq 562
    python benchmarks/train_throughput.py --stage rm  --model tiny --batch 2 --seq 638
    python benchmarks/train_throughput.py --stage dpo --model smollm2-135m --batch 2 --seq 638

DPO rows are query + a 53-token response, chosen then rejected (2 x batch rows), with the reference
log-probabilities given (the trainer caches them before training), so a step is one policy pass.

Runs the stage's real loss function and an AdamW step on random token rows of the given shape
(rows are right-padded to `--seq`, as Detail 5 batches are), discards `--warmup` steps, times
`--steps`. MFU is the model FLOPs per second (benchmark_common.training_flops_per_token) over
the matmul peak measured in the same process for the precision it ran in (matmul_peak.py). On CUDA the peak is
`max_memory_allocated`; on CPU it is the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from benchmark_common import best_device, machine_fields, matmul_peak_gflops
from flops import mfu, training_flops_per_token

from rlhfkit.data.examples import PairExample
from rlhfkit.data.formats import QueryTokens


def build(stage: str, model_name: str):
    from rlhfkit.models import load_policy
    from rlhfkit.tiny_models import tiny_policy

    policy, tokenizer = tiny_policy() if model_name == "tiny" else load_policy(model_name)
    if stage == "sft":
        from rlhfkit.trainers.sft import sft_loss

        return policy, tokenizer, sft_loss
    if stage == "dpo":
        from rlhfkit.trainers.dpo import make_dpo_loss

        return policy, tokenizer, make_dpo_loss(0.05)
    from rlhfkit.reward_models import ScalarModel
    from rlhfkit.trainers.reward import make_pair_loss

    return ScalarModel.from_policy(policy), tokenizer, make_pair_loss()


def random_batch(stage: str, tokenizer, batch: int, seq: int, device) -> dict[str, torch.Tensor]:
    if stage == "rm":
        return {k: v.to(device) for k, v in random_packed_pairs(tokenizer, batch, seq).items()}
    rows = 2 * batch if stage == "dpo" else batch
    ids = torch.randint(100, len(tokenizer) - 1, (rows, seq))
    ids[:, -1] = tokenizer.eos_token_id
    mask = torch.ones_like(ids)
    out = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone(), "loss_units": torch.full((batch,), seq)}
    if stage == "dpo":
        response = torch.zeros_like(mask, dtype=torch.bool)
        response[:, -53:] = True
        out |= {
            "response_mask": response,
            "ref_chosen": torch.full((batch,), -60.0),
            "ref_rejected": torch.full((batch,), -60.0),
        }
    return {k: v.to(device) for k, v in out.items()}


def random_packed_pairs(tokenizer, batch: int, seq: int, response: int = 53) -> dict[str, torch.Tensor]:
    """Pairs as `rlhfkit rm` trains on them: one row of query + chosen + rejected, each response
    `response` tokens ending in EOS, so a row is seq + response tokens where two unpacked rows were 2 x seq."""
    from rlhfkit.scoring import collate_packed_pairs

    def tokens(n: int) -> list[int]:
        return torch.randint(100, len(tokenizer) - 1, (n,)).tolist()

    pairs = [
        PairExample(
            None,
            QueryTokens(tokens(seq - response), "", seq - response, 0, False),
            [*tokens(response - 1), tokenizer.eos_token_id],
            [*tokens(response - 1), tokenizer.eos_token_id],
        )
        for _ in range(batch)
    ]
    return collate_packed_pairs(pairs, tokenizer.pad_token_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["sft", "rm", "dpo"], default="sft")
    parser.add_argument("--model", default="smollm2-135m", help="embedded name, HF directory, hub id, or 'tiny'")
    parser.add_argument("--batch", type=int, default=4, help="rows per step (pairs for rm)")
    parser.add_argument("--seq", type=int, default=562, help="tokens per row (562 SFT, 638 RM in the paper)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA, or a CPU with AVX-512 BF16 or AMX)")
    args = parser.parse_args()

    device = best_device()
    model, tokenizer, loss_fn = build(args.stage, args.model)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, eps=1e-5)
    batch = random_batch(args.stage, tokenizer, args.batch, args.seq, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss, _ = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
    tokens = int(batch["attention_mask"].sum())
    median = sorted(times)[len(times) // 2]
    peak = matmul_peak_gflops(torch.bfloat16 if args.bf16 else torch.float32, device)
    flops_per_token = training_flops_per_token(model.config, args.seq)
    print(
        json.dumps(
            {
                "benchmark": f"{args.stage}_train_step",
                "model": args.model,
                "batch": args.batch,
                "seq": args.seq,
                "tokens_per_step": tokens,
                "step_s_median": round(median, 4),
                "tokens_per_s": round(tokens / median, 1),
                "bf16": args.bf16,
                "model_gflops_per_s": round(tokens / median * flops_per_token / 1e9, 1),
                "matmul_peak_gflops": peak,
                "mfu": mfu(tokens / median, flops_per_token, peak),
            }
            | machine_fields(device)
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
