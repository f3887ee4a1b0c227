"""Each on-policy algorithm declared once: what differs between PPO, GRPO and RLOO is written here
and nowhere else, and the shared core reads it through these typed fields.

A new algorithm is a new `Algorithm` (with its config class in `config.py` and its presets in
`presets/`); the stage registry (`stages.py`) makes each one a command; a new advantage estimator is a function in `update.ESTIMATORS` named in the config
class's `advantage_estimator` choices. Kept free of torch so that the command line starts fast.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..config_onpolicy import GRPOConfig, OnPolicyConfig, PPOConfig, RLOOConfig


@dataclass(frozen=True)
class ValueOptions:
    """The value model (critic) of an algorithm that trains one."""

    source: str  # folder it starts from (empty: the reward model, Detail 22)
    coef: float  # weight of its loss beside the policy loss (Table 7: c1)
    clip_range: float  # value-loss clipping epsilon (0: none)


@dataclass(frozen=True)
class Algorithm:
    name: str  # the command: rlhfkit <name>
    config: type[OnPolicyConfig]
    presets: tuple[str, ...]  # shipped presets with published settings, TL;DR first
    about: str
    policy_loss: Literal["ppo-clip"]  # the clipped surrogate of Schulman et al. 2017 (clip_range 0: unclipped)
    loss_aggregation: Literal["token-mean"]  # the loss of a minibatch: the mean over all its response tokens
    value: Callable[[typing.Any], ValueOptions] | None = None  # reads the critic's options from the config

    @property
    def estimators(self) -> tuple[str, ...]:
        """The advantage estimators this stage accepts: the choices of its config's `advantage_estimator`."""
        return typing.get_args(typing.get_type_hints(self.config)["advantage_estimator"])

    @property
    def needs_value_model(self) -> bool:
        return self.value is not None


def ppo_value_options(cfg: PPOConfig) -> ValueOptions:
    return ValueOptions(cfg.value_model, cfg.vf_coef, cfg.value_clip_range)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ppo", PPOConfig, ("tldr-ppo", "hh-ppo"), "PPO from the SFT policy against the reward model (Section 7, Details 20-25, Table 7)",
              "ppo-clip", "token-mean", value=ppo_value_options),
    Algorithm("grpo", GRPOConfig, ("tldr-grpo", "hh-grpo", "gsm8k-grpo"), "GRPO: G samples per prompt, group-normalised advantages, no value model (PPO's core)",
              "ppo-clip", "token-mean"),
    Algorithm("rloo", RLOOConfig, ("tldr-rloo",), "RLOO: k samples per prompt, leave-one-out baseline, no value model (PPO's core)",
              "ppo-clip", "token-mean"),
)}


def algorithm_of(cfg: OnPolicyConfig) -> Algorithm:
    """The declaration whose config class `cfg` is (a PPO config runs PPO, never another algorithm)."""
    return next(a for a in ALGORITHMS.values() if type(cfg) is a.config)
