"""`rlhfkit ppo`, `rlhfkit grpo`, `rlhfkit rloo`, `rlhfkit reinforce`, `rlhfkit distill`: one on-policy stage, run by
the loop driver on one or N data-parallel processes (Section 7, Details 20-25, Table 7).

The policy and the frozen reference both start from the SFT model; the reward model is frozen; an
algorithm with a critic (PPO) trains a value model that starts from the reward model (Detail 22).
One update, in phases, each in its own module: draw the next prompts (Detail 21), each process
samples and scores its share, and the whole rollout is gathered (`collect`, `scoring`), so that
rewards, advantages, whitening, group baselines (`advantages`), the adaptive KL controller and the
logged means (`evaluation`) are those of the whole batch; then each process trains on its rows of
every minibatch and the gradients are summed across processes (`update`). Every process holds the
same weights throughout; process 0 writes checkpoints, metrics, samples and the report.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..adapters import add_adapter, frozen_reference, save_final_model, trained_policy
from ..checkpoint import load_training_state, save_checkpoint
from ..config import OnPolicyConfig, check_update_split
from ..data import PROMPTS, resolved_format
from ..data.examples import SFTExample
from ..environments import episode_plan
from ..errors import ConfigError
from ..models import enable_activation_checkpointing
from ..ops import adaptive_kl_coef
from ..policy_losses import ClipRange
from ..preemption import Interrupted, resume_command
from ..reward_models import ScalarModel, load_reward_model
from ..sharding import ShardedRun, shard_on_policy
from ..tracking import append_jsonl, drop_rows_after, write_jsonl
from ..trainers.loop import Show, run_loop
from ..trainers.run import (
    accelerator_for,
    attention_implementation,
    autocast_precision,
    build_optimizer,
    record_settings,
    start_run,
)
from .advantages import compute_advantages, with_old_logprobs
from .algorithms import Algorithm, algorithm_of
from .collect import PromptStream, RolloutSetup, collect
from .distillation import distill_metrics, hinted_queries, load_teacher
from .episodes import environment_metrics
from .evaluation import (
    ReportedRun,
    compare_policies,
    policy_summary,
    split_posts,
    summarise_and_score,
    write_onpolicy_report,
)
from .loading import check_same_tokenizer, load_value_model, require_folder
from .rollout_stats import SAMPLES_FILE, extreme_samples, rollout_metrics, speeds
from .scoring import (
    OnPolicyModels,
    PromptTexts,
    RewardSources,
    RowLayout,
    ScoringPlan,
    component_metrics,
    whole_groups,
)
from .update import (
    Minibatches,
    Objective,
    Optimizers,
    UpdatePlan,
    optimizer_states,
    saved_optimizer_states,
    update_on_rollout,
)


def load_models(cfg: OnPolicyConfig, checkpoint: Path | None, device: torch.device) -> OnPolicyModels:
    """Policy (from the checkpoint when resuming), frozen reference (always the SFT model), frozen
    reward model when one is given, the reward functions, the value model when the algorithm has
    one (Detail 22: from the reward model unless value_model is given), and the frozen distillation teacher
    when one is given."""
    require_folder(cfg.model, "model", "give the SFT policy (the model/ folder written by `rlhfkit sft`)")
    if algorithm_of(type(cfg)).needs_teacher and not cfg.teacher:
        raise ConfigError(f"{algorithm_of(type(cfg)).name} needs teacher=: a model/ folder, embedded name or hub id "
                          "with the student's tokenizer (or teacher=self with teacher_hint=)")
    sources = RewardSources.of(cfg.reward_options)
    options = cfg.value_options
    value_source = options.source or cfg.reward_model if options is not None else ""
    if options is not None and not value_source:
        raise ConfigError(
            f"{algorithm_of(type(cfg)).name} trains a value model, which starts from the reward model (Detail 22): "
            "give reward_model= or value_model="
        )
    frozen = torch.device(cfg.frozen_device) if cfg.frozen_device else device
    policy, tokenizer = trained_policy(cfg.model_source, cfg.lora, checkpoint)
    reference = frozen_reference(cfg.model_source, policy, cfg.model)
    reward = None
    if cfg.reward_model:
        require_folder(
            cfg.reward_model,
            "reward_model",
            "give the model/ folder written by `rlhfkit rm`, or a sequence-classification model",
        )
        reward, reward_tok = load_reward_model(cfg.reward_model, cfg.trust_remote_code)
        check_same_tokenizer(tokenizer, reward_tok, cfg.model, f"the reward model ({cfg.reward_model})")
        reward = reward.to(frozen)
    value = trained_value_model(cfg, value_source, checkpoint, tokenizer).to(device) if options is not None else None
    reference = reference.to(frozen)
    distill = cfg.distill_options
    teacher = load_teacher(distill, tokenizer, cfg.model_source, reference, frozen) if distill is not None else None
    return OnPolicyModels(
        policy.to(device), reference, reward, value, tokenizer, sources, episode_plan(cfg.episode_options), teacher
    )


def trained_value_model(cfg: OnPolicyConfig, source: str, checkpoint: Path | None, tokenizer) -> ScalarModel:
    """The value model to train: `source`, or the checkpoint's `value/` when resuming; with LoRA,
    `source` with a fresh adapter, or with the checkpoint's adapter and head loaded over it."""
    if not cfg.lora.enabled:
        return load_value_model(
            str(checkpoint / "value") if checkpoint else source, tokenizer, cfg.model, cfg.trust_remote_code
        )
    value = load_value_model(source, tokenizer, cfg.model, cfg.trust_remote_code)
    return add_adapter(value, cfg.lora, checkpoint / "value" if checkpoint else None)


def prepare_for_training(models: OnPolicyModels, cfg: OnPolicyConfig) -> None:
    for frozen in models.frozen():
        frozen.eval().requires_grad_(False)
    for trained in models.trained():
        trained.train()
        if cfg.gradient_checkpointing:
            if isinstance(trained, ScalarModel):
                trained.activation_checkpointing_enable()
            else:
                enable_activation_checkpointing(trained)


@dataclass
class OnPolicySteps:
    """An on-policy stage's updates, as the loop driver runs them."""

    algorithm: Algorithm
    cfg: OnPolicyConfig
    run_dir: Path
    setup: RolloutSetup  # the models, prompts and their texts, scoring, precision and processes
    plan: UpdatePlan
    optimizers: Optimizers
    held_out: list[SFTExample]  # prompts never trained on, summarised by the evaluations
    total: int
    kl_coef: float
    sharded: dict[str, ShardedRun] = dataclasses.field(default_factory=dict)  # "policy", "value": sharding=fsdp2
    stream: PromptStream = dataclasses.field(default_factory=PromptStream)  # how far the prompt stream has been read
    unit: str = "update"
    comparison: tuple[dict[str, float], list[dict]] = ({}, [])  # the final evaluation's metrics and rows

    @property
    def name(self) -> str:
        return self.algorithm.name

    @property
    def models(self) -> OnPolicyModels:
        return self.setup.models

    @property
    def accelerator(self) -> Any:
        return self.setup.accelerator

    def step(self, index: int, show: Show) -> dict[str, float]:
        """One update: collect (sample and score) the rollout, its advantages, the update on it."""
        began = time.perf_counter()
        timings: dict[str, float] = {}
        metrics: dict[str, float] = {}
        drawn = self.stream.position
        try:
            batch = collect(self.setup, index, timings, show, self.stream, metrics)
        except Interrupted:
            # in a reward function: the update is dropped, so its checkpoint must not count its draws
            self.stream.position = drawn
            raise
        batch = compute_advantages(batch, self.cfg.advantage_options, self.kl_coef, self.plan.old_logprobs)
        sources = self.models.reward_sources()
        metrics |= component_metrics(sources.names, batch.reward_components, batch.reward_failures)
        metrics |= sources.take_update_logs()  # what the reward functions logged (`log_metric`, `log_extra`)
        metrics |= environment_metrics(batch)
        show("updating")
        tick = time.perf_counter()
        result = update_on_rollout(
            models=self.models, optimizers=self.optimizers, batch=batch, plan=self.plan, update=index + 1,
            kl_coef=self.kl_coef, accelerator=self.accelerator,
        )
        timings["update"] = time.perf_counter() - tick
        if self.plan.old_logprobs == "update":
            batch = with_old_logprobs(batch, result.old_logprobs, self.plan.kl_estimator)
        metrics |= result.metrics | rollout_metrics(batch, self.kl_coef)
        if self.models.teacher is not None:  # rows the teacher read on this process, over the rows it sampled
            reads = self.models.teacher.take_rows_scored() * self.accelerator.num_processes / batch.size
            metrics |= distill_metrics(batch, reads)
        metrics["train/lr"] = self.optimizers.policy_schedule.get_last_lr()[0]
        self.optimizers.advance_schedules()
        if self.cfg.adaptive_kl:  # from the whole batch's KL: every process moves the coefficient alike
            self.kl_coef = adaptive_kl_coef(
                self.kl_coef, metrics["objective/kl"], self.cfg.kl_target, self.cfg.kl_horizon, batch.size
            )
        done = index + 1
        metrics |= speeds(timings, time.perf_counter() - began, batch) | {"episodes": done * self.cfg.total_batch_size}
        logs_samples = self.cfg.sample_every and (done == 1 or done % self.cfg.sample_every == 0 or done == self.total)
        if logs_samples and self.accelerator.is_main_process:
            append_jsonl(
                self.run_dir / SAMPLES_FILE,
                extreme_samples(batch, self.models.tokenizer, done, self.cfg.log_samples, sources.extra),
            )
        return metrics

    def evaluates_here(self) -> bool:
        """Held-out evaluations run on process 0 (the others go on to the next update and wait for it
        there), or on every process when the models are sharded: their forward passes are collectives."""
        return bool(self.held_out) and (self.accelerator.is_main_process or bool(self.sharded))

    def evaluate(self, done: int) -> dict[str, float]:
        """Held-out prompts summarised by the current policy."""
        if not self.evaluates_here():
            return {}
        rows = summarise_and_score(
            self.models.policy, self.models, self.held_out, self.cfg.rollout_options, f"update {done}"
        )
        return policy_summary(rows, "policy") if self.accelerator.is_main_process else {}

    def trained_models(self) -> dict[str, torch.nn.Module]:
        """The policy (and value model) as saved: sharded ones gathered into process 0's copies, a
        collective every process joins."""
        if self.sharded:
            return {name: run.gather() for name, run in self.sharded.items()}
        return {"policy": self.models.policy} | ({"value": self.models.value} if self.models.value is not None else {})

    def save(self, done: int) -> None:
        self.accelerator.wait_for_everyone()
        trained = self.trained_models()
        optimizer, extra_states = saved_optimizer_states(self.optimizers, self.sharded)
        if self.accelerator.is_main_process:
            state = {
                "episodes": done * self.cfg.total_batch_size,
                "kl_coef": self.kl_coef,
                "prompts_drawn": self.stream.position,
            }
            save_checkpoint(
                self.run_dir,
                done,
                trained["policy"],
                self.models.tokenizer,
                optimizer,
                self.optimizers.policy_schedule,
                state,
                self.cfg.keep_checkpoints,
                extra_models={k: v for k, v in trained.items() if k != "policy"},
                extra_states=extra_states,
            )
        self.accelerator.wait_for_everyone()

    def finish(self) -> dict[str, float]:
        """The trained models as `save_pretrained` folders, then the final held-out evaluation: the SFT
        and trained policies compared (`comparison`), whose trained-policy numbers also end the
        periodic evaluation's curves."""
        trained = self.trained_models()
        if self.accelerator.is_main_process:
            for name, model in trained.items():
                save_final_model(model, self.models.tokenizer, self.run_dir, "model" if name == "policy" else name)
        if not self.evaluates_here():
            return {}
        self.comparison = compare_policies(self.models, self.held_out, self.cfg.rollout_options, self.name)
        if not (self.cfg.eval_every and self.accelerator.is_main_process):
            return {}
        metrics = self.comparison[0]
        own = f"eval/{self.name}_"  # the trained policy's summary, without its comparison with the SFT policy
        return {
            f"eval/policy_{k[len(own) :]}": v
            for k, v in metrics.items()
            if k.startswith(own) and not k.startswith(own + "beats_")
        }

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        shown = {
            "score": f"{metrics['objective/scores']:.3f}",
            "kl": f"{metrics['objective/kl']:.3f}",
            "len": f"{metrics['response/length_mean']:.1f}",
        }
        if "distill/reverse_kl" in metrics:  # the teacher's: per token, to the teacher
            shown["teacher_kl"] = f"{metrics['distill/reverse_kl']:.3f}"
        return shown


def build_optimizers(models: OnPolicyModels, cfg: OnPolicyConfig, num_updates: int) -> Optimizers:
    """AdamW (Table 7: eps 1e-5) for the policy and, when there is one, the value model, each with the
    learning-rate schedule stepped once per update (Table 7: linear decay to 0 over the run)."""
    policy_opt, policy_sched = build_optimizer(models.policy, cfg, num_updates)
    value_opt, value_sched = (
        build_optimizer(models.value, cfg, num_updates) if models.value is not None else (None, None)
    )
    return Optimizers(policy_opt, policy_sched, value_opt, value_sched)


def objective_of(cfg: OnPolicyConfig) -> Objective:
    """What the update minimises, as the config's options say."""
    return Objective(
        cfg.policy_loss,
        ClipRange.of(cfg.clip_range, cfg.clip_range_high),
        cfg.dual_clip,
        cfg.loss_aggregation,
        cfg.loss_normaliser or float(cfg.max_response_length),
        cfg.mask_truncated,
    )


def scoring_plan(models: OnPolicyModels, cfg: OnPolicyConfig) -> ScoringPlan:
    """How scoring reads every rollout. The update's forward gives the old log-probabilities only where they
    are those a scoring pass would give: every row's first update forward runs before any optimizer step (one
    minibatch: the first epoch's forwards all precede its one step, and later epochs reuse what they gave), and
    nothing before the update needs them (the KL enters the loss, or has no weight in the reward)."""
    rows = whole_groups(cfg.forward_batch_size, cfg.samples_per_prompt)
    kl_free_rewards = cfg.kl_placement == "loss" or (cfg.kl_coef == 0 and not cfg.adaptive_kl)
    distill = cfg.distill_options
    # the teacher's per-token advantage reads the sampling policy's log-probabilities before the update
    kl_free_rewards = kl_free_rewards and not (distill is not None and distill.per_token_advantage)
    one_pass = cfg.num_minibatches == 1
    return ScoringPlan(
        rows,
        cfg.samples_per_prompt,
        cfg.temperature,
        cfg.max_response_length,
        RowLayout.of(models, cfg.shared_prefix, cfg.samples_per_prompt, rows, "forward_batch_size"),
        "update" if cfg.reuse_update_forward and one_pass and kl_free_rewards else "scoring",
    )


def update_plan(models: OnPolicyModels, cfg: OnPolicyConfig, precision: str) -> UpdatePlan:
    """The on-policy update as the run decides it once, from the config: the layers below see the plan alone."""
    return UpdatePlan(
        objective=objective_of(cfg),
        value=cfg.value_options,
        scoring=scoring_plan(models, cfg),
        layout=RowLayout.of(
            models, cfg.shared_prefix, cfg.samples_per_prompt, cfg.micro_batch_size, "micro_batch_size"
        ),
        minibatches=Minibatches(cfg.update_epochs, cfg.num_minibatches, cfg.micro_batch_size, cfg.samples_per_prompt),
        temperature=cfg.temperature,
        kl_placement=cfg.kl_placement,
        kl_estimator=cfg.kl_estimator,
        entropy_coef=cfg.entropy_coef,
        max_grad_norm=cfg.max_grad_norm,
        seed=cfg.seed,
        precision=precision,
    )


@dataclass(frozen=True)
class Launch:
    """What a start decides once, before any model loads: the processes and the updates of the run."""

    accelerator: Any
    updates: int

    @classmethod
    def of(cls, cfg: OnPolicyConfig) -> Launch:
        """Fails when an update's batch does not split on the launch's processes, as the config was
        checked (`config.check_update_split`)."""
        accelerator = accelerator_for(cfg)
        check_update_split(cfg, accelerator.num_processes)
        return cls(accelerator, cfg.max_steps or cfg.total_episodes // cfg.total_batch_size)


def train_on_policy(
    models: OnPolicyModels,
    prompts: list[list[int]],
    cfg: OnPolicyConfig,
    run_dir: Path,
    *,
    launch: Launch,
    plan: UpdatePlan,
    checkpoint: Path | None = None,
    held_out: list[SFTExample] | None = None,
    texts: PromptTexts | None = None,
) -> OnPolicySteps:
    """Run every update of `cfg`'s algorithm on `models` as `plan` says (resuming from `checkpoint`), with
    the final checkpoint and model folders; `held_out` prompts are summarised by the evaluations, reward
    functions read `texts` of `prompts`. Returns the stage, whose `comparison` holds the final evaluation."""
    algorithm, accelerator = algorithm_of(type(cfg)), launch.accelerator
    prepare_for_training(models, cfg)
    copies = (
        shard_on_policy(models, accelerator.device, accelerator.is_main_process)
        if cfg.sharding_options.splits_models(accelerator.num_processes)
        else {}
    )
    optimizers = build_optimizers(models, cfg, launch.updates)
    sharded = {
        name: ShardedRun(model, optimizer, copies[name])
        for name, model, optimizer in (
            ("policy", models.policy, optimizers.policy),
            ("value", models.value, optimizers.value),
        )
        if name in copies
    }
    if sharded and accelerator.is_main_process:
        print(sharded["policy"].describe(accelerator.num_processes))
    kl_coef, start, drawn = cfg.kl_coef, 0, 0
    if checkpoint is not None:
        optimizer, extra_states = optimizer_states(optimizers, sharded)
        state = load_training_state(checkpoint, optimizer, optimizers.policy_schedule, extra_states)
        start, kl_coef = state["step"], state["kl_coef"]
        # without dynamic sampling every update reads one draw: all a checkpoint without the count can have read
        drawn = state.get("prompts_drawn", start * cfg.rollout_options.prompts_per_update)
    if accelerator.is_main_process:
        drop_rows_after(run_dir / SAMPLES_FILE, start)
    steps = OnPolicySteps(
        algorithm=algorithm,
        cfg=cfg,
        run_dir=run_dir,
        setup=RolloutSetup(models, prompts, cfg.rollout_options, plan.scoring, plan.precision, accelerator, texts),
        plan=plan,
        optimizers=optimizers,
        held_out=held_out or [],
        total=launch.updates,
        kl_coef=kl_coef,
        sharded=sharded,
        stream=PromptStream(drawn),
    )
    run_loop(
        steps, cfg, run_dir, start, accelerator, resume_command(algorithm.name, run_dir, accelerator.num_processes)
    )
    return steps


def model_settings(models: OnPolicyModels, plan: UpdatePlan) -> dict[str, Any]:
    """What the models resolved to, for resolved.yaml: each one's attention kernel and, for grouped
    methods, whether its scoring passes read shared rows (shared_prefix=auto falls back per model)."""
    named = {"policy": models.policy, "reference": models.reference, "value": models.value, "reward": models.reward}
    settings: dict[str, Any] = {
        "attention": {name: attention_implementation(m) for name, m in named.items() if m is not None}
    }
    if plan.scoring.group > 1:
        settings["shared_prefix"] = {
            name: "on" if getattr(plan.scoring.layout, name) else "off" for name, m in named.items() if m is not None
        }
    return settings


def run(cfg: OnPolicyConfig) -> int:
    """Load, train (resuming when asked), evaluate on held-out prompts, report."""
    name = algorithm_of(type(cfg)).name
    cfg, run_dir, checkpoint = start_run(cfg, name)
    launch = Launch.of(cfg)  # a batch that does not split fails before any model loads
    accelerator = launch.accelerator
    # sharded models load on the host and move to the device one shard at a time
    models = load_models(
        cfg,
        checkpoint,
        torch.device("cpu") if cfg.sharding_options.splits_models(accelerator.num_processes) else accelerator.device,
    )
    train, held_out, notes = split_posts(cfg.prompt_split, models.tokenizer)
    if models.teacher is not None and models.teacher.options.is_self:
        models.teacher.queries = hinted_queries(train, cfg.teacher_hint, models.tokenizer, cfg.max_query_length)
    prompt_format = resolved_format(PROMPTS, cfg.prompt_format, cfg.data, cfg.hf_split, cfg.fields)
    plan = update_plan(models, cfg, autocast_precision(cfg))
    record_settings(run_dir, {"prompt_format": prompt_format} | model_settings(models, plan))
    models.reward_sources().check_prompts(PromptTexts.of(train + held_out[: cfg.eval_samples]))
    if accelerator.is_main_process:
        print("\n".join(notes))
    steps = train_on_policy(
        models,
        [e.query.ids for e in train],
        cfg,
        run_dir,
        launch=launch,
        plan=plan,
        checkpoint=checkpoint,
        held_out=held_out[: cfg.eval_samples],
        texts=PromptTexts.of(train),
    )
    if not accelerator.is_main_process:
        return 0
    metrics, rows = steps.comparison
    write_jsonl(run_dir / "eval_samples.jsonl", rows)
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=2))
    reported = ReportedRun(name, cfg.model, cfg.total_batch_size, plan.precision, cfg.reward_options)
    report = write_onpolicy_report(run_dir, reported, notes, metrics, rows)
    print(json.dumps(metrics | {"updates": steps.total}, indent=2))
    print(f"model: {run_dir / 'model'}\nreport: {report}")
    return 0
