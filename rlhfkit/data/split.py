"""Deterministic train/validation splits by prompt identity, so no post lands in both, and the
comparisons a pair stage (reward model, DPO) trains and validates on: filtered by upstream split and
batch, then split by prompt or by upstream split (`split_comparisons`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..config.sections import PairSelection
from ..errors import ConfigError
from . import load_pairs, usable
from .tldr import Comparison

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
    if validation_size is not None:
        validation_size = held_out_count(validation_size, len(keys))
    n = validation_size if validation_size is not None else round(len(keys) * validation_fraction)
    if n < 0:
        raise ConfigError(
            "the validation size must not be negative, got "
            f"{validation_size if validation_size is not None else validation_fraction}"
        )
    if n > len(keys):
        raise ConfigError(f"asked for {n} validation prompts but the data has only {len(keys)} distinct prompts")
    held_out = set(keys[:n])
    train = [r for r in records if key(r) not in held_out]
    validation = [r for r in records if key(r) in held_out]
    return train, validation


SMALL_DATA_SHARE = 10  # small data holds out one prompt in this many


def held_out_count(validation_posts: int, prompts: int) -> int:
    """The prompts held out of `prompts` distinct ones for `validation_posts`: that many, unless the data has fewer
    (300, the default, of a 16-row dataset): then a tenth of them, at least one while one is left to train on, as a
    printed line says. Every stage splits the same data the same way, so `generate split=validation` still
    answers the prompts `sft` held out."""
    if validation_posts <= prompts:
        return validation_posts
    held = min(max(1, round(prompts / SMALL_DATA_SHARE)), max(prompts - 1, 0))
    print(
        f"validation_posts={validation_posts} is more than the data's {prompts} distinct prompts: holding out "
        f"{held} (a tenth) for validation; set validation_posts= to choose"
    )
    return held


def prompt_folds(keys: Sequence[str], folds: int, seed: int = 0) -> list[int]:
    """The cross-validation fold (0..folds-1) of each record, from its prompt key: every record of a
    prompt lands in the same fold, and the distinct prompts are dealt round-robin in a seeded order
    that, like `split_by_prompt`, depends only on the keys, so folds differ in size by one prompt."""
    distinct = sorted(set(keys), key=lambda k: stable_rank(k, seed))
    if not 2 <= folds <= len(distinct):
        raise ConfigError(
            f"cross-validation needs 2 to {len(distinct)} folds (one per distinct prompt at most), got {folds}"
        )
    fold_of = {key: rank % folds for rank, key in enumerate(distinct)}
    return [fold_of[k] for k in keys]


def filter_comparisons(records: list[Comparison], splits: list[str], batches: list[str]) -> list[Comparison]:
    """The comparisons of the given upstream splits and annotation batches (an empty list keeps all)."""
    return [r for r in records if (not splits or r.split in splits) and (not batches or r.batch in batches)]


def split_comparisons(selection: PairSelection) -> tuple[list[Comparison], list[Comparison], list[str]]:
    """(training comparisons, validation comparisons, notes): filters, then the split by prompt that
    `rlhfkit rm-eval side=validation` repeats, then at most max_pairs training pairs."""
    loaded = load_pairs(selection.data_format, selection.data, selection.hf_split, selection.fields)
    records, load_log = usable(loaded, selection.data, "pairs", f"data_format={selection.data_format}")
    notes = [f"loaded: {load_log.summary('pairs')}"]
    if selection.validation_splits:
        train_records, val_records, split_notes = split_by_upstream_split(
            selection, filter_comparisons(records, [], selection.batches)
        )
        notes += split_notes
    else:
        records = filter_comparisons(records, selection.splits, selection.batches)
        if not records:
            raise ConfigError(
                f"no comparisons left after splits={selection.splits} batches={selection.batches} (loaded: "
                f"{load_log.summary('pairs')})"
            )
        train_records, val_records = split_by_prompt(
            records, lambda r: r.prompt_id, validation_fraction=selection.validation_fraction, seed=selection.seed
        )
        notes += [
            f"after split/batch filters: {len(records)} pairs",
            f"split by prompt: {len(train_records)} train pairs ({len({r.prompt_id for r in train_records})} prompts), "
            f"{len(val_records)} validation pairs ({len({r.prompt_id for r in val_records})} prompts), no prompt on "
            "both sides",
        ]
    if selection.max_pairs and len(train_records) > selection.max_pairs:
        train_records = train_records[: selection.max_pairs]
        notes.append(f"training on the first {selection.max_pairs} training pairs (max_pairs)")
    return train_records, val_records, notes


def split_by_upstream_split(
    selection: PairSelection, records: list[Comparison]
) -> tuple[list[Comparison], list[Comparison], list[str]]:
    """Split-disjoint protocol: validate on the upstream `validation_splits` (TL;DR valid1, whose
    summaries come from other policies than valid2's, Detail 6), train on `splits` (empty: every other
    split). Validation pairs whose prompt is also trained on are dropped and counted, so validation is
    prompt-disjoint as well."""
    validation = [r for r in records if r.split in selection.validation_splits]
    train = [
        r
        for r in records
        if r.split not in selection.validation_splits and (not selection.splits or r.split in selection.splits)
    ]
    if not validation or not train:
        found = sorted({r.split or "(none)" for r in records})
        raise ConfigError(
            f"validation_splits={selection.validation_splits} splits={selection.splits} leave {len(train)} training "
            "and "
            f"{len(validation)} validation pairs; the data has splits {found}"
        )
    trained = {r.prompt_id for r in train}
    disjoint = [r for r in validation if r.prompt_id not in trained]
    notes = [
        f"split-disjoint: {len(train)} training pairs from splits "
        f"{selection.splits or 'other than ' + str(selection.validation_splits)}, "
        f"{len(disjoint)} validation pairs from {selection.validation_splits}; {len(validation) - len(disjoint)} "
        "validation pairs "
        "dropped because their prompt is also in training"
    ]
    return train, disjoint, notes
