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
