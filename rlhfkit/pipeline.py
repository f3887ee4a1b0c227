"""`rlhfkit pipeline`: SFT -> reward model -> PPO (and DPO, GRPO, RLOO) -> evaluation in one command.

Each stage runs with its preset, the options the pipeline preset gives it, and the wiring below
(which model and data each stage reads), in `<output_dir>/<stage>/`. A stage that finished
(`done.json`) is skipped on a re-run; a stage that was interrupted after a checkpoint resumes from
it; a stage that never checkpointed starts again. The eval stage summarises the same held-out
posts with the SFT policy and every trained policy (`rlhfkit generate`), then compares them
(`rlhfkit eval`); a summary of every stage's headline numbers lands in `<output_dir>/pipeline.json`.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from typing import Any

from .checkpoint import find_checkpoint
from .config import ConfigError, PipelineConfig, resolve
from .tracking import read_metrics

RUNNERS = {"sft": "rlhfkit.trainers.sft:run", "rm": "rlhfkit.trainers.reward:run", "dpo": "rlhfkit.trainers.dpo:run",
           "ppo": "rlhfkit.trainers.ppo:run", "grpo": "rlhfkit.trainers.group:run_grpo", "rloo": "rlhfkit.trainers.group:run_rloo",
           "eval": "rlhfkit.eval.compare:run"}
POLICY_STAGES = ("sft", "dpo", "ppo", "grpo", "rloo")
DONE = "done.json"


def wiring(stage: str, cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    """Which models and data a stage reads: the previous stages' outputs."""
    sft_model, rm_model = str(root / "sft" / "model"), str(root / "rm" / "model")
    on_policy = {"model": sft_model, "reward_model": rm_model, "data": cfg.sft_data}
    return {
        "sft": {"model": cfg.model, "data": cfg.sft_data},
        "rm": {"model": sft_model, "data": cfg.comparisons, "sft_data": cfg.sft_data},
        "dpo": {"model": sft_model, "data": cfg.comparisons},
        "ppo": on_policy,
        "grpo": on_policy,
        "rloo": on_policy,
    }[stage] | {"output_dir": str(root / stage)}


def check_order(stages: list[str]) -> None:
    needs = {"rm": "sft", "dpo": "sft", "ppo": "rm", "grpo": "rm", "rloo": "rm"}
    for i, stage in enumerate(stages):
        if stages.count(stage) > 1:
            raise ConfigError(f"stages lists {stage} twice")
        need = needs.get(stage)
        if need and need not in stages[:i]:
            raise ConfigError(f"stages: {stage} reads the output of {need}, which must come before it")


def stage_config(stage: str, cfg: PipelineConfig, root: Path) -> Any:
    options = dict(getattr(cfg, stage))
    preset = options.pop("preset", None)
    overrides = options | wiring(stage, cfg, root)
    if find_checkpoint(str(root / stage)) is not None:
        overrides["resume"] = str(root / stage)
    return resolve(stage, preset, None, overrides)


def call(target: str, stage_cfg: Any) -> None:
    """Run `module:function` on a resolved config, as the command line would."""
    module, function = target.split(":")
    code = int(getattr(importlib.import_module(module), function)(stage_cfg) or 0)
    if code:
        raise ConfigError(f"{target} stopped with exit code {code}")


def eval_samples(cfg: PipelineConfig, root: Path) -> list[str]:
    """Summaries of the same held-out posts by the SFT policy and every trained policy."""
    specs = []
    generate_cfg = dict(cfg.sft)
    for stage in [s for s in cfg.stages if s in POLICY_STAGES]:
        out = root / "eval" / f"{stage}_samples.jsonl"
        if not out.is_file():
            overrides = {"model": str(root / stage / "model"), "data": cfg.sft_data, "split": "validation",
                         "validation_posts": generate_cfg.get("validation_posts", 300), "num_samples": cfg.eval_posts,
                         "temperature": 0.0, "out": str(out)}
            if "max_query_length" in generate_cfg:
                overrides["max_query_length"] = generate_cfg["max_query_length"]
            call("rlhfkit.trainers.sft:run_generate", resolve("generate", None, None, overrides))
        specs.append(f"{stage}={out}")
    return specs


def model_options(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    """The eval stage's models: the RM scores every policy's samples, the SFT policy is the reference
    of the KL and token shift of the trained ones."""
    options: dict[str, Any] = {"models": [f"{s}={root / s / 'model'}" for s in cfg.stages if s in POLICY_STAGES]}
    if "sft" in cfg.stages:
        options["reference_model"] = str(root / "sft" / "model")
    if "rm" in cfg.stages:
        options["reward_model"] = str(root / "rm" / "model")
    return options


def headline_numbers(stage: str, stage_dir: Path) -> dict[str, Any]:
    """The numbers a stage ends with, read from the files it wrote."""
    if stage == "sft":
        return {k: v for row in read_metrics(stage_dir) for k, v in row.items() if k.startswith("val/")}
    if stage in ("rm", "dpo") and (stage_dir / "rm_eval" / "rm_eval.json").is_file():
        result = json.loads((stage_dir / "rm_eval" / "rm_eval.json").read_text())
        return {"validation_accuracy": result.get("accuracy"), "pairs": result.get("pairs"),
                "humans_prefer_longer": result.get("length_bias", {}).get("humans_prefer_longer")}
    if (stage_dir / "eval.json").is_file():
        return json.loads((stage_dir / "eval.json").read_text())
    return {}


def run(cfg: PipelineConfig, _parsed: Any = None) -> int:
    check_order(list(cfg.stages))
    root = Path(cfg.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    for stage in cfg.stages:
        stage_dir = root / stage
        if (stage_dir / DONE).is_file():
            print(f"pipeline: {stage} already finished ({stage_dir / DONE}); skipping")
        else:
            began = time.time()
            print(f"pipeline: {stage} -> {stage_dir}")
            if stage == "eval":
                stage_dir.mkdir(parents=True, exist_ok=True)
                options = {"samples": eval_samples(cfg, root), "judge": cfg.judge, "out": str(stage_dir)} | model_options(cfg, root) | cfg.eval
                call(RUNNERS[stage], resolve("eval", None, None, options))
            else:
                call(RUNNERS[stage], stage_config(stage, cfg, root))
            (stage_dir / DONE).write_text(json.dumps({"seconds": round(time.time() - began, 1)}))
        summary[stage] = json.loads((stage_dir / DONE).read_text()) | {"headline": headline_numbers(stage, stage_dir)}
    (root / "pipeline.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"pipeline: every stage finished; summary in {root / 'pipeline.json'}")
    return 0
