"""Deterministic train/validation split by prompt identity, so no post lands in both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")


def stable_rank(key: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def split_by_prompt(
    records: Sequence[T],
    key: Callable[[T], str],
    validation_size: int | None = None,
    validation_fraction: float | None = None,
    seed: int = 0,
) -> tuple[list[T], list[T]]:
    """(train, validation): a fixed number or fraction of distinct prompts goes to validation.

    The choice depends only on the prompt keys and the seed, not on record order, so the same
    data always splits the same way and every record of a prompt stays on one side.
    """
    if (validation_size is None) == (validation_fraction is None):
        raise ConfigError("give exactly one of validation_size and validation_fraction")
    keys = sorted({key(r) for r in records}, key=lambda k: stable_rank(k, seed))
    n = validation_size if validation_size is not None else round(len(keys) * validation_fraction)
    if n < 0:
        raise ConfigError(f"the validation size must not be negative, got {validation_size if validation_size is not None else validation_fraction}")
    if n > len(keys):
        raise ConfigError(f"asked for {n} validation prompts but the data has only {len(keys)} distinct prompts")
    held_out = set(keys[:n])
    train = [r for r in records if key(r) not in held_out]
    validation = [r for r in records if key(r) in held_out]
    return train, validation


def prompt_folds(keys: Sequence[str], folds: int, seed: int = 0) -> list[int]:
    """The cross-validation fold (0..folds-1) of each record, from its prompt key: every record of a
    prompt lands in the same fold, and the distinct prompts are dealt round-robin in a seeded order
    that, like `split_by_prompt`, depends only on the keys, so folds differ in size by one prompt."""
    distinct = sorted(set(keys), key=lambda k: stable_rank(k, seed))
    if not 2 <= folds <= len(distinct):
        raise ConfigError(f"cross-validation needs 2 to {len(distinct)} folds (one per distinct prompt at most), got {folds}")
    fold_of = {key: rank % folds for rank, key in enumerate(distinct)}
    return [fold_of[k] for k in keys]
