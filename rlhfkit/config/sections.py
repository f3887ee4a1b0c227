"""Typed sections of a stage's config, built once from its flat fields: what the layers below the
stages receive instead of the whole config (YAML and `key=value` stay flat; each section is a
property of the config classes in training.py and onpolicy.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraOptions:
    """LoRA adapters on the trained models (adapters.py)."""

    rank: int  # 0: off, full fine-tuning
    alpha: float
    dropout: float
    target_modules: list[str]  # empty: every linear layer of the decoder blocks

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class ModelSource:
    """Where a stage's model comes from and what loading it may do."""

    model: str  # embedded name, folder or hub id
    trust_remote_code: bool
    allow_pickle: bool


@dataclass(frozen=True)
class ShardingOptions:
    """How the trained models are split across the processes of a launch (sharding.py)."""

    sharding: str  # none, fsdp2, zero2, zero3
    lora_rank: int
    micro_batch_size: int
    max_grad_norm: float
    frozen_device: str = ""  # on-policy stages: where the frozen models live

    def splits_models(self, processes: int) -> bool:
        """Whether `sharding=` splits the models over this launch: on one process it changes nothing."""
        return self.sharding != "none" and processes > 1


@dataclass(frozen=True)
class PairLengths:
    """Token budgets of a comparison's query and responses."""

    max_query_length: int
    max_article_query_length: int  # CNN/DM articles
    max_response_length: int


@dataclass(frozen=True)
class FieldNames:
    """The columns each role is read from in the ecosystem's generic formats (the `*_field` options)."""

    prompt: str = "prompt"
    completion: str = "completion"
    chosen: str = "chosen"
    rejected: str = "rejected"
    text: str = ""  # empty: `text`, or `messages` for a conversation

    def text_columns(self) -> tuple[str, ...]:
        return (self.text,) if self.text else ("text", "messages")


@dataclass(frozen=True)
class PairSelection:
    """Which comparisons a stage loads and how it splits them into training and validation pairs."""

    data: list[str]
    data_format: str
    hf_split: str
    fields: FieldNames
    splits: list[str]  # upstream splits kept (empty: all)
    batches: list[str]  # annotation batches kept (empty: all)
    validation_splits: list[str]  # the split-disjoint protocol (Detail 6); empty: split by prompt
    validation_fraction: float
    seed: int
    max_pairs: int  # 0: all


@dataclass(frozen=True)
class EpisodeOptions:
    """Multi-turn episodes (`environment=`, docs/environments.md): what `environments.episode_plan` builds the
    one plan of a run's, or an evaluated policy's, episodes from."""

    environment: str  # a built-in's name, module:Class, file.py:Class or python:<name>; empty: no episodes
    arguments: dict[str, Any]  # environment_args
    max_turns: int
    timeout: float  # seconds one call of the environment may run (0: no limit)
    check_tokens: bool
    seed: int  # the run's: each episode's environment seed derives from it (`EpisodePlan.seed`)


@dataclass(frozen=True)
class ValueOptions:
    """The value model (critic) of an algorithm that trains one."""

    source: str  # folder it starts from (empty: the reward model, Detail 22)
    coef: float  # weight of its loss beside the policy loss (Table 7: c1)
    clip_range: float  # value-loss clipping epsilon (0: none)


@dataclass(frozen=True)
class RewardShaping:
    """What the advantages see of a raw score: the length penalty, the EOS trick (Detail 23) and DAPO's
    overlong punishment (`onpolicy.advantages.shaped_scores`)."""

    length_penalty: float  # reward_length_penalty
    eos_trick: bool
    missing_eos_score: float
    max_response_length: int
    overlong_buffer: int
    overlong_penalty: float


@dataclass(frozen=True)
class DistillOptions:
    """On-policy distillation (docs/distillation.md): what the teacher is and what the update learns of it
    (onpolicy/distillation.py, the maths in distill_ops.py)."""

    teacher: str  # a folder, embedded name, hub id, python:<name>, or "self": the student's starting weights
    loss: str  # distill_loss: reverse-kl-advantage, jsd, topk-forward-kl
    coef: float  # distill_coef: the teacher's weight beside any task reward
    discount: float  # reverse-kl-advantage: each token's advantage sums the later tokens' with this discount
    beta: float  # jsd: 0 forward KL(T || S), 1 reverse KL(S || T)
    top_k: int  # topk-forward-kl
    temperature: float  # the teacher's log-probabilities are taken at it
    hint: str  # self-distillation: a template over the prompt's columns, added to the teacher's prompt

    @property
    def per_token_advantage(self) -> bool:
        """The teacher's signal is an advantage of each sampled token (not a loss over the vocabulary)."""
        return self.loss == "reverse-kl-advantage"

    @property
    def is_self(self) -> bool:
        return self.teacher == SELF_TEACHER


SELF_TEACHER = "self"


@dataclass(frozen=True)
class AdvantageOptions:
    """The phase between scoring and the update (onpolicy/advantages.py): the per-token rewards, the
    estimator and what the built-in estimators read (a registered estimator receives this section)."""

    estimator: str  # advantage_estimator
    samples_per_prompt: int  # the size of the groups a group estimator compares
    kl_estimator: str
    kl_placement: str
    whiten_rewards: bool
    whiten_advantages: bool
    gamma: float
    lam: float
    scale_rewards: bool  # GRPO's estimator divides by the group's std: GRPO's option, false elsewhere
    shaping: RewardShaping
    distill: DistillOptions | None = None  # a teacher's per-token advantage is added to the estimator's


@dataclass(frozen=True)
class RolloutOptions:
    """How an update's rollout is drawn, sampled and scored (onpolicy/collect.py), and the held-out answers of
    the evaluations (onpolicy/evaluation.py)."""

    seed: int
    samples_per_prompt: int
    prompts_per_update: int  # total_batch_size / samples_per_prompt
    advantage_estimator: str  # its needs decide whether greedy baselines are sampled
    max_response_length: int
    temperature: float
    eval_temperature: float
    decoding: str
    generation_batch_size: int
    forward_batch_size: int
    dynamic_sampling: bool
    dynamic_sampling_min_spread: float
    dynamic_sampling_max_draws: int
    shaping: RewardShaping


@dataclass(frozen=True)
class RewardOptions:
    """Where an on-policy stage's rewards come from and what a reward that fails does
    (onpolicy/reward_sources.py)."""

    functions: list[str]  # reward_functions
    weights: list[float]  # reward_weights
    reward_model: str
    environment: str
    environment_args: dict[str, Any]
    errors: str  # reward_errors
    error_score: float  # reward_error_score
    timeout: float  # reward_timeout
    max_error_fraction: float  # max_reward_error_fraction
    stop_on_error: bool  # stop_on_reward_error, refused with the name of its replacement
    eos_trick: bool
    teacher: bool = False  # a distillation teacher scores every token: something to optimise without a reward


@dataclass(frozen=True)
class PromptSplit:
    """An on-policy stage's prompts and how they split into training and held-out prompts
    (onpolicy/evaluation.split_posts)."""

    data: list[str]
    prompt_format: str
    hf_split: str
    fields: FieldNames
    max_query_length: int
    validation_posts: int
    seed: int
    episodes: EpisodeOptions  # an environment's records may be rewritten before the split
