"""Every stage's tiny options, and the command line of a run on them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

PRESETS = {
    "sft": "tldr-sft",
    "rm": "tldr-rm",
    "dpo": "tldr-dpo",
    "ppo": "tldr-ppo",
    "grpo": "tldr-grpo",
    "rloo": "tldr-rloo",
    "reinforce": "tldr-reinforce-pp",
    "pipeline": "quickstart",
}

# which entry of a test's inputs (the `ppo_dirs` fixture: policy, rm, posts, pairs) each stage option reads
ON_POLICY_INPUTS = {"model": "policy", "reward_model": "rm", "data": "posts"}
INPUTS = {
    "sft": {"model": "policy", "data": "posts"},
    "rm": {"model": "policy", "data": "pairs"},
    "dpo": {"model": "policy", "data": "pairs"},
    "ppo": ON_POLICY_INPUTS,
    "grpo": ON_POLICY_INPUTS,
    "rloo": ON_POLICY_INPUTS,
    "reinforce": ON_POLICY_INPUTS,
    "distill": {"model": "policy", "data": "posts"},  # teacher= is the test's own
    "pipeline": {"model": "policy", "sft_data": "posts", "comparisons": "pairs"},
}

# a few rows per step on 2-layer d=64 models at a learning rate that moves them, nothing else logged
TINY_COMMON = {"max_query_length": 128, "learning_rate": 1e-3, "report_to": ""}
TINY_PAIRS = TINY_COMMON | {"validation_fraction": 0.2, "total_batch_size": 8, "micro_batch_size": 4, "eval_pairs": 0}
TINY_ON_POLICY = TINY_COMMON | {
    "validation_posts": 8,
    "eval_samples": 0,
    "total_batch_size": 8,
    "micro_batch_size": 4,
    "generation_batch_size": 8,
    "forward_batch_size": 4,
    "max_steps": 2,
    "max_response_length": 10,
    "sample_every": 0,
}
TINY_PIPELINE_STAGE = {"max_query_length": 128, "report_to": ""}
TINY = {
    "sft": TINY_COMMON | {"validation_posts": 8, "eval_samples": 0, "total_batch_size": 4, "micro_batch_size": 2},
    "rm": TINY_PAIRS | {"sft_data": ""},  # no reference summaries: the Detail 15 bias stays as trained
    "dpo": TINY_PAIRS | {"forward_batch_size": 4, "max_steps": 3, "eval_samples": 2},
    "ppo": TINY_ON_POLICY,
    "grpo": TINY_ON_POLICY | {"samples_per_prompt": 4},
    "rloo": TINY_ON_POLICY | {"samples_per_prompt": 4},
    "reinforce": TINY_ON_POLICY,
    "distill": TINY_ON_POLICY,
    "pipeline": {
        "eval_posts": 4,
        "sft": TINY_PIPELINE_STAGE
        | {"validation_posts": 8, "eval_samples": 0, "total_batch_size": 4, "micro_batch_size": 4, "max_steps": 2},
        "rm": TINY_PIPELINE_STAGE
        | {"total_batch_size": 4, "micro_batch_size": 2, "max_steps": 2, "eval_pairs": 8, "normalization_samples": 8},
        "ppo": TINY_PIPELINE_STAGE
        | {
            "validation_posts": 8,
            "eval_samples": 2,
            "total_batch_size": 4,
            "micro_batch_size": 4,
            "generation_batch_size": 4,
            "forward_batch_size": 4,
            "max_steps": 2,
            "max_response_length": 8,
            "save_every": 1,
        },
    },
}


def stage_args(stage: str, inputs: dict[str, Path], out: Path | None, **extra: Any) -> dict[str, Any]:
    """The options of a tiny, fast `stage` run on `inputs` (policy, rm, posts, pairs: those the stage
    reads) writing to `out`; `extra` options win. For `resolve(stage, ...)` or, through `cli_args`, a
    command line."""
    wired = {option: str(inputs[name]) for option, name in INPUTS[stage].items()}
    return wired | {"output_dir": str(out)} | TINY[stage] | extra


def cli_args(options: dict[str, Any]) -> list[str]:
    """`key=value` arguments; a mapping (a pipeline stage's options) in YAML flow style, as typed."""
    return [f"{key}={flow_yaml(value) if isinstance(value, dict) else value}" for key, value in options.items()]


def flow_yaml(mapping: dict) -> str:
    return yaml.safe_dump(mapping, default_flow_style=True, sort_keys=False, width=sys.maxsize).strip()


def command(stage: str, inputs: dict, out: Path, **extra) -> list[str]:
    """`rlhfkit STAGE` on the tiny options, one step unless `extra` sets max_steps."""
    return [stage, *cli_args(stage_args(stage, inputs, out, **{"max_steps": 1} | extra))]


def preset_command(stage: str, inputs: dict, out: Path, **extra) -> list[str]:
    """`command` under the stage's preset (PRESETS): `rlhfkit STAGE --preset NAME key=value ...`."""
    return [stage, "--preset", PRESETS[stage], *command(stage, inputs, out, **extra)[1:]]
