"""Every command's options as leaf data: one dataclass per command, YAML presets and `key=value`
overrides. The package imports nothing of rlhfkit but `errors`; which command has which class is
the stage registry's knowledge (stages.py), which hands the class to `resolve`.

Resolution order: dataclass defaults < preset or `--config FILE` < command-line `key=value`.
Every field carries its help text and, where the value comes from the paper, its source (table or
detail number), so `rlhfkit <stage> --help` can show where each default comes from.

    values.py    reading a value: coercion, bounds, unknown keys; the field helpers (`opt`)
    training.py  the training stages: RunConfig, TrainConfig, SFTConfig, PairConfig, RMConfig, DPOConfig
    onpolicy.py  the on-policy stages: OnPolicyConfig and one subclass per algorithm
    commands.py  the commands that train nothing (generate, eval, eval gsm8k, rm-eval, judge-eval, plan, ...)
    checks.py    the checks across one command's options
    resolve.py   presets, config files and overrides, in order, then the checks
"""

from .checks import check_batch_split, check_config, check_update_split, launched_processes
from .commands import (
    AnalyzeConfig,
    EvalConfig,
    GenerateConfig,
    Gsm8kEvalConfig,
    JudgeConfig,
    JudgeEvalConfig,
    MakeTaskConfig,
    PipelineConfig,
    PlanConfig,
    RecipeCheckConfig,
    RMEvalConfig,
    RunsReportConfig,
)
from .onpolicy import DistillConfig, GRPOConfig, OnPolicyConfig, PPOConfig, ReinforceConfig, RLOOConfig
from .resolve import field_info, preset_names, read_config_file, read_preset, resolve, to_yaml
from .sections import (
    SELF_TEACHER,
    AdvantageOptions,
    DistillOptions,
    EpisodeOptions,
    FieldNames,
    LoraOptions,
    ModelSource,
    PairLengths,
    PairSelection,
    PromptSplit,
    RewardOptions,
    RewardShaping,
    RolloutOptions,
    ShardingOptions,
    ValueOptions,
)
from .training import (
    MODEL_OPTIONS,
    DataFieldsConfig,
    DPOConfig,
    PairConfig,
    RMConfig,
    RunConfig,
    SFTConfig,
    TrainConfig,
)
from .values import parse_named

__all__ = [
    "MODEL_OPTIONS",
    "AnalyzeConfig",
    "MakeTaskConfig",
    "AdvantageOptions",
    "DistillConfig",
    "DistillOptions",
    "SELF_TEACHER",
    "EpisodeOptions",
    "FieldNames",
    "LoraOptions",
    "ModelSource",
    "PairLengths",
    "PairSelection",
    "PromptSplit",
    "RewardOptions",
    "RewardShaping",
    "RolloutOptions",
    "ShardingOptions",
    "ValueOptions",
    "DPOConfig",
    "DataFieldsConfig",
    "EvalConfig",
    "GRPOConfig",
    "GenerateConfig",
    "Gsm8kEvalConfig",
    "JudgeConfig",
    "JudgeEvalConfig",
    "OnPolicyConfig",
    "PPOConfig",
    "PairConfig",
    "PipelineConfig",
    "PlanConfig",
    "RecipeCheckConfig",
    "RLOOConfig",
    "RMConfig",
    "RMEvalConfig",
    "ReinforceConfig",
    "RunConfig",
    "RunsReportConfig",
    "SFTConfig",
    "TrainConfig",
    "check_batch_split",
    "check_config",
    "check_update_split",
    "field_info",
    "launched_processes",
    "parse_named",
    "preset_names",
    "read_config_file",
    "read_preset",
    "resolve",
    "to_yaml",
]
