"""`rlhfkit pipeline`: SFT -> reward model -> PPO (or DPO, GRPO, RLOO, REINFORCE) -> evaluation in one command.

Each stage runs with its preset, the options the pipeline preset gives it, and the wiring below
(which model and data each stage reads), in `<output_dir>/<stage>/`. A stage that finished
(`done.json`) is skipped on a re-run; a stage that was interrupted after a checkpoint resumes from
it; a stage that never checkpointed starts again. The eval stage summarises the same held-out
posts with the SFT policy and every trained policy (`rlhfkit generate`), then compares them
(`rlhfkit eval`); a summary of every stage's headline numbers lands in `<output_dir>/pipeline.json`.

The pipeline knows no list of stages: the registry (stages.py) hands it `Commands`, with what each
stage declares (trains a policy, reads another's output) and how to resolve and run one. Which models
and data a stage reads follows from its config class.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import find_checkpoint
from .config import DPOConfig, OnPolicyConfig, PairConfig, PipelineConfig, RMConfig, SFTConfig, to_yaml
from .errors import ConfigError, UserError
from .plots import metric_series
from .report.caveats import read_json
from .report.report import Report, format_value
from .run_folder import holds_other_run
from .tracking import read_metrics

DONE = "done.json"
EVAL = "eval"  # the pipeline's own last stage: every policy's samples, then `rlhfkit eval`


@dataclass(frozen=True)
class Commands:
    """What the pipeline needs of the stage registry, handed in by it."""

    resolve: Callable[..., Any]  # (stage, preset, config_file, overrides) -> its checked config
    run: Callable[[str, Any], int]  # (stage, config) -> exit code
    policy_stages: tuple[str, ...]  # the stages that train a policy, in the registry's order
    reads: dict[str, tuple[str, ...]]  # stage -> the stages whose output it reads
    configs: dict[str, type]  # stage -> its config class

    def holds_out_posts(self, stage: str) -> bool:
        """A stage that holds posts (prompts) out of training: SFT and the on-policy stages."""
        return stage in self.configs and issubclass(self.configs[stage], SFTConfig | OnPolicyConfig)


def starting_policy(cfg: PipelineConfig, root: Path) -> str:
    """The policy the later stages start from: the SFT stage's, or the base model without one (seed 002)."""
    return str(root / "sft" / "model") if "sft" in cfg.stages else cfg.model


def prompt_source(cfg: PipelineConfig) -> dict[str, Any]:
    """Where prompts come from, as stage options: the TL;DR SFT posts (Detail 21), or for HH-RLHF,
    which has no SFT data, the comparisons' dialogues."""
    return {"data": cfg.comparisons, "prompt_format": "hh"} if cfg.task == "hh" else {"data": cfg.sft_data}


def wiring(stage: str, kind: type, cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    """Which models and data a stage of config class `kind` reads: the previous stages' outputs. TL;DR
    prompts come from the SFT data (Detail 21) and its reference summaries set the reward bias (Detail
    15); HH-RLHF has no SFT data, so its prompts are the comparisons' dialogues."""
    policy, rm_model = starting_policy(cfg, root), str(root / "rm" / "model")
    if cfg.task == "hh":
        pairs, reward_bias = {"data": cfg.comparisons, "data_format": "hh"}, {}
    else:
        pairs, reward_bias = {"data": cfg.comparisons}, {"sft_data": cfg.sft_data}
    if issubclass(kind, SFTConfig):
        reads = {"model": cfg.model, "data": cfg.sft_data}
    elif issubclass(kind, RMConfig):
        reads = {"model": policy} | pairs | reward_bias
    elif issubclass(kind, DPOConfig):
        reads = {"model": policy} | pairs
    else:
        reads = {"model": policy, "reward_model": rm_model} | prompt_source(cfg)
    return reads | {"output_dir": str(root / stage)}


def check_order(stages: list[str], reads: dict[str, tuple[str, ...]], task: str = "tldr") -> None:
    if task == "hh" and "sft" in stages:
        raise ConfigError(
            "stages: the hh task has no SFT data; its stages start from the base model (seed 002): drop sft"
        )
    for i, stage in enumerate(stages):
        if stages.count(stage) > 1:
            raise ConfigError(f"stages lists {stage} twice")
        for need in reads.get(stage, ()):
            if need not in stages[:i]:
                raise ConfigError(f"stages: {stage} reads the output of {need}, which must come before it")


def stage_config(stage: str, cfg: PipelineConfig, root: Path, commands: Commands) -> Any:
    """A stage's options: its preset, the pipeline's options for it and the wiring. An unfinished stage
    resumes from its checkpoint; one that saved none starts again in its folder, where an interrupted
    attempt with other options (the pipeline's were changed since) is first moved aside (overwrite)."""
    options = cfg.options_of(stage)
    preset = options.pop("preset", None)
    overrides = options | wiring(stage, commands.configs[stage], cfg, root)
    if find_checkpoint(str(root / stage)) is not None:
        overrides["resume"] = str(root / stage)
    stage_cfg = commands.resolve(stage, preset, None, overrides)
    if not stage_cfg.resume and holds_other_run(root / stage, to_yaml(stage_cfg, stage)):
        return dataclasses.replace(stage_cfg, overwrite=True)
    return stage_cfg


def call(commands: Commands, stage: str, stage_cfg: Any) -> None:
    """Run `stage` on a resolved config, as the command line would."""
    code = commands.run(stage, stage_cfg)
    if code:
        raise ConfigError(f"{stage} stopped with exit code {code}")


def eval_policies(cfg: PipelineConfig, root: Path, commands: Commands) -> dict[str, str]:
    """name -> model folder of every policy the eval stage compares: the SFT policy (or, without an SFT
    stage, the base model) and every trained one."""
    policies = {} if "sft" in cfg.stages else {"base": cfg.model}
    return policies | {s: str(root / s / "model") for s in cfg.stages if s in commands.policy_stages}


def held_out_stage(cfg: PipelineConfig, commands: Commands) -> str:
    """The stage whose split of the posts (prompts) the eval stage answers: the first listed that splits
    them, or, when none is (`stages=eval` after the policies were trained), the one that would: SFT, or
    for HH-RLHF, which has no SFT stage, PPO. Its mapping (`sft={validation_posts: N}`) sets the split."""
    splitting = [s for s in cfg.stages if commands.holds_out_posts(s)]
    return splitting[0] if splitting else ("ppo" if cfg.task == "hh" else "sft")


def held_out_prompts(cfg: PipelineConfig, root: Path, commands: Commands) -> dict[str, Any]:
    """`rlhfkit generate` options that select the prompts the policy stages held out (the split, query
    budget and response length of `held_out_stage`), or a hub split of their own (`eval_hf_split`)."""
    data = prompt_source(cfg)
    stage = held_out_stage(cfg, commands)
    source = stage_config(stage, cfg, root, commands)
    if cfg.eval_hf_split:
        data |= {"hf_split": cfg.eval_hf_split, "split": "all"}
    elif cfg.eval_posts > source.validation_posts:
        raise ConfigError(
            f"eval_posts={cfg.eval_posts} is more than the {source.validation_posts} posts the {stage} stage holds "
            "out: "
            f'lower eval_posts, or raise validation_posts in {stage}= (e.g. '
            f'"{stage}={{validation_posts: {cfg.eval_posts}}}")'
        )
    return data | {
        "validation_posts": source.validation_posts,
        "seed": source.seed,
        "max_query_length": source.max_query_length,
        "max_new_tokens": source.max_response_length,
    }


def eval_samples(cfg: PipelineConfig, root: Path, commands: Commands) -> list[str]:
    """Greedy responses of every policy to the same held-out prompts."""
    specs = []
    prompts = held_out_prompts(cfg, root, commands)
    for name, model in eval_policies(cfg, root, commands).items():
        out = root / "eval" / f"{name}_samples.jsonl"
        if not out.is_file():
            overrides = (
                {"split": "validation"}
                | prompts
                | {"model": model, "num_samples": cfg.eval_posts, "temperature": 0.0, "out": str(out)}
            )
            try:
                call(commands, "generate", commands.resolve("generate", None, None, overrides))
            except ConfigError as e:
                raise ConfigError(f"{e} ({name} answers {held_out_posts(cfg, prompts, commands)})") from None
        specs.append(f"{name}={out}")
    return specs


def held_out_posts(cfg: PipelineConfig, prompts: dict[str, Any], commands: Commands) -> str:
    """Which posts the eval stage answers, naming the options that choose them."""
    if cfg.eval_hf_split:
        return f"eval_posts={cfg.eval_posts} posts of the hub split eval_hf_split={cfg.eval_hf_split}"
    stage = held_out_stage(cfg, commands)
    return (
        f"eval_posts={cfg.eval_posts} of the validation_posts={prompts['validation_posts']} posts the {stage} stage "
        "holds out; "
        f"set them with eval_posts= and {stage}={{validation_posts: N}}"
    )


def eval_options(cfg: PipelineConfig, root: Path, samples: list[str], commands: Commands) -> dict[str, Any]:
    """The eval stage's options: every policy's samples and folder (for its KL), the starting policy as
    the reference of KL and token shift, the RM scoring every sample, the judge and its template."""
    # the stage's folder holds the samples it generated (and an interrupted attempt's results): its own files
    options: dict[str, Any] = {
        "samples": samples,
        "judge": cfg.judge,
        "out": str(root / "eval"),
        "overwrite": True,
        "models": [f"{name}={model}" for name, model in eval_policies(cfg, root, commands).items()],
        "reference_model": starting_policy(cfg, root),
    }
    if "rm" in cfg.stages:
        options["reward_model"] = str(root / "rm" / "model")
    if cfg.task == "hh" and not cfg.judge.startswith("rm:"):  # a reward-model judge reads no template
        options["template"] = "builtin:hh-helpfulness"
    return options | cfg.eval


def headline_numbers(kind: type | None, stage_dir: Path) -> dict[str, Any]:
    """The numbers a stage of config class `kind` (None: the eval stage) ends with, read from the files it wrote."""
    if kind is SFTConfig:
        history = read_metrics(stage_dir)
        losses = metric_series(history, "train/loss")[1]
        first_last = {"train/loss_first": losses[0], "train/loss_last": losses[-1]} if losses else {}
        validation = {k: v for row in history for k, v in row.items() if k.startswith("val/")}
        return first_last | validation | (read_json(stage_dir / "eval.json") or {})
    if kind is not None and issubclass(kind, PairConfig) and (stage_dir / "rm_eval" / "rm_eval.json").is_file():
        result = json.loads((stage_dir / "rm_eval" / "rm_eval.json").read_text())
        return {
            "validation_accuracy": result.get("accuracy"),
            "pairs": result.get("pairs"),
            "always_longer_accuracy": result.get("breakdown", {}).get("overall", {}).get("length_rule"),
            "humans_prefer_longer": result.get("length_bias", {}).get("humans_prefer_longer"),
        }
    return read_json(stage_dir / "eval.json") or {}


def write_pipeline_report(root: Path, summary: dict[str, Any]) -> Path:
    """`<output_dir>/report.html`: every stage's headline numbers beside their baselines and its
    caveats (gathered from the stage's own `report.json`), its wall time and report, then its plots."""
    seconds = sum(float(info.get("seconds") or 0) for info in summary.values())
    report = Report(
        f"Pipeline {root.name}",
        {"output folder": str(root), "stages": " -> ".join(summary), "wall time (s)": round(seconds, 1)},
    )
    for stage in summary:
        report.gather(stage, read_json(root / stage / "report.json") or {})
    links = "".join(
        f'<li><a href="{stage}/report.html">{stage}/report.html</a> ({format_value(info.get("seconds"))} s)</li>'
        for stage, info in summary.items()
        if (root / stage / "report.html").is_file()
    )
    report.sections.append(("Each stage's own report and wall time", f"<ul>{links}</ul>"))
    for stage in summary:
        for plot in stage_plots(root / stage):
            report.figure(f"{stage}: {plot.stem.replace('_', ' ')}", plot)
    return report.write(root)


def stage_plots(stage_dir: Path) -> list[Path]:
    return (
        sorted(stage_dir.glob("plots/*.png"))
        + sorted(stage_dir.glob("rm_eval/*.png"))
        + sorted(stage_dir.glob("*.png"))
    )


@contextmanager
def naming_stage(stage: str) -> Iterator[None]:
    """A user error of a stage (its options, its data) names the stage in its one line."""
    try:
        yield
    except UserError as e:
        raise type(e)(f"pipeline stage {stage}: {e}") from None


def run_stage(stage: str, cfg: PipelineConfig, root: Path, commands: Commands) -> None:
    if stage == EVAL:
        (root / stage).mkdir(parents=True, exist_ok=True)
        options = eval_options(cfg, root, eval_samples(cfg, root, commands), commands)
        call(commands, EVAL, commands.resolve(EVAL, None, None, options))
    else:
        call(commands, stage, stage_config(stage, cfg, root, commands))


def run(cfg: PipelineConfig, commands: Commands) -> int:
    check_order(list(cfg.stages), commands.reads, cfg.task)
    root = Path(cfg.output_dir)
    for stage in (s for s in cfg.stages if s != EVAL):
        with naming_stage(stage):
            stage_config(stage, cfg, root, commands)  # every stage's options are checked before the first stage runs
    if EVAL in cfg.stages:
        with naming_stage(EVAL):
            held_out_prompts(cfg, root, commands)
    root.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}
    for stage in cfg.stages:
        stage_dir = root / stage
        if (stage_dir / DONE).is_file():
            print(f"pipeline: {stage} already finished ({stage_dir / DONE}); skipping")
        else:
            began = time.time()
            print(f"pipeline: {stage} -> {stage_dir}")
            with naming_stage(stage):
                run_stage(stage, cfg, root, commands)
            (stage_dir / DONE).write_text(json.dumps({"seconds": round(time.time() - began, 1)}))
        kind = None if stage == EVAL else commands.configs[stage]
        summary[stage] = json.loads((stage_dir / DONE).read_text()) | {"headline": headline_numbers(kind, stage_dir)}
    (root / "pipeline.json").write_text(json.dumps(summary, indent=2, default=str))
    report = write_pipeline_report(root, summary)
    print(f"pipeline: every stage finished; summary in {root / 'pipeline.json'}, report in {report}")
    return 0
