"""Each on-policy command and each published method declared once.

An `Algorithm` is a command (ppo, grpo, rloo, reinforce, distill): its config class, its presets and its value
model. A `Method` is a published recipe run by one of those commands: the options that make it (its
policy loss, loss aggregation, estimator, clipping, KL...), its presets and its citation; `METHODS`
is the table docs/algorithms.md lists, and a test checks that every method's presets set its options.

A new algorithm is a new `Algorithm` (with its config class in `config/onpolicy.py` and its presets in
`presets/`); the stage registry (`stages.py`) makes each one a command; a new advantage estimator is a
function declared with `@advantages.estimator(name, needs...)`, its name in the config class's
`advantage_estimator` choices; a new policy loss is a function in `policy_losses.POLICY_LOSSES` named in
`policy_loss`'s choices. Kept free of torch so that the command line starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import DistillConfig, GRPOConfig, OnPolicyConfig, PPOConfig, ReinforceConfig, RLOOConfig


@dataclass(frozen=True)
class Algorithm:
    name: str  # the command: rlhfkit <name>
    config: type[OnPolicyConfig]
    presets: tuple[str, ...]  # shipped presets with published settings, TL;DR first
    about: str
    needs_value_model: bool = False  # trains a critic, whose options its config gives (`value_options`)
    needs_teacher: bool = False  # learns from a teacher alone (`teacher=`), so no pipeline stage can run it


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "ppo",
            PPOConfig,
            ("tldr-ppo", "hh-ppo"),
            "PPO from the SFT policy against the reward model (Section 7, Details 20-25, Table 7)",
            needs_value_model=True,
        ),
        Algorithm(
            "grpo",
            GRPOConfig,
            (
                "tldr-grpo",
                "hh-grpo",
                "gsm8k-grpo",
                "tldr-dr-grpo",
                "gsm8k-dr-grpo",
                "tldr-dapo",
                "gsm8k-dapo",
                "tldr-gspo",
                "gsm8k-gspo",
            ),
            "GRPO and its successors (Dr. GRPO, DAPO, GSPO, CISPO): G samples per prompt, group-relative advantages, "
            "no value model",
        ),
        Algorithm(
            "rloo",
            RLOOConfig,
            ("tldr-rloo",),
            "RLOO: k samples per prompt, leave-one-out baseline, no value model (PPO's core)",
        ),
        Algorithm(
            "reinforce",
            ReinforceConfig,
            ("tldr-reinforce-pp", "gsm8k-reinforce-pp"),
            "REINFORCE++, REINFORCE++-baseline and ReMax: batch-normalised or greedy baselines, no value model",
        ),
        Algorithm(
            "distill",
            DistillConfig,
            (),
            "on-policy distillation: the student samples, a frozen teacher scores every token (reverse-KL advantage, "
            "JSD or top-k forward KL; docs/distillation.md)",
            needs_teacher=True,
        ),
    )
}


def algorithm_of(config: type[OnPolicyConfig]) -> Algorithm:
    """The declaration whose config class is `config` (a PPO config runs PPO, never another algorithm)."""
    return next(a for a in ALGORITHMS.values() if config is a.config)


@dataclass(frozen=True)
class Method:
    """A published on-policy recipe: the options that make it, set on top of its command's defaults."""

    name: str
    command: str  # the `Algorithm` that runs it
    options: dict[str, Any]  # what it changes; every preset of the method sets each of these
    presets: tuple[str, ...]
    changes: str  # what it changes relative to PPO/GRPO, in a few words
    citation: str


METHODS: tuple[Method, ...] = (
    Method(
        "ppo",
        "ppo",
        {"advantage_estimator": "gae", "policy_loss": "ppo-clip", "loss_aggregation": "token-mean"},
        ("tldr-ppo", "hh-ppo"),
        "the baseline: GAE with a value model, token-level clipped ratio",
        "Schulman et al. 2017; Huang et al. 2024",
    ),
    Method(
        "grpo",
        "grpo",
        {
            "scale_rewards": True,
            "loss_aggregation": "seq-mean-token-mean",
            "kl_placement": "loss",
            "kl_estimator": "k3",
        },
        ("tldr-grpo", "hh-grpo", "gsm8k-grpo"),
        "no value model; (R - group mean) / group std; per-sequence token mean; k3 KL in the loss",
        "Shao et al. 2024",
    ),
    Method(
        "dr-grpo",
        "grpo",
        {"scale_rewards": False, "loss_aggregation": "seq-mean-token-sum-norm"},
        ("tldr-dr-grpo", "gsm8k-dr-grpo"),
        "no division by the group std; token sums over a constant, not each response's length",
        "Liu et al. 2025",
    ),
    Method(
        "dapo",
        "grpo",
        {
            "clip_range": 0.2,
            "clip_range_high": 0.28,
            "loss_aggregation": "token-mean",
            "dynamic_sampling": True,
            "mask_truncated": True,
            "kl_coef": 0.0,
        },
        ("tldr-dapo", "gsm8k-dapo"),
        "clip-higher; token mean over the batch; dynamic sampling; overlong shaping and filtering; no KL",
        "Yu et al. 2025",
    ),
    Method(
        "gspo",
        "grpo",
        {"policy_loss": "gspo", "clip_range": 3e-4, "clip_range_high": 4e-4, "loss_aggregation": "seq-mean-token-mean"},
        ("tldr-gspo", "gsm8k-gspo"),
        "one length-normalised ratio per sequence, clipped at 3e-4 / 4e-4",
        "Zheng et al. 2025",
    ),
    Method(
        "cispo",
        "grpo",
        {"policy_loss": "cispo", "loss_aggregation": "token-mean"},
        (),
        "REINFORCE weighted by the clipped, detached token ratio: no token loses its gradient",
        "MiniMax 2025",
    ),
    Method(
        "rloo",
        "rloo",
        {"advantage_estimator": "rloo"},
        ("tldr-rloo",),
        "baseline: the mean of the other k-1 samples",
        "Ahmadian et al. 2024",
    ),
    Method(
        "reinforce-pp",
        "reinforce",
        {"advantage_estimator": "reinforce-pp", "kl_placement": "reward", "kl_estimator": "k1"},
        ("tldr-reinforce-pp",),
        "one sample; token returns with a k1 KL reward, normalised over the whole batch",
        "Hu et al. 2025",
    ),
    Method(
        "reinforce-pp-baseline",
        "reinforce",
        {"advantage_estimator": "reinforce-pp-baseline", "kl_placement": "loss", "kl_estimator": "k2"},
        ("gsm8k-reinforce-pp",),
        "group mean subtracted, then normalised over the whole batch; k2 KL in the loss",
        "Hu et al. 2025",
    ),
    Method(
        "remax",
        "reinforce",
        {"advantage_estimator": "remax"},
        (),
        "baseline: the score of the prompt's greedy response",
        "Li et al. 2023",
    ),
)
