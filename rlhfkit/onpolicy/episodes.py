"""Multi-turn episodes in an on-policy run (`environment=`, docs/environments.md): each sampled row's
environment, built from its prompt's record and a seed of its own, and the driver that runs a generation
chunk's episodes (rlhfkit/environments/driver.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from transformers import PreTrainedTokenizerBase

from ..config import OnPolicyConfig
from ..environments import EpisodeStart, environment_class
from ..environments.calls import built, guarded
from ..environments.driver import EpisodeDriver, EpisodeLimits
from ..rollout import RolloutBatch
from .scoring import PromptTexts, component_metrics

ENVIRONMENT_STREAM = 19


def episode_limits(cfg: OnPolicyConfig, temperature: float) -> EpisodeLimits:
    return EpisodeLimits(cfg.max_response_length, cfg.max_turns, temperature, cfg.check_tokens, cfg.environment_timeout)


def environment_seed(seed: int, update: int, stream: int, row: int) -> int:
    """The seed of one episode's environment, from (run seed, update, stream, its row in the update)
    alone, so it is the same however the update is split across processes or resumed."""
    return int(np.random.default_rng([seed, update, stream, ENVIRONMENT_STREAM, row]).integers(2**31))


def episode_drivers(
    cfg: OnPolicyConfig,
    tokenizer: PreTrainedTokenizerBase,
    texts: PromptTexts,
    prompts: list[int],
    seeds: Callable[[int], int],
    temperature: float,
    group: int,
) -> Callable[[list[int]], EpisodeDriver] | None:
    """`sample_responses`' `episodes_for`: the driver of the given rows (row g + `group` x i: sample g of
    prompt `prompts[i]`, an index into `texts`); `seeds(row)` is that row's environment seed. None without
    an environment."""
    if not cfg.environment:
        return None
    environment = environment_class(cfg.environment)
    limits = episode_limits(cfg, temperature)

    def driver(rows: list[int]) -> EpisodeDriver:
        picked = [prompts[row // group] for row in rows]
        labels = [f"{row} ({texts.where[p]})" for row, p in zip(rows, picked, strict=True)]
        environments = [
            built(
                environment,
                EpisodeStart(texts.prompts[p], texts.columns[p], seeds(row)),
                tokenizer,
                cfg.environment_args,
                label,
                limits.timeout,
            )
            for row, p, label in zip(rows, picked, labels, strict=True)
        ]
        return EpisodeDriver(environments, tokenizer, limits, [texts.prompts[p] for p in picked], labels)

    return driver


def episode_records(cfg: OnPolicyConfig, records: list) -> list:
    """The dataset's records as the environment's episodes start from them (`Environment.episode_record`)."""
    if not cfg.environment:
        return records
    environment = environment_class(cfg.environment)
    return [
        guarded(environment.__name__, f"record {r.where}", lambda r=r: environment.episode_record(r)) for r in records
    ]


def environment_metrics(cfg: OnPolicyConfig, batch: RolloutBatch) -> dict[str, float]:
    """The mean over the update's episodes of what the environment reports (env/<name>)."""
    if batch.env_components is None:
        return {}
    names = environment_class(cfg.environment).component_names
    return component_metrics(list(names), batch.env_components, None, prefix="env/")
