"""Data layer: upstream readers (TL;DR SFT, OpenAI comparisons, HH-RLHF), formats, padding, splits."""

from __future__ import annotations

from .hh import load_hh
from .records import DataFormatError, SkipLog
from .tldr import Comparison, SFTRecord, load_comparisons, load_sft

COMPARISON_LOADERS = {"tldr-comparisons": load_comparisons, "hh": load_hh}


def load_pairs(data_format: str, paths: list[str], hf_split: str = "") -> tuple[list[Comparison], SkipLog]:
    if data_format not in COMPARISON_LOADERS:
        raise ValueError(f"unknown comparison format {data_format!r}; choose one of {', '.join(COMPARISON_LOADERS)}")
    return COMPARISON_LOADERS[data_format](paths, hf_split)


def hh_prompts(paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """HH-RLHF dialogues as prompts, one per distinct dialogue; the chosen response stands in for
    the reference summary that evaluations compare with."""
    comparisons, log = load_hh(paths, hf_split)
    unique = {c.prompt_id: SFTRecord(c.prompt_id, c.fields, c.chosen, c.where, c.task) for c in comparisons}
    return list(unique.values()), log


PROMPT_LOADERS = {"tldr-sft": load_sft, "hh": hh_prompts}


def load_prompts(prompt_format: str, paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """Prompts with a reference response: TL;DR posts with their summaries, or HH-RLHF dialogues."""
    if prompt_format not in PROMPT_LOADERS:
        raise ValueError(f"unknown prompt format {prompt_format!r}; choose one of {', '.join(PROMPT_LOADERS)}")
    return PROMPT_LOADERS[prompt_format](paths, hf_split)


__all__ = ["Comparison", "DataFormatError", "SFTRecord", "SkipLog", "load_comparisons", "hh_prompts", "load_hh", "load_pairs", "load_prompts", "load_sft"]
