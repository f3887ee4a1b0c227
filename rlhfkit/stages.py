"""The stage registry, the one composition root: every `rlhfkit` command declared once, with its
config class, runner, presets and capabilities (whether it may run under `--num-processes N`, which
shardings it takes, whether it trains a policy, whose output it reads in a pipeline). Only the entry
points import it (the CLI and the Python API; tests and benchmarks drive the package the same way): everything a runner
needs of the registry is handed to it here, so nothing below knows the list of stages.

`resolve(name, ...)` is a command's config by name: the config package's `resolve` with the class this
registry holds, then the checks that need the registry (a sharding the stage cannot run, a planned
stage that does not exist). A runner is called with the stage's resolved config (a command without a
config class gets its positional argument, or None) and returns an exit code (None means 0). Each
entry names a small function that imports its runner: the trainers import torch and transformers, so
only the stage that runs pays for its own imports.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import config
from .config import (
    AnalyzeConfig,
    DPOConfig,
    EvalConfig,
    GenerateConfig,
    Gsm8kEvalConfig,
    JudgeEvalConfig,
    MakeTaskConfig,
    OnPolicyConfig,
    PipelineConfig,
    PlanConfig,
    RecipeCheckConfig,
    RMConfig,
    RMEvalConfig,
    RunConfig,
    RunsReportConfig,
    SFTConfig,
)
from .errors import ConfigError
from .onpolicy.algorithms import ALGORITHMS

Runner = Callable[[Any], int | None]
ALL_SHARDINGS = ("fsdp2", "zero2", "zero3")
ON_POLICY_SHARDINGS = ("fsdp2",)  # ZeRO runs through accelerate's DeepSpeed plugin, which prepares one model


@dataclass(frozen=True)
class Outputs:
    """What a command writes into its folder (`output_dir`, or `out` for one that trains nothing) that `api.Result`
    reads back, each relative to the folder; None where it writes no such file."""

    evaluation: str | None = None  # its evaluation, a JSON object
    report: str | None = None  # report.json, the headline numbers and caveats beside report.html
    metrics: str | None = None  # metrics.jsonl, one line per logged step
    model: str | None = None  # the trained model's folder


REPORT = "report.json"
TRAINED = {"report": REPORT, "metrics": "metrics.jsonl", "model": "model"}  # what every training stage writes


@dataclass(frozen=True)
class Stage:
    words: tuple[str, ...]  # the command words: ("sft",), ("data", "analyze")
    about: str  # one line in `rlhfkit --help`
    runner: Callable[[], Runner]  # imports the runner and returns it
    config: type | None = None  # without one the command takes no options
    presets: tuple[str, ...] = ()  # shipped presets whose `stage:` is this stage
    positional: str | None = None  # name of one positional argument
    multi_process: bool = False  # may run under --num-processes N
    shardings: tuple[str, ...] = ()  # the `sharding=` values it runs (besides none)
    trains_policy: bool = False  # writes a policy to model/ (the pipeline's eval stage compares them)
    in_pipeline: bool = True  # the pipeline may run it (distill needs a teacher, which no pipeline stage makes)
    reads: tuple[str, ...] = ()  # stages whose output it reads in a pipeline (they must come before it)
    outputs: Outputs = Outputs()  # the files it writes that a caller reads back

    @property
    def name(self) -> str:
        """The key of the stage in presets, config files and pipeline options: "sft", "data-analyze"."""
        return "-".join(self.words)


def sft_runner() -> Runner:
    from .trainers.sft import run

    return run


def rm_runner() -> Runner:
    from .trainers.reward import run

    return run


def dpo_runner() -> Runner:
    from .trainers.dpo import run

    return run


def on_policy_runner() -> Runner:
    from .onpolicy.trainer import run

    return run


def pipeline_runner() -> Runner:
    from .pipeline_command import run

    return functools.partial(run, commands=pipeline_commands())


def report_runner() -> Runner:
    from .report.runs_report import run

    return run


def rm_eval_runner() -> Runner:
    from .reward_eval.command import run_eval

    return run_eval


def judge_eval_runner() -> Runner:
    from .eval.judge_eval import run

    return run


def eval_runner() -> Runner:
    from .eval.compare import run

    return run


def gsm8k_eval_runner() -> Runner:
    from .eval.gsm8k import run

    return run


def generate_runner() -> Runner:
    from .eval.generate import run_generate

    return run_generate


def analyze_runner() -> Runner:
    from .data.analyze import run

    return run


def make_task_runner() -> Runner:
    from .data.make_task import run

    return run


def recipe_check_runner() -> Runner:
    from .recipe_check import run

    return run


def prepare_runner() -> Runner:
    from .models import run_prepare

    return run_prepare


def plan_runner() -> Runner:
    from .memory_plan import PlannedStage, run

    def stage_of(name: str) -> PlannedStage:
        value_model = name in ALGORITHMS and ALGORITHMS[name].needs_value_model
        return PlannedStage(STAGES[name].config, value_model)

    return functools.partial(run, stage_of=stage_of)


def dist_check_runner() -> Runner:
    from .distributed import run_dist_check

    return run_dist_check


STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage(("sft",), "supervised fine-tuning on TL;DR (Section 5, Table 3)",
          sft_runner, SFTConfig, presets=("tldr-sft",), multi_process=True, shardings=ALL_SHARDINGS,
          trains_policy=True, outputs=Outputs("eval.json", **TRAINED)),
    Stage(("rm",), "reward-model training on human comparisons (Section 6, Table 4)",
          rm_runner, RMConfig, presets=("tldr-rm", "hh-rm"), multi_process=True, shardings=ALL_SHARDINGS,
          outputs=Outputs("rm_eval/rm_eval.json", **TRAINED)),
    Stage(("dpo",), "DPO from the SFT policy on human comparisons (Appendix A equations 4-5, Table 6)",
          dpo_runner, DPOConfig, presets=("tldr-dpo", "hh-dpo"), multi_process=True, shardings=ALL_SHARDINGS,
          trains_policy=True, outputs=Outputs("rm_eval/rm_eval.json", **TRAINED)),
    *(Stage((a.name,), a.about, on_policy_runner, a.config, presets=a.presets, multi_process=True,
            shardings=ON_POLICY_SHARDINGS, trains_policy=True, reads=("rm",), outputs=Outputs("eval.json", **TRAINED),
            in_pipeline=not a.needs_teacher)
      for a in ALGORITHMS.values()),
    Stage(("pipeline",), "SFT -> RM -> PPO (or DPO, GRPO, RLOO, REINFORCE) -> eval, each stage in its own folder, "
          "finished ones skipped",
          pipeline_runner, PipelineConfig,
          presets=("quickstart", "paper-pythia-1b", "paper-pythia-2.8b", "paper-pythia-6.9b", "seed002-gpt2-hh"),
          outputs=Outputs("eval/eval.json", REPORT)),
    Stage(("report",), "several runs in one report.html: shared metrics on shared axes, last values and evaluations "
          "side by side",
          report_runner, RunsReportConfig, outputs=Outputs(report=REPORT)),
    Stage(("rm-eval",), "reward-model evaluation: accuracy by split/batch/confidence, each shown beside the "
          "always-prefer-longer rule on the same pairs (always-longer) and the paired difference; calibration, "
          "length bias, probes",
          rm_eval_runner, RMEvalConfig, outputs=Outputs("rm_eval.json")),
    Stage(("judge-eval",), "a judge's agreement with human labels and its position bias, beside the length baseline",
          judge_eval_runner, JudgeEvalConfig, outputs=Outputs("judge_eval.json", REPORT)),
    Stage(("eval",), "policies compared on their samples: judge win rates with intervals and length control, "
          "head to head, ROUGE-L, alarms",
          eval_runner, EvalConfig, outputs=Outputs("eval.json", REPORT)),
    Stage(("eval", "gsm8k"), "policies' accuracy on GSM8K problems (greedy, sampled, pass@k), with or without the "
          "calculator environment, each beside the first policy's with the paired difference",
          gsm8k_eval_runner, Gsm8kEvalConfig, outputs=Outputs("accuracy.json", REPORT)),
    Stage(("generate",), "summarise TL;DR posts with a policy, with ROUGE-L against the references",
          generate_runner, GenerateConfig),
    Stage(("data", "analyze"), "dataset analysis (any format the stages read, detected): counts, token lengths, "
          "truncation, length bias",
          analyze_runner, AnalyzeConfig),
    Stage(("data", "make-task"), "verifiable arithmetic problems from a seed, in GSM8K's format, training and "
          "held-out sets disjoint by construction (recipes/arithmetic-grpo)",
          make_task_runner, MakeTaskConfig),
    Stage(("plan",), "estimated peak memory per device of a stage (weights, gradients, optimizer, activations, "
          "KV cache, logits): fits or not",
          plan_runner, PlanConfig),
    Stage(("recipe", "check"), "a recipe's runs held against its expected numbers (recipes/*/expected.json): each "
          "number beside its expected value and band; exit 1 when one is outside",
          recipe_check_runner, RecipeCheckConfig),
    Stage(("models", "prepare"), "convert an embedded model (smollm2-135m) into the cache once",
          prepare_runner, positional="name"),
    Stage(("dist-check",), "check that launched processes communicate and agree (use with --num-processes)",
          dist_check_runner, multi_process=True),
)}


def multi_process_names() -> str:
    """"sft, rm, dpo and dist-check": the stages that --num-processes may launch, for its error message."""
    names = [stage.name for stage in STAGES.values() if stage.multi_process]
    return f"{', '.join(names[:-1])} and {names[-1]}"


def training_stages() -> list[str]:
    """The stages that train a model (the ones `rlhfkit plan` estimates)."""
    return [stage.name for stage in STAGES.values() if stage.shardings]


def check_sharding_supported(stage: Stage, sharding: str) -> None:
    """The one check of `sharding=` against what a stage declares, for its own command and for `plan`."""
    if sharding == "none" or sharding in stage.shardings:
        return
    takes = ", ".join(s.name for s in STAGES.values() if sharding in s.shardings)
    if stage.shardings:  # a training stage that shards another way
        raise ConfigError(f"sharding={sharding} is for {takes}; for {stage.name} use sharding={stage.shardings[0]}, "
                          "which shards all four models and gathers the policy for sampling")
    raise ConfigError(f"sharding={sharding} is for training stages ({takes}), not {stage.name}")


def planned_stage(name: str) -> Stage:
    if name not in training_stages():
        raise ConfigError(f"stage={name}: choose one of {', '.join(training_stages())}")
    return STAGES[name]


def check_pipeline_stages(cfg: PipelineConfig) -> None:
    read = {source for s in STAGES.values() for source in s.reads}
    # eval: the pipeline's own
    runnable = [s.name for s in STAGES.values() if (s.trains_policy and s.in_pipeline) or s.name in read] + ["eval"]
    for name in cfg.stages:
        if name not in runnable:
            raise ConfigError(f"stages: {name} is not a pipeline stage; choose from {', '.join(runnable)}")


def check_with_registry(name: str, cfg: Any) -> None:
    """The checks of a command's options that need the registry's declarations."""
    if isinstance(cfg, RunConfig):
        check_sharding_supported(STAGES[name], cfg.sharding)
    if isinstance(cfg, PlanConfig):
        check_sharding_supported(planned_stage(cfg.stage), cfg.sharding)
    if isinstance(cfg, PipelineConfig):
        check_pipeline_stages(cfg)
    if isinstance(cfg, OnPolicyConfig):
        from .onpolicy.advantages import (
            check_estimator,  # the estimators import torch: only an on-policy stage pays
        )

        check_estimator(
            type(cfg), estimator=cfg.advantage_estimator, samples_per_prompt=cfg.samples_per_prompt,
            dynamic_sampling=cfg.dynamic_sampling, temperature=cfg.temperature,
        )


def resolve(
    name: str,
    preset: str | None = None,
    config_file: str | None = None,
    overrides: dict[str, Any] | None = None,
    processes: int = 1,
    base: Any = None,
) -> Any:
    """The checked config of the command `name`: defaults (or `base`) < preset or file < overrides
    (config.resolve)."""
    cfg = config.resolve(STAGES[name].config, name, preset, config_file, overrides or {}, processes, base)
    check_with_registry(name, cfg)
    return cfg


def pipeline_commands():
    """What the pipeline needs of the registry (pipeline_command.Commands)."""
    from .pipeline_command import Commands

    return Commands(
        resolve=resolve,
        run=run_resolved,
        policy_stages=tuple(s.name for s in STAGES.values() if s.trains_policy and s.in_pipeline),
        reads={s.name: s.reads for s in STAGES.values() if s.reads},
        configs={s.name: s.config for s in STAGES.values() if s.config},
    )


def run_resolved(name: str, cfg: Any) -> int:
    """Run the command `name` on a config `resolve` made, in this process."""
    return int(STAGES[name].runner()(cfg) or 0)
