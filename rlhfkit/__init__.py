"""rlhfkit: the RLHF pipeline of Huang et al. 2024, every implementation detail named and tested.

From Python (docs/python-api.md): `rlhfkit.sft(...)`, `rlhfkit.rm(...)`, `rlhfkit.dpo(...)`, `rlhfkit.ppo(...)`,
`rlhfkit.grpo(...)`, `rlhfkit.rloo(...)`, `rlhfkit.reinforce(...)`, `rlhfkit.distill(...)`, `rlhfkit.pipeline(...)`,
`rlhfkit.evaluate(...)` (the `eval` command), `rlhfkit.generate(...)`, or `rlhfkit.run(command, ...)` for any
command; each returns a `Result`. The config classes (`rlhfkit.GRPOConfig`, ...) and the errors a user can act on
(`rlhfkit.UserError` and its kin) are here too.

The names load on first use: every module of the package imports this one first, and the command line must not
pay for the registry of every stage before it knows which one runs.
"""

import importlib

__version__ = "0.1.0"

API = ("run", "sft", "rm", "dpo", "ppo", "grpo", "rloo", "reinforce", "distill", "pipeline", "evaluate", "generate",
       "Result", "LaunchFailed")
CONFIGS = ("SFTConfig", "RMConfig", "DPOConfig", "PPOConfig", "GRPOConfig", "RLOOConfig", "ReinforceConfig",
           "DistillConfig",
           "PipelineConfig", "EvalConfig", "Gsm8kEvalConfig", "GenerateConfig", "RMEvalConfig", "JudgeEvalConfig",
           "AnalyzeConfig")
ERRORS = ("UserError", "ConfigError", "DataFormatError", "ModelError", "NonFiniteError", "CheckpointError",
          "RunLockedError", "DiskFullError")
HOME = {**dict.fromkeys(API, "rlhfkit.api"), **dict.fromkeys(CONFIGS, "rlhfkit.config"),
        **dict.fromkeys(ERRORS, "rlhfkit.errors")}
__all__ = [*API, *CONFIGS, *ERRORS, "__version__"]


def __getattr__(name: str):
    if name not in HOME:
        raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")
    # importlib, not an import statement: this facade sits above every module, which all import the package first
    return getattr(importlib.import_module(HOME[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *HOME])
