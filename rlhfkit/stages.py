"""The stage registry: every `rlhfkit` command declared once, with its config class, runner, presets
and whether it may run under `--num-processes N`. The CLI, config resolution and the pipeline read it.

A runner is called with the stage's resolved config (a command without a config class gets its
positional argument, or None) and returns an exit code (None means 0). Each entry names a small
function that imports its runner: the trainers import torch and transformers, so only the stage
that runs pays for its own imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import (
    AnalyzeConfig,
    DPOConfig,
    EvalConfig,
    GenerateConfig,
    JudgeEvalConfig,
    PipelineConfig,
    PlanConfig,
    RMConfig,
    RMEvalConfig,
    RunsReportConfig,
    SFTConfig,
)
from .onpolicy.algorithms import ALGORITHMS

Runner = Callable[[Any], int | None]


@dataclass(frozen=True)
class Stage:
    words: tuple[str, ...]  # the command words: ("sft",), ("data", "analyze")
    about: str  # one line in `rlhfkit --help`
    runner: Callable[[], Runner]  # imports the runner and returns it
    config: type | None = None  # without one the command takes no options
    presets: tuple[str, ...] = ()  # shipped presets whose `stage:` is this stage
    positional: str | None = None  # name of one positional argument
    multi_process: bool = False  # may run under --num-processes N

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
    from .pipeline import run

    return run


def report_runner() -> Runner:
    from .eval.runs_report import run

    return run


def rm_eval_runner() -> Runner:
    from .eval.rm_eval import run_eval

    return run_eval


def judge_eval_runner() -> Runner:
    from .eval.judge_eval import run

    return run


def eval_runner() -> Runner:
    from .eval.compare import run

    return run


def generate_runner() -> Runner:
    from .eval.generate import run_generate

    return run_generate


def analyze_runner() -> Runner:
    from .cli import run_analyze

    return run_analyze


def prepare_runner() -> Runner:
    from .cli import run_prepare

    return run_prepare


def plan_runner() -> Runner:
    from .memory_plan import run

    return run


def dist_check_runner() -> Runner:
    from .cli import run_dist_check

    return run_dist_check


STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage(("sft",), "supervised fine-tuning on TL;DR (Section 5, Table 3)",
          sft_runner, SFTConfig, presets=("tldr-sft",), multi_process=True),
    Stage(("rm",), "reward-model training on human comparisons (Section 6, Table 4)",
          rm_runner, RMConfig, presets=("tldr-rm", "hh-rm"), multi_process=True),
    Stage(("dpo",), "DPO from the SFT policy on human comparisons (Appendix A equations 4-5, Table 6)",
          dpo_runner, DPOConfig, presets=("tldr-dpo", "hh-dpo"), multi_process=True),
    *(Stage((a.name,), a.about, on_policy_runner, a.config, presets=a.presets, multi_process=True) for a in ALGORITHMS.values()),
    Stage(("pipeline",), "SFT -> RM -> PPO (and DPO, GRPO, RLOO) -> eval, each stage in its own folder, finished ones skipped",
          pipeline_runner, PipelineConfig,
          presets=("quickstart", "paper-pythia-1b", "paper-pythia-2.8b", "paper-pythia-6.9b", "seed002-gpt2-hh")),
    Stage(("report",), "several runs in one report.html: shared metrics on shared axes, last values and evaluations side by side",
          report_runner, RunsReportConfig),
    Stage(("rm-eval",), "reward-model evaluation: accuracy by split/batch/confidence, each shown beside the "
          "always-prefer-longer rule on the same pairs (always-longer) and the paired difference; calibration, "
          "length bias, probes",
          rm_eval_runner, RMEvalConfig),
    Stage(("judge-eval",), "a judge's agreement with human labels and its position bias, beside the length baseline",
          judge_eval_runner, JudgeEvalConfig),
    Stage(("eval",), "policies compared on their samples: judge win rates with intervals and length control, head to head, ROUGE-L, alarms",
          eval_runner, EvalConfig),
    Stage(("generate",), "summarise TL;DR posts with a policy, with ROUGE-L against the references",
          generate_runner, GenerateConfig),
    Stage(("data", "analyze"), "dataset analysis (any format the stages read, detected): counts, token lengths, truncation, length bias",
          analyze_runner, AnalyzeConfig),
    Stage(("plan",), "estimated peak memory per device of a stage (weights, gradients, optimizer, activations, KV cache, logits): fits or not",
          plan_runner, PlanConfig),
    Stage(("models", "prepare"), "convert an embedded model (smollm2-135m) into the cache once",
          prepare_runner, positional="name"),
    Stage(("dist-check",), "check that launched processes communicate and agree (use with --num-processes)",
          dist_check_runner, multi_process=True),
)}


def multi_process_names() -> str:
    """"sft, rm, dpo and dist-check": the stages that --num-processes may launch, for its error message."""
    names = [stage.name for stage in STAGES.values() if stage.multi_process]
    return f"{', '.join(names[:-1])} and {names[-1]}"
