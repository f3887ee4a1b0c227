"""Percentile bootstrap intervals, the interval every evaluation gives beside its numbers (win rates, reward-model
accuracy, GSM8K accuracy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def bootstrap_interval(values: np.ndarray, statistic: Callable[[np.ndarray], float], resamples: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over rows of `values` resampled with replacement."""
    if len(values) == 0:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    stats = np.array([statistic(values[p]) for p in picks])
    tail = (1 - confidence) / 2
    return float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))
