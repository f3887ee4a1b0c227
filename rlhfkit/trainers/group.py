"""`rlhfkit grpo` and `rlhfkit rloo`: the critic-free on-policy methods on PPO's core.

Both sample G (k) responses per prompt, encoding the prompt once per group, and score them with the
same reward model, EOS trick (Detail 23) and KL handling as PPO; only the advantage estimator
(`ops.ADVANTAGE_ESTIMATORS`: "grpo" or "rloo"), its config defaults and the preset differ, so a
difference in results between the four on-policy runs comes from the algorithm, not the plumbing.
"""

from __future__ import annotations

from typing import Any

from ..config import GRPOConfig, RLOOConfig
from .ppo import run_on_policy


def run_grpo(cfg: GRPOConfig, _parsed: Any = None) -> int:
    return run_on_policy(cfg, "grpo")


def run_rloo(cfg: RLOOConfig, _parsed: Any = None) -> int:
    return run_on_policy(cfg, "rloo")
