"""What an on-policy stage optimises: reward functions and/or a reward model, weighted and summed.

    components = [f_1(prompts, completions, **columns), ..., f_n(...), reward model at EOS]
    raw score  = sum_c reward_weights[c] * components[c]             (then the EOS trick, Detail 23)

Every component is kept on the rollout (`RolloutBatch.reward_components`) and logged on its own
(`rewards/<name>`), so a run shows what each reward bought. Rows a function failed on are counted per
function (`rewards/<name>_errors`) and reported with the prompt's source line (rlhfkit/rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import OnPolicyConfig
from ..data.examples import SFTExample
from ..errors import ConfigError, warn
from ..rewards import ROLLOUT_COLUMNS, RewardError, RewardFunctions

REWARD_MODEL = "reward_model"
REPORTED_ERRORS = 5  # per scoring call: the rest are counted, not printed


@dataclass
class PromptTexts:
    """What reward functions read about each prompt: its query text, dataset columns and source."""

    texts: list[str]
    columns: list[dict]
    where: list[str]

    @classmethod
    def of(cls, examples: list[SFTExample]) -> PromptTexts:
        return cls([e.query.text for e in examples], [e.record.columns for e in examples], [e.record.where for e in examples])


@dataclass
class RewardSources:
    """The configured reward functions, whether a reward model scores too, and each component's weight."""

    functions: RewardFunctions
    has_model: bool
    weights: list[float]
    last_problem: dict[str, str] = field(default_factory=dict)  # by function: what went wrong on its last failed row

    @classmethod
    def from_config(cls, cfg: OnPolicyConfig) -> RewardSources:
        if not cfg.reward_functions and not cfg.reward_model:
            raise ConfigError("nothing to optimise: give reward_model= (a reward model folder) and/or reward_functions= "
                              "(e.g. gsm8k,format; see rlhfkit/rewards.py)")
        functions = RewardFunctions.from_specs(cfg.reward_functions, cfg.reward_error_score, cfg.stop_on_reward_error, cfg.reward_timeout)
        count = len(functions) + bool(cfg.reward_model)
        weights = list(cfg.reward_weights) or [1.0] * count
        if len(weights) != count:
            names = ", ".join(functions.names + ([REWARD_MODEL] if cfg.reward_model else []))
            raise ConfigError(f"reward_weights has {len(weights)} values for {count} rewards ({names}): give one per reward "
                              "function, then one for the reward model")
        return cls(functions, bool(cfg.reward_model), weights)

    @classmethod
    def model_only(cls) -> RewardSources:
        return cls(RewardFunctions([], []), True, [1.0])

    @property
    def names(self) -> list[str]:
        return self.functions.names + ([REWARD_MODEL] if self.has_model else [])

    def function_scores(self, prompts: PromptTexts, rows: list[int], completions: list[str], lengths: list[int],
                        has_eos: list[bool], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, F) scores, (B, F) bool: the row failed) of the reward functions on completions of
        prompts `rows`; failures are printed (the first few) and flagged for counting."""
        columns = {key: [prompts.columns[i].get(key) for i in rows] for key in set().union(*(prompts.columns[i] for i in rows))}
        columns |= dict(zip(ROLLOUT_COLUMNS, (lengths, has_eos, max_length), strict=True))
        where = [prompts.where[i] for i in rows]
        scores = torch.tensor(self.functions.score([prompts.texts[i] for i in rows], completions, columns, where),
                              dtype=torch.float32).reshape(len(self.functions), len(rows)).T
        failed = torch.zeros_like(scores, dtype=torch.bool)
        errors = self.functions.take_errors()
        for error in errors:
            failed[error.row, self.functions.names.index(error.function)] = True
            self.last_problem[error.function] = error.problem
        report_errors(errors)
        return scores, failed

    def check_prompts(self, prompts: PromptTexts) -> None:
        """Refuse, before training, prompts that lack a column a reward function needs."""
        self.functions.check_columns(prompts.columns, prompts.where)

    def stop_if_all_failed(self, failed: torch.Tensor | None, update: int) -> None:
        """Stop, in one line, at an update where a function failed on every row (the (B, F) `failed`):
        scores that are all reward_error_score teach the policy nothing about that function."""
        if failed is None or not failed.numel():
            return
        for name, all_failed in zip(self.functions.names, failed.all(dim=0).tolist(), strict=True):
            if all_failed:
                raise ConfigError(f"reward function {name!r} failed on all {failed.size(0)} rows of update {update} (the last: "
                                  f"{self.last_problem.get(name, 'see the warnings above')}): the run would learn from "
                                  "reward_error_score alone: fix the function, then run again")

    def combine(self, components: torch.Tensor) -> torch.Tensor:
        """(B,) the weighted sum of the (B, C) components."""
        return components @ torch.tensor(self.weights, dtype=components.dtype, device=components.device)


def report_errors(errors: list[RewardError]) -> None:
    for error in errors[:REPORTED_ERRORS]:
        warn(error.line())
    if len(errors) > REPORTED_ERRORS:
        warn(f"{len(errors) - REPORTED_ERRORS} more reward-function failures in this batch (counted in rewards/<name>_errors)")


def component_metrics(names: list[str], components: torch.Tensor, failed: torch.Tensor | None, prefix: str = "rewards/") -> dict[str, float]:
    """The mean of each component and, for reward functions, the number of rows it failed on."""
    metrics = {f"{prefix}{name}": float(components[:, c].mean()) for c, name in enumerate(names)}
    if failed is not None:
        metrics |= {f"{prefix}{name}_errors": float(failed[:, c].sum()) for c, name in enumerate(names[: failed.size(1)])}
    return metrics
