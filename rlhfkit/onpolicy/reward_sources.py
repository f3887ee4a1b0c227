"""The reward sources of an on-policy run (reward functions, an environment's reward, a reward model) and
what each update's rollout is checked against and logs of them (rlhfkit/onpolicy/scoring.py scores with
them; rlhfkit/rewards.py holds the reward-function contract).

    components = [f_1, ..., f_n, environment, reward model]   NaN where a function did not score the row
    raw score  = sum_c reward_weights[c] * components[c], over the components that scored the row; NaN
                 (the row is dropped from the update) where none did, or where a function failed on it
                 under reward_errors=skip
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import RewardOptions
from ..data.examples import SFTExample, reward_prompt
from ..environments import check_environment
from ..errors import ConfigError, warn
from ..rewards import Prompt, RewardError, RewardFunctions, RowLogs
from ..rollout import RolloutBatch

REPORTED_ERRORS = 5  # per scoring call: the rest are counted, not printed
EOS_OVERRIDE_WARNING = 0.5  # the share of scored rows past which the EOS trick is said to decide the rewards
RowKey = tuple[int, tuple[int, ...]]  # a rollout row: its prompt and its response's tokens


@dataclass
class PromptTexts:
    """What reward functions read about each prompt: the prompt (`reward_prompt`), dataset columns and source."""

    prompts: list[Prompt]
    columns: list[dict]
    where: list[str]

    @classmethod
    def of(cls, examples: list[SFTExample]) -> PromptTexts:
        return cls(
            [reward_prompt(e) for e in examples],
            [e.record.columns for e in examples],
            [e.record.where for e in examples],
        )


def rollout_columns(batch: RolloutBatch, max_length: int) -> dict[str, Any]:
    """The arguments every reward-function call is given about the sampled responses (rewards.ROLLOUT_COLUMNS).
    `completion_ids` holds each response's tokens up to its EOS, EOS included, as TRL's trainers pass them."""
    lengths = batch.lengths.tolist()
    responses = batch.responses.cpu()
    return {
        "completion_ids": [responses[i, :n].tolist() for i, n in enumerate(lengths)],
        "completion_lengths": lengths,
        "has_eos": batch.has_eos.tolist(),
        "max_completion_length": max_length,
    }


def row_keys(batch: RolloutBatch) -> list[RowKey]:
    """Each row's prompt and response tokens: what finds a row's logged columns (`log_extra`) however the
    rollout's rows were gathered, selected or reordered after scoring."""
    prompts, lengths, responses = batch.prompts.tolist(), batch.lengths.tolist(), batch.responses.cpu()
    return [(p, tuple(responses[i, :n].tolist())) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]


def unscored(components: torch.Tensor, failed: torch.Tensor | None) -> torch.Tensor:
    """(B,) the rows dropped from the update: no component scored them (every one NaN: each function returned
    None), or a function failed on them and left no value (reward_errors=skip). `failed`: (B, F) the functions'."""
    missing = components.isnan()
    if not components.size(1):  # a distillation teacher's run without a task reward: the teacher scores every row
        return torch.zeros(components.size(0), dtype=torch.bool, device=components.device)
    if failed is None or not failed.numel():
        return missing.all(dim=1)
    return missing.all(dim=1) | (missing[:, : failed.size(1)] & failed).any(dim=1)


@dataclass
class UpdateLogs:
    """What reward functions logged through TRL's hooks during an update's scoring, over every process:
    `log_metric` values by `<function>/<name>`, `log_extra` columns by row (`row_keys`)."""

    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    extra: dict[RowKey, dict[str, Any]] = field(default_factory=dict)

    def add(self, keys: list[RowKey], logs: RowLogs) -> None:
        for name, values in logs.metrics.items():
            self.metrics[name] += values
        for column, values in logs.extra.items():
            for key, value in zip(keys, values, strict=True):
                self.extra.setdefault(key, {})[column] = value

    def merge(self, other: UpdateLogs) -> None:
        for name, values in other.metrics.items():
            self.metrics[name] += values
        for key, columns in other.extra.items():
            self.extra.setdefault(key, {}).update(columns)


def gathered(logs: UpdateLogs, accelerator) -> list[UpdateLogs]:
    """Every process's `logs`, in process order (one collective; processes may have logged different names)."""
    if accelerator.num_processes == 1:
        return [logs]
    found: list[Any] = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(found, logs)
    return found


@dataclass
class RewardSources:
    """The configured reward functions, whether a reward model scores too, and each component's weight."""

    functions: RewardFunctions
    has_model: bool
    weights: list[float]
    # by function: what went wrong on its last failed row
    last_problem: dict[str, str] = field(default_factory=dict)
    has_environment: bool = False  # the episodes' environment rewards their ends (`Environment.has_reward`)
    max_error_fraction: float = 1.0  # max_reward_error_fraction
    eos_trick: bool = False  # the run replaces the scores of responses without EOS (Detail 23)
    warned: set[str] = field(default_factory=set)  # the once-per-run warnings given
    local_logs: UpdateLogs = field(default_factory=UpdateLogs)  # this process's, of the update's rollout so far
    update_logs: UpdateLogs = field(default_factory=UpdateLogs)  # every process's, gathered by `check_update`
    extra: dict[RowKey, dict[str, Any]] = field(default_factory=dict)  # the last update's `log_extra` columns
    # the last `function_scores` call's row keys and logs
    last_call: tuple[list[RowKey], RowLogs] = field(default_factory=lambda: ([], RowLogs(0)))

    @classmethod
    def of(cls, options: RewardOptions) -> RewardSources:
        """The run's reward functions, environment and reward model, refusing options that cannot work."""
        environment = check_environment(options.environment, options.environment_args)
        has_environment = environment is not None and environment.has_reward
        if not options.functions and not options.reward_model and not has_environment and not options.teacher:
            raise ConfigError(
                "nothing to optimise: give reward_model= (a reward model folder) and/or "
                "reward_functions= "
                "(e.g. gsm8k,format; see rlhfkit/rewards.py), or a teacher= to distil from"
            )
        if options.stop_on_error:
            raise ConfigError("stop_on_reward_error=true was replaced by reward_errors=stop: set that instead")
        functions = RewardFunctions.from_specs(options.functions, options.errors, options.error_score, options.timeout)
        sources = cls(functions, bool(options.reward_model), [], has_environment=has_environment,
                      max_error_fraction=options.max_error_fraction, eos_trick=options.eos_trick)
        count = len(sources.names)
        sources.weights = list(options.weights) or [1.0] * count
        if len(sources.weights) != count:
            raise ConfigError(
                f"reward_weights has {len(sources.weights)} values for {count} rewards ({', '.join(sources.names)}): "
                "give one per reward function, then one for the environment when it rewards episodes, then one "
                "for the reward model"
            )
        return sources

    @classmethod
    def model_only(cls) -> RewardSources:
        return cls(RewardFunctions([], []), True, [1.0])

    @property
    def names(self) -> list[str]:
        """The components in their order: the functions', the environment's, the reward model's."""
        return self.functions.names + ["environment"] * self.has_environment + ["reward_model"] * self.has_model

    def function_scores(
        self, prompts: PromptTexts, batch: RolloutBatch, completions: list[str], max_length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, F) values, NaN where a function scored no value, (B, F) bool: the row failed) of the reward
        functions on the `completions` of `batch`, whose `prompts` index `prompts`; failures are printed (the
        first few) and flagged for counting, what the functions logged kept as `last_call`."""
        rows = batch.prompts.tolist()
        keys = set().union(*(prompts.columns[i] for i in rows))
        columns = {key: [prompts.columns[i].get(key) for i in rows] for key in keys}
        columns |= rollout_columns(batch, max_length)
        where = [prompts.where[i] for i in rows]
        scored = self.functions.score([prompts.prompts[i] for i in rows], completions, columns, where)
        scores = torch.tensor(scored, dtype=torch.float32).reshape(len(self.functions), len(rows)).T
        failed = torch.zeros_like(scores, dtype=torch.bool)
        errors = self.functions.take_errors()
        for error in errors:
            failed[error.row, self.functions.names.index(error.function)] = True
            self.last_problem[error.function] = error.problem
        report_errors(errors)
        self.last_call = (row_keys(batch), self.functions.logs)
        return scores, failed

    def keep_logs(self) -> None:
        """Count the last call's logs (`last_call`) as the update's: a training rollout's, not an evaluation's."""
        self.local_logs.add(*self.last_call)

    def check_prompts(self, prompts: PromptTexts) -> None:
        """Refuse, before training, prompts that lack a column a reward function needs."""
        self.functions.check_columns(prompts.columns, prompts.where)

    def check_update(self, batch: RolloutBatch, update: int, accelerator) -> None:
        """On a draw of update `update`'s whole rollout, alike on every process: gather what the functions
        logged; stop where a function failed on every row or on more than max_reward_error_fraction of them;
        warn, once each, where rows are dropped and where the EOS trick decides most rewards of the functions."""
        for logs in gathered(self.local_logs, accelerator):
            self.update_logs.merge(logs)
        self.local_logs = UpdateLogs()
        if bool(batch.reward_components[:, len(self.functions) :].isnan().any()):  # NaN means "not scored" only
            raise ConfigError(f"the {' or '.join(self.names[len(self.functions) :])} scored NaN in update {update}")
        if batch.reward_failures is not None and batch.reward_failures.numel():
            self.stop_if_failed(batch.reward_failures, update)
        dropped = unscored(batch.reward_components, batch.reward_failures)
        if bool(dropped.any()) and "dropped" not in self.warned:
            self.warned.add("dropped")
            warn(
                f"{int(dropped.sum())} of the {batch.size} rows of update {update} have no reward (every function "
                "returned None for them, or one failed on them under reward_errors=skip): they are dropped from the "
                "update and counted in reward/dropped_rows (warned once)"
            )
        self.warn_if_eos_trick_decides(batch, ~dropped, update)

    def stop_if_failed(self, failed: torch.Tensor, update: int) -> None:
        """Stop, in one line, at an update where a function failed on every row of the (B, F) `failed` (its
        scores would all be reward_error_score, or every row dropped), or on more than max_error_fraction."""
        for name, share in zip(self.functions.names, failed.float().mean(dim=0).tolist(), strict=True):
            last = self.last_problem.get(name, "see the warnings above")
            if share == 1.0:
                raise ConfigError(
                    f"reward function {name!r} failed on all {failed.size(0)} rows of update {update} (the last: "
                    f"{last}): the run would learn nothing from it: fix the function, then run again"
                )
            if share > self.max_error_fraction:
                raise ConfigError(
                    f"reward function {name!r} failed on {share:.0%} of the {failed.size(0)} rows of update "
                    f"{update}, more than max_reward_error_fraction={self.max_error_fraction:g} (the last: {last}): "
                    "fix the function, or raise max_reward_error_fraction"
                )

    def warn_if_eos_trick_decides(self, batch: RolloutBatch, scored: torch.Tensor, update: int) -> None:
        """Warn, once per run, where the EOS trick (Detail 23) replaced the reward functions' values of more than
        half of an update's scored rows: without a reward model, whose score of an unfinished response is
        what the trick is for, the policy then learns from missing_eos_score instead of from the functions."""
        if not self.eos_trick or self.has_model or not len(self.functions) or "eos_trick" in self.warned:
            return
        replaced = int((scored & ~batch.has_eos.to(scored.device)).sum())
        if replaced > EOS_OVERRIDE_WARNING * int(scored.sum()):
            self.warned.add("eos_trick")
            warn(
                f"the EOS trick (Detail 23, eos_trick=true) replaced the reward functions' values of {replaced} of "
                f"{int(scored.sum())} rows of update {update} (responses without EOS) by missing_eos_score: the "
                "policy learns from that constant, not from the functions; set eos_trick=false, or raise "
                "max_response_length (warned once; the report says it too)"
            )

    def take_update_logs(self) -> dict[str, float]:
        """The update's `log_metric` means, as `reward/<function>/<name>`; its `log_extra` columns become
        `extra`, for the update's logged samples."""
        logs, self.update_logs = self.update_logs, UpdateLogs()
        self.extra = logs.extra
        return {f"reward/{name}": sum(values) / len(values) for name, values in logs.metrics.items() if values}

    def combine(self, components: torch.Tensor, failed: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) the weighted sum of the (B, C) components that scored each row; NaN for a row dropped
        (`unscored`; `failed`, (B, F): the rows the functions failed on)."""
        weights = torch.tensor(self.weights, dtype=components.dtype, device=components.device)
        total = torch.nan_to_num(components, nan=0.0) @ weights
        return total.masked_fill(unscored(components, failed), math.nan)


def report_errors(errors: list[RewardError]) -> None:
    for error in errors[:REPORTED_ERRORS]:
        warn(error.line())
    if len(errors) > REPORTED_ERRORS:
        warn(
            f"{len(errors) - REPORTED_ERRORS} more reward-function failures in this batch (counted in "
            "rewards/<name>_errors)"
        )


def component_metrics(
    names: list[str], components: torch.Tensor, failed: torch.Tensor | None, prefix: str = "rewards/"
) -> dict[str, float]:
    """The mean of each component over the rows it scored (none: not logged) and, for reward functions, the
    rows each failed on (`<name>_errors`, and as `reward/<name>/error_fraction`), the share it did not score
    (`reward/<name>/none_fraction`) and the rows dropped from the update (`reward/dropped_rows`)."""
    metrics = {
        f"{prefix}{name}": float(components[:, c].nanmean())
        for c, name in enumerate(names)
        if not bool(components[:, c].isnan().all())
    }
    if failed is None:
        return metrics
    for c, name in enumerate(names[: failed.size(1)]):
        metrics[f"{prefix}{name}_errors"] = float(failed[:, c].sum())
        metrics[f"reward/{name}/error_fraction"] = float(failed[:, c].float().mean())
        metrics[f"reward/{name}/none_fraction"] = float((components[:, c].isnan() & ~failed[:, c]).float().mean())
    metrics["reward/dropped_rows"] = float(unscored(components, failed).sum())
    return metrics
