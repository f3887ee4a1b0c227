"""The one plan of a run's multi-turn episodes (`episode_plan`), which an on-policy stage and `eval gsm8k` build
alike from their `EpisodeOptions`: the environment class, looked up and its arguments checked once, its
arguments, the limits, and the rule that seeds each episode's environment. The sampler
(`generation.sample_responses`) builds each generation chunk's episodes from it (`ChunkEpisodes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from ..config import EpisodeOptions
from .base import Environment, EpisodeStart
from .calls import built, guarded
from .driver import EpisodeDriver, EpisodeLimits
from .registry import check_environment

ENVIRONMENT_STREAM = 19  # keeps the environments' seeds apart from the sampling's row keys


@dataclass(frozen=True)
class EpisodePrompt:
    """What a query's episodes start from: its prompt as the reward functions see it (a chat's messages, or the
    query's text), its record's columns, and where it comes from (named in an environment's error line)."""

    prompt: list[dict] | str
    columns: dict[str, Any]
    where: str = ""  # empty: the episode's row alone names it

    def label(self, row: int) -> str:
        """How an error line names row `row`'s episode of this prompt."""
        return f"{row} ({self.where})" if self.where else str(row)


@dataclass(frozen=True)
class EpisodePlan:
    environment: type[Environment]
    arguments: dict[str, Any]  # environment_args, checked against the class's constructor
    max_turns: int
    timeout: float  # seconds one call of the environment may run (0: no limit)
    check_tokens: bool
    run_seed: int

    def seed(self, update: int, stream: int, row: int) -> int:
        """The seed of one episode's environment, from (run seed, update, stream, its row in the update) alone,
        so it is the same however the update is split across chunks and processes, or resumed."""
        return int(np.random.default_rng([self.run_seed, update, stream, ENVIRONMENT_STREAM, row]).integers(2**31))

    def limits(self, budget: int, temperature: float) -> EpisodeLimits:
        """The limits of episodes sampled at `temperature` within `budget` tokens (the sampler's
        max_new_tokens: the policy's and the environment's tokens together)."""
        return EpisodeLimits(budget, self.max_turns, temperature, self.check_tokens, self.timeout)

    def records(self, records: list) -> list:
        """The dataset's records as the environment's episodes start from them (`Environment.episode_record`)."""
        environment = self.environment
        return [
            guarded(environment.__name__, f"record {r.where}", lambda r=r: environment.episode_record(r))
            for r in records
        ]


def episode_plan(options: EpisodeOptions) -> EpisodePlan | None:
    """The plan of `options`' episodes, after refusing arguments the environment does not take; None without
    an environment."""
    environment = check_environment(options.environment, options.arguments)
    if environment is None:
        return None
    return EpisodePlan(
        environment, options.arguments, options.max_turns, options.timeout, options.check_tokens, options.seed
    )


@dataclass(frozen=True)
class ChunkEpisodes:
    """The episodes of one generation chunk: the plan, each row's start and its name in an error line.
    `driver` builds the environments afresh, so a chunk sampled again starts its episodes again."""

    plan: EpisodePlan
    tokenizer: PreTrainedTokenizerBase
    starts: list[EpisodeStart]
    labels: list[str]

    def driver(self, budget: int, temperature: float) -> EpisodeDriver:
        limits = self.plan.limits(budget, temperature)
        environments = [
            built(self.plan.environment, start, self.tokenizer, self.plan.arguments, label, limits.timeout)
            for start, label in zip(self.starts, self.labels, strict=True)
        ]
        return EpisodeDriver(environments, self.tokenizer, limits, [s.prompt for s in self.starts], self.labels)
