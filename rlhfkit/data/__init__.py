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


__all__ = ["Comparison", "DataFormatError", "SFTRecord", "SkipLog", "load_comparisons", "load_hh", "load_pairs", "load_sft"]
