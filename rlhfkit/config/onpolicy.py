"""The on-policy stages' options (`rlhfkit ppo`, `grpo`, `rloo`, `reinforce`): what every on-policy
stage shares in `OnPolicyConfig`, and each algorithm's own defaults in its subclass. The objectives
these options select are declared in `onpolicy/algorithms.py` and documented in docs/algorithms.md."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from .sections import (
    AdvantageOptions,
    DistillOptions,
    EpisodeOptions,
    PromptSplit,
    RewardOptions,
    RewardShaping,
    RolloutOptions,
    ShardingOptions,
    ValueOptions,
)
from .training import RunConfig
from .values import (
    PROMPT_FORMATS_HELP,
    check_tokens_opt,
    environment_args_opt,
    environment_timeout_opt,
    max_turns_opt,
    opt,
)


@dataclass
class OnPolicyConfig(RunConfig):
    """Fields of every on-policy stage: prompts, sampling, scoring, KL penalty, clipped updates."""

    model: str = opt(
        "smollm2-135m", "SFT policy: starts the trained policy and is the frozen reference policy", "Section 7"
    )
    reward_model: str = opt(
        "",
        "frozen reward model: the model/ folder written by `rlhfkit rm`, or any AutoModelForSequenceClassification "
        "folder or hub id with one output (empty: reward functions alone; one of the two is required)",
        "Section 7",
    )
    reward_functions: list[str] = opt(
        [],
        "programmatic rewards (rlhfkit/rewards.py): built-ins gsm8k, format, length, or a callable as "
        "module:function or file.py:function, called by keyword as TRL calls them: "
        "fn(prompts=, completions=, completion_ids=, ..., **columns)",
    )
    reward_weights: list[float] = opt(
        [],
        "weight of each reward: one per reward function, then one for the reward model when there is "
        "one (empty: all 1)",
        minimum=-math.inf,
    )
    reward_errors: Literal["skip", "score", "stop"] = opt(
        "skip",
        "what becomes of a row a reward function failed on (raised, returned a wrong count, a value that is no "
        "finite number, or overran reward_timeout; each is reported and counted in rewards/<name>_errors): skip drops "
        "the row from the update, score gives it reward_error_score, stop ends the run at the first (docs/rewards.md)",
    )
    max_reward_error_fraction: float = opt(
        0.5,
        "skip and score: stop the run at an update where a reward function failed on more than this share of the "
        "rows (reward/<name>/error_fraction); one that failed on every row always stops it",
    )
    reward_error_score: float = opt(
        -1.0, "reward_errors=score: the value of a row a reward function failed on", minimum=-math.inf
    )
    stop_on_reward_error: bool = opt(
        False, "replaced by reward_errors=stop; kept so that the configs of earlier runs read (true is refused)"
    )
    reward_timeout: float = opt(
        600.0,
        "seconds a reward function's call may run; one still running is stopped and its rows fail (reward_errors; "
        "0: no limit; docs/rewards.md)",
        minimum=0.0,
    )
    data: list[str] = opt(
        ["vwxyzjn/summarize_from_feedback_tldr_3_filtered"],
        "prompts in prompt_format: TL;DR SFT data (their posts), HH-RLHF comparisons (their dialogues), GSM8K "
        "problems or prompt-only data (hub id, files or folders)",
        "Detail 1",
    )
    prompt_format: Literal["auto", "tldr-sft", "hh", "gsm8k", "prompt-only"] = opt("auto", PROMPT_FORMATS_HELP)
    hf_split: str = opt("train", "split to read when `data` is a hub id")
    validation_posts: int = opt(
        300, "posts held out by post identity, as `rlhfkit sft` splits them: never prompts; evaluation summarises them"
    )
    eval_samples: int = opt(64, "held-out posts summarised by the SFT and trained policies at the end (0: none)")
    eval_temperature: float = opt(0.0, "temperature of the evaluation summaries (0: greedy)")
    learning_rate: float = opt(3e-6, "AdamW learning rate", "Table 7")
    adam_eps: float = opt(1e-5, "AdamW epsilon", "Table 7")
    lr_scheduler: Literal["cosine", "linear", "constant"] = opt(
        "linear", "learning-rate schedule over the updates", "Table 7"
    )
    total_episodes: int = opt(
        1_000_000, "episodes (sampled responses) in the whole run", "Table 7, Detail 21", minimum=1
    )
    total_batch_size: int = opt(512, "episodes per update (rollout batch)", "Table 7", minimum=1)
    max_steps: int = opt(0, "stop after this many updates (0: total_episodes / total_batch_size)")
    num_minibatches: int = opt(1, "minibatches per update epoch; one optimizer step each", "Table 7 (N_mb)", minimum=1)
    update_epochs: int = opt(4, "passes over each rollout batch", "Table 7 (K)", minimum=1)
    micro_batch_size: int = opt(8, "rows per forward/backward pass in the update (gradient accumulation)", minimum=1)
    generation_batch_size: int = opt(64, "queries per generation batch", minimum=1)
    forward_batch_size: int = opt(
        16, "rows per no-grad forward pass over the rollout (policy, reference, value, reward)", minimum=1
    )
    samples_per_prompt: int = opt(1, "responses sampled per prompt (1 for PPO; group methods use more)", minimum=1)
    shared_prefix: Literal["auto", "off"] = opt(
        "auto",
        "grouped methods: read each prompt once for its group in every scoring and update pass (shared rows; auto "
        "falls back to unshared rows, with the reason logged, where a model cannot take them); off: unshared rows",
        "docs/performance.md",
    )
    reuse_update_forward: bool = opt(
        True,
        "with one minibatch, take the old policy's log-probabilities from the update's first epoch of forwards, "
        "which all run before its optimizer step, instead of a scoring pass of their own (TRL does so at K = 1), "
        "where the rewards do not need them (kl_placement=loss, or kl_coef 0)",
    )
    max_response_length: int = opt(
        53, "response tokens sampled; the response is cut after its first EOS", "Detail 23", minimum=1
    )
    temperature: float = opt(
        0.7, "sampling temperature, also applied in every forward pass that computes logprobs", "Table 7"
    )
    decoding: Literal["auto", "eager", "cuda-graphs", "buckets"] = opt(
        "auto",
        "how decoding steps run (never what is sampled): auto is cuda-graphs on a CUDA device and eager elsewhere; "
        "buckets drops finished rows as cuda-graphs does, without capture (docs/performance.md)",
    )
    missing_eos_score: float = opt(
        -1.0, "score of a response without EOS (the EOS trick)", "Detail 23", minimum=-math.inf
    )
    eos_trick: bool = opt(True, "replace the score of responses without EOS by missing_eos_score", "Detail 23")
    reward_length_penalty: float = opt(
        0.0, "subtract this x response tokens from each reward-model score (a length-penalised reward)", minimum=0.0
    )
    kl_coef: float = opt(0.05, "KL penalty coefficient beta of equation 3", "Table 7")
    kl_estimator: Literal["k1", "k2", "k3"] = opt(
        "k1", "per-token KL estimator in the penalty (k1: log ratio, the paper's)", "Equation 3"
    )
    adaptive_kl: bool = opt(False, "adapt kl_coef toward kl_target (Ziegler et al. 2019)")
    kl_target: float = opt(6.0, "target KL (sum over tokens) of the adaptive controller", minimum=1e-9)
    kl_horizon: float = opt(10000.0, "horizon in episodes of the adaptive controller", minimum=1)
    whiten_rewards: bool = opt(
        False, "whiten the per-token rewards of each rollout batch, keeping their mean", "Detail 24"
    )
    whiten_advantages: bool = opt(True, "whiten the advantages over valid tokens", "Detail 25")
    gamma: float = opt(
        1.0,
        "discount factor of the per-token returns (PPO's GAE, REINFORCE++, ReMax; not the grouped "
        "estimators, which read the sequence's score)",
        "Table 7",
    )
    lam: float = opt(0.95, "GAE lambda (PPO's value-model advantages only)", "Table 7")
    clip_range: float = opt(
        0.2, "policy ratio clipping epsilon, below (and above unless clip_range_high is set; 0: no clipping)", "Table 7"
    )
    clip_range_high: float = opt(
        0.0,
        "upper clipping epsilon: the ratio is kept within [1 - clip_range, 1 + clip_range_high] (0: "
        "clip_range; DAPO's clip-higher: 0.28)",
    )
    dual_clip: float = opt(
        0.0,
        "dual clip c > 1: the loss of a token with a negative advantage is at most -c x advantage, however large "
        "its ratio (Ye et al. 2020: 3; 0: off)",
    )
    policy_loss: Literal["ppo-clip", "gspo", "gspo-token", "cispo"] = opt(
        "ppo-clip",
        "policy loss (docs/algorithms.md): ppo-clip (token ratios), gspo (one length-normalised ratio per sequence), "
        "gspo-token (its per-token-advantage variant), cispo (REINFORCE weighted by the clipped, detached token ratio)",
    )
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = opt(
        "token-mean",
        "a minibatch's loss from its tokens' losses: the mean over all its tokens (DAPO), the mean over sequences of "
        "each one's token mean (GRPO, GSPO), or the mean over sequences of each one's token sum / loss_normaliser (Dr. "
        "GRPO); "
        "normalisers are counted over the whole minibatch, so the split into micro-batches and processes never changes "
        "the update",
    )
    loss_normaliser: float = opt(
        0.0, "seq-mean-token-sum-norm's constant divisor of each sequence's token sum (0: max_response_length)"
    )
    dynamic_sampling: bool = opt(
        False,
        "DAPO: drop the groups whose scores do not differ (all their advantages are 0) and refill the "
        "update from the prompt stream",
    )
    dynamic_sampling_min_spread: float = opt(
        0.0,
        "a group is dropped when the max - min of its scores is at or below this (0: only "
        "identical scores, as with verifiable rewards; reward-model scores never tie exactly, "
        "so give them a spread in the score's units)",
    )
    dynamic_sampling_max_draws: int = opt(
        4,
        "draws of prompts per update at most; past it the update is filled with dropped groups, "
        "counted in sampling/filled_groups (DAPO's max_num_gen_batches)",
        minimum=1,
    )
    overlong_buffer: int = opt(
        0,
        "DAPO's soft overlong punishment: responses longer than max_response_length - overlong_buffer "
        "tokens lose up to overlong_penalty, linearly (0: off)",
    )
    overlong_penalty: float = opt(1.0, "the overlong punishment at max_response_length", minimum=0.0)
    mask_truncated: bool = opt(
        False,
        "DAPO's overlong filtering: responses cut at max_response_length without EOS take no part in "
        "the loss (their scores still count in their group's baseline)",
    )
    frozen_device: str = opt(
        "", "device of the frozen reference and reward models (empty: the policy's; e.g. cpu, cuda:1)"
    )
    kl_placement: Literal["reward", "loss"] = opt(
        "reward",
        "where the KL to the reference enters: a per-token penalty in the reward (equation 3) or a term of the loss "
        "(GRPO)",
        "Equation 3",
    )
    entropy_coef: float = opt(0.0, "entropy bonus coefficient in the policy loss (seed 002's PPO: 0.01)")
    teacher: str = opt(
        "",
        "on-policy distillation (docs/distillation.md): a frozen teacher scores every token the student samples, "
        "a model/ folder, embedded name or hub id of the student's tokenizer, or self: the student's own starting "
        "weights reading teacher_hint (empty: no teacher)",
    )
    distill_loss: Literal["reverse-kl-advantage", "jsd", "topk-forward-kl"] = opt(
        "reverse-kl-advantage",
        "what the student learns of the teacher: reverse-kl-advantage, each sampled token's -distill_coef x (log "
        "pi_student - log pi_teacher) as its advantage through the policy loss (tinker, prime-rl, verl); jsd, the "
        "generalized JSD over the whole next-token distribution (TRL); topk-forward-kl, the forward KL over the "
        "teacher's distill_top_k tokens and a tail bucket (verl)",
    )
    distill_coef: float = opt(
        1.0, "the teacher's weight: of its per-token advantage, or of its loss beside the policy loss", minimum=0.0
    )
    distill_discount: float = opt(
        0.0,
        "reverse-kl-advantage: a token's advantage also sums the later tokens' signals with this discount (0: its "
        "own alone, as tinker's recipe)",
        minimum=0.0,
    )
    distill_beta: float = opt(
        0.5, "jsd: the interpolation beta (0: forward KL(teacher || student), 1: reverse KL(student || teacher))",
        minimum=0.0,
    )
    distill_top_k: int = opt(64, "topk-forward-kl: the teacher's most likely tokens compared one by one", minimum=1)
    teacher_temperature: float = opt(
        0.0,
        "the temperature of the teacher's log-probabilities (0: the sampling temperature); another one is refused "
        "unless teacher_temperature_differs=true",
        minimum=0.0,
    )
    teacher_temperature_differs: bool = opt(
        False, "allow a teacher_temperature that differs from the sampling temperature (the student's)"
    )
    teacher_hint: str = opt(
        "",
        "self-distillation (teacher=self): what the teacher reads beside the prompt, a template over the prompt's "
        "columns such as 'The answer is {answer}.' (added to the last user turn, or after a plain-text prompt)",
    )
    environment: str = opt(
        "",
        "multi-turn episodes (docs/environments.md): the environment that answers the policy's turns, a built-in "
        "(gsm8k-calculator, hh-dialogue) or a class as module:Class or file.py:Class; max_response_length is then "
        "each episode's token budget, the policy's and the environment's tokens together (empty: single responses)",
    )
    environment_args: dict[str, Any] = environment_args_opt()
    environment_timeout: float = environment_timeout_opt()
    max_turns: int = max_turns_opt()
    check_tokens: bool = check_tokens_opt()
    sample_every: int = opt(10, "log the highest- and lowest-scored samples every N updates (0: never)")
    log_samples: int = opt(2, "samples logged at each end (highest and lowest scored)", minimum=1)

    @property
    def sharding_options(self) -> ShardingOptions:
        return dataclasses.replace(super().sharding_options, frozen_device=self.frozen_device)

    @property
    def episode_options(self) -> EpisodeOptions:
        return EpisodeOptions(
            self.environment, self.environment_args, self.max_turns, self.environment_timeout, self.check_tokens,
            self.seed,
        )

    @property
    def reward_shaping(self) -> RewardShaping:
        return RewardShaping(
            self.reward_length_penalty, self.eos_trick, self.missing_eos_score, self.max_response_length,
            self.overlong_buffer, self.overlong_penalty,
        )

    @property
    def advantage_options(self) -> AdvantageOptions:
        return AdvantageOptions(
            self.advantage_estimator, self.samples_per_prompt, self.kl_estimator, self.kl_placement,
            self.whiten_rewards, self.whiten_advantages, self.gamma, self.lam, False, self.reward_shaping,
            self.distill_options,
        )

    @property
    def rollout_options(self) -> RolloutOptions:
        return RolloutOptions(
            self.seed, self.samples_per_prompt, self.total_batch_size // self.samples_per_prompt,
            self.advantage_estimator, self.max_response_length, self.temperature, self.eval_temperature,
            self.decoding, self.generation_batch_size, self.forward_batch_size, self.dynamic_sampling,
            self.dynamic_sampling_min_spread, self.dynamic_sampling_max_draws, self.reward_shaping,
        )

    @property
    def reward_options(self) -> RewardOptions:
        return RewardOptions(
            self.reward_functions, self.reward_weights, self.reward_model, self.environment, self.environment_args,
            self.reward_errors, self.reward_error_score, self.reward_timeout, self.max_reward_error_fraction,
            self.stop_on_reward_error, self.eos_trick, bool(self.teacher),
        )

    @property
    def prompt_split(self) -> PromptSplit:
        return PromptSplit(
            self.data, self.prompt_format, self.hf_split, self.fields, self.max_query_length, self.validation_posts,
            self.seed, self.episode_options,
        )

    @property
    def value_options(self) -> ValueOptions | None:
        """The critic's options; None for an algorithm without one."""
        return None

    @property
    def distill_options(self) -> DistillOptions | None:
        """The teacher and what the student learns of it; None without a teacher."""
        if not self.teacher:
            return None
        return DistillOptions(
            self.teacher, self.distill_loss, self.distill_coef, self.distill_discount, self.distill_beta,
            self.distill_top_k, self.teacher_temperature or self.temperature, self.teacher_hint,
        )


@dataclass
class PPOConfig(OnPolicyConfig):
    advantage_estimator: str = opt(
        "gae",
        "advantage estimator registered for this stage in onpolicy/advantages.py; default: GAE over per-token rewards "
        "with the value model",
        "Section 7",
    )
    value_model: str = opt("", "value model folder (empty: initialise it from the reward model)", "Detail 22")
    vf_coef: float = opt(0.1, "value loss coefficient c1", "Table 7")
    value_clip_range: float = opt(0.2, "value clipping epsilon (0: no value loss clipping)", "Table 7")

    @property
    def value_options(self) -> ValueOptions:
        return ValueOptions(self.value_model, self.vf_coef, self.value_clip_range)


@dataclass
class GRPOConfig(OnPolicyConfig):
    """GRPO (Shao et al. 2024): G samples per prompt, group-normalised advantages, no value model."""

    samples_per_prompt: int = opt(
        4, "G: responses sampled per prompt; the prompt is encoded once per group", "seed 002", minimum=2
    )
    advantage_estimator: str = opt(
        "grpo",
        "advantage estimator registered for this stage in onpolicy/advantages.py; "
        "default: the group's mean as baseline",
    )
    scale_rewards: bool = opt(True, "divide by the group's standard deviation (false: Dr. GRPO, mean-centred only)")
    kl_placement: Literal["reward", "loss"] = opt(
        "loss",
        "where the KL to the reference enters: a term of the loss (GRPO) or a per-token penalty in the reward",
        "Equation 3",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = opt("k3", "per-token KL estimator (k3: GRPO's, never negative)")
    whiten_advantages: bool = opt(False, "also whiten the advantages over the whole batch", "Detail 25")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = opt(
        "seq-mean-token-mean",
        "a minibatch's loss from its tokens' losses: the mean over sequences of each one's token mean (GRPO), "
        "the mean over all tokens (DAPO), or over sequences of each one's token sum / loss_normaliser (Dr. GRPO); "
        "normalisers are "
        "counted over the whole minibatch, so the split into micro-batches and processes never changes the update",
    )

    @property
    def advantage_options(self) -> AdvantageOptions:
        return dataclasses.replace(super().advantage_options, scale_rewards=self.scale_rewards)


@dataclass
class RLOOConfig(OnPolicyConfig):
    """RLOO (Ahmadian et al. 2024): k samples per prompt, each baselined by the mean of the others."""

    samples_per_prompt: int = opt(4, "k: responses sampled per prompt; the prompt is encoded once per group", minimum=2)
    advantage_estimator: str = opt(
        "rloo",
        "advantage estimator registered for this stage in onpolicy/advantages.py; default: the mean of the other "
        "samples as baseline",
    )
    whiten_advantages: bool = opt(False, "also whiten the advantages over the whole batch", "Detail 25")


@dataclass
class ReinforceConfig(OnPolicyConfig):
    """REINFORCE-style methods without a value model: REINFORCE++ (one sample, global normalisation),
    REINFORCE++-baseline (a group's mean, then global normalisation) and ReMax (a greedy baseline)."""

    samples_per_prompt: int = opt(1, "responses sampled per prompt (reinforce-pp-baseline needs 2 or more)", minimum=1)
    advantage_estimator: str = opt(
        "reinforce-pp",
        "reinforce-pp: each token's return, normalised over the whole batch (Hu et al. 2025); reinforce-pp-baseline: "
        "the score minus its group's mean, normalised over the whole batch; remax: the return minus the score of the "
        "prompt's "
        "greedy response (Li et al. 2023)",
    )
    whiten_advantages: bool = opt(
        False, "also whiten the advantages over the whole batch (REINFORCE++ normalises them already)", "Detail 25"
    )


@dataclass
class DistillConfig(OnPolicyConfig):
    """On-policy distillation (docs/distillation.md): the student samples, a frozen teacher scores each of its
    tokens, and the update learns the teacher's signal alone (a task reward mixes in through grpo, rloo, reinforce
    or ppo with teacher=)."""

    teacher: str = opt(
        "",
        "the frozen teacher (required): a model/ folder, embedded name or hub id with the student's tokenizer, or "
        "self: the student's own starting weights reading teacher_hint",
    )
    advantage_estimator: str = opt(
        "teacher",
        "teacher: no task reward, every advantage is the teacher's (the one estimator of this command)",
    )
    samples_per_prompt: int = opt(1, "responses sampled per prompt (the teacher grades tokens, not a group)", minimum=1)
    kl_coef: float = opt(0.0, "KL penalty to the student's own starting weights (the teacher anchors the student)")
    eos_trick: bool = opt(False, "no score to replace: the teacher's per-token signal is the objective", "Detail 23")
    whiten_advantages: bool = opt(False, "whiten the teacher's advantages over the batch's tokens", "Detail 25")
    update_epochs: int = opt(1, "passes over each rollout batch (one: strictly on-policy)", "Table 7 (K)", minimum=1)
    eval_samples: int = opt(0, "held-out prompts answered by the starting and trained students at the end (0: none)")
