"""Measured peak memory of rlhfkit's training steps beside `rlhfkit plan`'s estimate (docs/memory.md): one
JSON line per configuration with the estimate, the measured peak and the relative error.

    python benchmarks/memory_peaks.py                    # every configuration (about 10 minutes on 2 CPU cores)
    python benchmarks/memory_peaks.py --configs tiny-sft  # one of them (seconds)

How it measures, on a CPU (torch keeps no peak counter there): each configuration runs in a fresh
Python process under `torch.profiler.profile(profile_memory=True)`, started before any model is built,
and the peak is the largest "Total Allocated" of the profiler's memory events: the bytes of live
tensors torch's allocator has handed out, which is what the plan estimates and what CUDA's
`max_memory_allocated` counts on a GPU (not the RSS: no allocator caches, Python objects or library
buffers). Models get random weights from the configuration's config.json, in fp32 as `load_policy`
loads them; AdamW runs with foreach=True, as torch runs it on a GPU. Each run makes two optimizer
steps (or updates) of two micro-batches, so the second step's forward passes run with the
gradients and optimizer state in memory; one row of each micro-batch is shorter (padding), as in a
real batch. The steps are rlhfkit's own: the SFT, reward and DPO loss functions, and for PPO/GRPO the
on-policy sampling, scoring and update code itself.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHS = {
    # a small random Llama (the shapes of rlhfkit.tiny_models.tiny_config, wider), for the fast test
    "tiny-llama": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256,
        "intermediate_size": 640,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 8192,
        "tie_word_embeddings": True,
        "max_position_embeddings": 2048,
    },
    "smollm2-135m": "smollm2-135m",  # the shipped config
    # GPT-NeoX shaped like a small Pythia (untied head, fused qkv, plain MLP)
    "small-neox": {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "vocab_size": 50304,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
    },
}
# name -> architecture and `rlhfkit plan` options (the run uses the same ones)
CONFIGS = {
    "tiny-sft": (
        "tiny-llama",
        {
            "stage": "sft",
            "micro_batch_size": 4,
            "max_query_length": 96,
            "max_response_length": 32,
            "mixed_precision": "no",
        },
    ),
    "smollm2-sft-fp32": (
        "smollm2-135m",
        {
            "stage": "sft",
            "micro_batch_size": 4,
            "max_query_length": 192,
            "max_response_length": 64,
            "mixed_precision": "no",
        },
    ),
    "smollm2-sft-bf16": (
        "smollm2-135m",
        {
            "stage": "sft",
            "micro_batch_size": 4,
            "max_query_length": 192,
            "max_response_length": 64,
            "mixed_precision": "bf16",
        },
    ),
    "smollm2-sft-lora-bf16": (
        "smollm2-135m",
        {
            "stage": "sft",
            "micro_batch_size": 4,
            "max_query_length": 192,
            "max_response_length": 64,
            "mixed_precision": "bf16",
            "lora_rank": 16,
        },
    ),
    "smollm2-sft-checkpointing-bf16": (
        "smollm2-135m",
        {
            "stage": "sft",
            "micro_batch_size": 8,
            "max_query_length": 192,
            "max_response_length": 64,
            "mixed_precision": "bf16",
            "gradient_checkpointing": True,
        },
    ),
    "neox-sft-bf16": (
        "small-neox",
        {
            "stage": "sft",
            "micro_batch_size": 4,
            "max_query_length": 192,
            "max_response_length": 64,
            "mixed_precision": "bf16",
        },
    ),
    "smollm2-rm-bf16": (
        "smollm2-135m",
        {
            "stage": "rm",
            "micro_batch_size": 2,
            "max_query_length": 160,
            "max_response_length": 48,
            "mixed_precision": "bf16",
        },
    ),
    "smollm2-dpo-bf16": (
        "smollm2-135m",
        {
            "stage": "dpo",
            "micro_batch_size": 2,
            "forward_batch_size": 2,
            "max_query_length": 160,
            "max_response_length": 48,
            "mixed_precision": "bf16",
        },
    ),
    "smollm2-ppo-bf16": (
        "smollm2-135m",
        {
            "stage": "ppo",
            "micro_batch_size": 2,
            "generation_batch_size": 4,
            "forward_batch_size": 4,
            "max_query_length": 128,
            "max_response_length": 16,
            "mixed_precision": "bf16",
        },
    ),
    # sampling 128 rows (32 prompts x 4) with a long KV cache: the generation phase is the peak
    "smollm2-grpo-generation-bf16": (
        "smollm2-135m",
        {
            "stage": "grpo",
            "micro_batch_size": 1,
            "generation_batch_size": 128,
            "samples_per_prompt": 4,
            "forward_batch_size": 32,
            "max_query_length": 256,
            "max_response_length": 32,
            "mixed_precision": "bf16",
        },
    ),
}


def write_config(arch: str, folder: Path) -> Path:
    spec = ARCHS[arch]
    if isinstance(spec, str):
        from rlhfkit.model_shape import shipped_config

        spec = shipped_config(spec)
    (folder / "config.json").write_text(json.dumps(spec))
    return folder


# ------------------------------------------------------------------ the measured run (child process)


def rows_of(rng, count: int, length: int, vocab: int, short: int = 0) -> list[list[int]]:
    """`count` random token rows of `length` tokens, the last one `short` tokens shorter."""
    return [rng.integers(0, vocab - 2, length - (short if i == count - 1 else 0)).tolist() for i in range(count)]


def measured_run(name: str, folder: Path) -> int:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    torch.optim.AdamW = functools.partial(torch.optim.AdamW, foreach=True)  # as on a GPU
    _, opts = CONFIGS[name]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        STEPS[opts["stage"]](folder, opts, np.random.default_rng(0))
    trace = folder / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    return max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")


def policy_model(folder: Path, opts: dict, trained: bool = True):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhfkit.models import disable_dropout, enable_activation_checkpointing

    # fp32 as load_policy loads it (from_config would otherwise take the config's torch_dtype)
    model = disable_dropout(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32))
    if not trained:
        return model.eval().requires_grad_(False)
    if opts.get("lora_rank"):
        from peft import LoraConfig, get_peft_model

        linears = {
            n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n
        }
        get_peft_model(model, LoraConfig(r=opts["lora_rank"], lora_alpha=16, target_modules=sorted(linears)))
    if opts.get("gradient_checkpointing"):
        enable_activation_checkpointing(model)
    return model.train()


def scalar_model(folder: Path):
    import torch
    from transformers import AutoConfig, AutoModel

    from rlhfkit.models import disable_dropout
    from rlhfkit.reward_models import ScalarModel

    config = AutoConfig.from_pretrained(folder)
    return ScalarModel(
        disable_dropout(AutoModel.from_config(config, dtype=torch.float32)), "eos-linear", config.vocab_size - 2
    )


def supervised_steps(model, loss_fn, batches, bf16: bool) -> None:
    """Two optimizer steps of two micro-batches each, as trainers/supervised.run_step makes them."""
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, eps=1e-5)
    for _ in range(2):
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss, _ = loss_fn(model, batch)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def sft_steps(folder: Path, opts: dict, rng) -> None:
    from rlhfkit.data.collate import right_pad_query_response
    from rlhfkit.trainers.sft import sft_loss

    model = policy_model(folder, opts)
    vocab, micro = model.config.vocab_size, opts["micro_batch_size"]
    batches = [
        right_pad_query_response(
            rows_of(rng, micro, opts["max_query_length"], vocab),
            rows_of(rng, micro, opts["max_response_length"], vocab, short=5),
            vocab - 2,
        )
        for _ in range(2)
    ]
    supervised_steps(model, sft_loss, batches, opts["mixed_precision"] == "bf16")


def rm_steps(folder: Path, opts: dict, rng) -> None:
    from rlhfkit.data.collate import pack_pairs
    from rlhfkit.trainers.reward import make_pair_loss

    model = scalar_model(folder).train()
    vocab, micro, q, r = (
        model.config.vocab_size,
        opts["micro_batch_size"],
        opts["max_query_length"],
        opts["max_response_length"],
    )
    batches = [
        pack_pairs(
            rows_of(rng, micro, q, vocab),
            rows_of(rng, micro, r, vocab),
            rows_of(rng, micro, r, vocab, short=5),
            vocab - 2,
        )
        for _ in range(2)
    ]
    supervised_steps(model, make_pair_loss(), batches, opts["mixed_precision"] == "bf16")


def dpo_steps(folder: Path, opts: dict, rng) -> None:
    import torch

    from rlhfkit.data.collate import right_pad_query_response
    from rlhfkit.logprobs import sequence_logprobs
    from rlhfkit.trainers.dpo import make_dpo_loss

    policy, reference = policy_model(folder, opts), policy_model(folder, opts, trained=False)
    vocab, q, r, bf16 = (
        policy.config.vocab_size,
        opts["max_query_length"],
        opts["max_response_length"],
        opts["mixed_precision"] == "bf16",
    )

    def pairs(count: int) -> dict:
        queries = rows_of(rng, count, q, vocab)
        return right_pad_query_response(
            queries * 2, rows_of(rng, count, r, vocab) + rows_of(rng, count, r, vocab, short=5), vocab - 2
        )

    batches = []
    for _ in range(2):  # the reference pass (trainers/dpo.reference_logprobs), then the cached values ride in the batch
        batch = pairs(opts["micro_batch_size"])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            wide = pairs(opts["forward_batch_size"])
            sequence_logprobs(reference, wide["input_ids"], wide["attention_mask"], wide["response_mask"])
            logps = sequence_logprobs(reference, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        batch["ref_chosen"], batch["ref_rejected"] = logps.float().chunk(2)
        batches.append(batch)
    supervised_steps(policy, make_dpo_loss(0.05), batches, bf16)


def on_policy_steps(folder: Path, opts: dict, rng) -> None:
    """Two updates of rlhfkit's own on-policy code: sampling, scoring, advantages, the clipped update
    (on the rollout's first two micro-batches: an update's peak is one micro-batch's)."""
    import torch

    from rlhfkit.config import GRPOConfig, PPOConfig
    from rlhfkit.generation import SampleKeys, SamplingParams, sample_responses
    from rlhfkit.onpolicy.advantages import compute_advantages
    from rlhfkit.onpolicy.scoring import OnPolicyModels, score_rollout
    from rlhfkit.onpolicy.trainer import build_optimizers, update_plan
    from rlhfkit.onpolicy.update import update_on_rollout

    policy = policy_model(folder, opts)
    vocab = policy.config.vocab_size
    tokenizer = type("Ids", (), {"pad_token_id": vocab - 2, "eos_token_id": vocab - 1})()
    value = scalar_model(folder).train() if opts["stage"] == "ppo" else None
    models = OnPolicyModels(
        policy,
        policy_model(folder, opts, trained=False),
        scalar_model(folder).eval().requires_grad_(False),
        value,
        tokenizer,
    )
    keys = (
        "micro_batch_size",
        "generation_batch_size",
        "forward_batch_size",
        "max_query_length",
        "max_response_length",
        "mixed_precision",
        "samples_per_prompt",
    )
    config = {"ppo": PPOConfig, "grpo": GRPOConfig}[opts["stage"]]
    cfg = config(
        total_batch_size=opts["generation_batch_size"],
        update_epochs=1,
        num_minibatches=1,
        **{k: opts[k] for k in keys if k in opts},
    )
    optimizers = build_optimizers(models, cfg, 2)
    precision, group = cfg.mixed_precision, cfg.samples_per_prompt
    plan = update_plan(models, cfg, precision)
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.temperature)
    for update in range(2):
        queries = rows_of(rng, cfg.total_batch_size // group, cfg.max_query_length, vocab)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            policy.eval()
            batch = sample_responses(
                policy,
                queries,
                params,
                tokenizer,
                cfg.generation_batch_size,
                SampleKeys(0, update),
                samples_per_prompt=group,
            )
            policy.train()
        batch = score_rollout(models, batch, plan.scoring, precision)
        batch = compute_advantages(batch, cfg.advantage_options, cfg.kl_coef, plan.old_logprobs)
        update_on_rollout(
            models=models,
            optimizers=optimizers,
            batch=batch.select(slice(0, 2 * cfg.micro_batch_size)),
            plan=plan,
            update=update + 1,
            kl_coef=cfg.kl_coef,
        )
        optimizers.advance_schedules()


STEPS = {"sft": sft_steps, "rm": rm_steps, "dpo": dpo_steps, "ppo": on_policy_steps, "grpo": on_policy_steps}


# ------------------------------------------------------------------ the parent: estimate, measure, compare


def estimate(folder: Path, opts: dict):
    from rlhfkit.config import PlanConfig
    from rlhfkit.memory_plan import PlannedStage
    from rlhfkit.memory_plan import estimate as plan_estimate
    from rlhfkit.model_shape import read_shape
    from rlhfkit.onpolicy.algorithms import ALGORITHMS
    from rlhfkit.stages import STAGES

    cfg = PlanConfig(model=str(folder), **opts)
    value_model = cfg.stage in ALGORITHMS and ALGORITHMS[cfg.stage].needs_value_model
    return plan_estimate(cfg, PlannedStage(STAGES[cfg.stage].config, value_model), read_shape(str(folder)))


def compare(name: str) -> dict:
    arch, opts = CONFIGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_config(arch, Path(tmp))
        planned = estimate(folder, opts)
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", name, "--folder", str(folder)],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        measured = int(done.stdout.strip().splitlines()[-1])
    peak = planned.peak
    return {
        "config": name,
        "architecture": arch,
        **opts,
        "estimate_bytes": peak,
        "measured_bytes": measured,
        "estimate_mib": round(peak / 2**20, 1),
        "measured_mib": round(measured / 2**20, 1),
        "relative_error": round((peak - measured) / measured, 4),
        "peak_phase": planned.peak_phase,
        "estimate_by_component_mib": {c: round(v / 2**20, 1) for c, v in planned.phases[planned.peak_phase].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma separated: {', '.join(CONFIGS)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(2)
        print(measured_run(args.child, Path(args.folder)))
        return
    for name in args.configs.split(","):
        print(json.dumps(compare(name)), flush=True)


if __name__ == "__main__":
    main()
