"""Win rates, bootstrap intervals and length control against hand-computed values."""

import math

import numpy as np
import pytest

from rlhfkit.eval import winrate


def test_ties_count_half_and_unparseable_replies_are_not_votes():
    result = winrate.win_rate(["win", "win", "tie", "loss", "unparseable", "unparseable"])
    assert result.rate == pytest.approx(2.5 / 4)
    assert (result.wins, result.losses, result.ties, result.unparseable, result.votes) == (2, 1, 1, 2, 4)
    assert result.low <= result.rate <= result.high
    empty = winrate.win_rate(["unparseable"])
    assert empty.rate is None and empty.unparseable == 1
    with pytest.raises(ValueError, match="unknown verdict"):
        winrate.win_rate(["A"])


def test_bootstrap_interval_covers_the_true_rate_about_as_often_as_it_claims():
    rng = np.random.default_rng(0)
    true_rate, covered, trials = 0.3, 0, 200
    for trial in range(trials):
        outcomes = np.where(rng.random(100) < true_rate, "win", "loss").tolist()
        result = winrate.win_rate(outcomes, resamples=400, confidence=0.9, seed=trial)
        covered += result.low <= true_rate <= result.high
    assert 0.82 <= covered / trials <= 0.97


def test_length_bins_hand_values():
    outcomes = ["win", "loss", "tie", "win", "unparseable"]
    model = [20, 10, 10, 40, 10]
    other = [10, 10, 10, 10, 10]  # log ratios: 0.69, 0, 0, 1.39, 0
    rows = winrate.length_bins(outcomes, model, other, edges=(-math.inf, 0.0, 1.0, math.inf))
    assert [(r["pairs"], r["votes"], r["win_rate"]) for r in rows] == [(0, 0, None), (4, 3, 0.5), (1, 1, 1.0)]


def test_logistic_fit_hand_values():
    intercept, slope = winrate.fit_logistic(np.zeros(4), np.array([1.0, 1.0, 1.0, 0.0]))
    assert intercept == pytest.approx(math.log(3), abs=1e-5) and slope == pytest.approx(0.0, abs=1e-5)


def test_length_adjusted_win_rate_removes_a_pure_length_preference():
    """A judge that only likes length: raw win rate high for a model that writes longer, about 0.5 at equal length."""
    rng = np.random.default_rng(1)
    ratios = rng.normal(0.4, 0.5, 4000)  # the model writes longer on average
    wins = rng.random(4000) < 1 / (1 + np.exp(-2.0 * ratios))
    outcomes = np.where(wins, "win", "loss").tolist()
    other = np.full(4000, 30.0)
    model = other * np.exp(ratios)
    raw = winrate.win_rate(outcomes, resamples=200)
    adjusted = winrate.length_adjusted_win_rate(outcomes, model, other, resamples=50)
    assert raw.rate > 0.6
    assert adjusted["win_rate_at_equal_length"] == pytest.approx(0.5, abs=0.03)
    assert adjusted["slope"] == pytest.approx(2.0, abs=0.25)
    assert adjusted["low"] <= adjusted["win_rate_at_equal_length"] <= adjusted["high"]
