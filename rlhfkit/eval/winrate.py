"""Win rates from judge verdicts: ties, unparseable replies, bootstrap intervals, length control.

A verdict compares a model's response with another (a reference summary or another model) and is
"win", "loss", "tie", "unparseable" or "failed", from the model's side. Win rate = (wins + ties / 2) / votes,
where votes exclude unparseable replies (the judge did not answer in the required format) and failed
calls (no reply came back): neither is a vote for either side, and each is reported as a count of its own.

Length control (the paper's Figure 8): a policy can win by writing longer. `length_bins` gives the
win rate by bins of log(model length / other length); `length_adjusted_win_rate` fits
P(win) = sigmoid(a + b * log length ratio) and reports sigmoid(a), the win rate at equal length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..intervals import bootstrap_interval

OUTCOMES = ("win", "loss", "tie", "unparseable", "failed")
VOTE_VALUES = {"win": 1.0, "tie": 0.5, "loss": 0.0}


@dataclass
class WinRate:
    rate: float | None  # (wins + ties / 2) / votes; None without a single vote
    low: float | None  # bootstrap interval around `rate`
    high: float | None
    wins: int
    losses: int
    ties: int
    unparseable: int
    failed: int = 0  # calls that got no reply

    @property
    def votes(self) -> int:
        return self.wins + self.losses + self.ties


def check_outcomes(outcomes: Sequence[str]) -> None:
    bad = sorted({o for o in outcomes if o not in OUTCOMES})
    if bad:
        raise ValueError(f"unknown verdict outcomes {bad}; expected one of {', '.join(OUTCOMES)}")


def vote_values(outcomes: Sequence[str]) -> np.ndarray:
    """1 for a win, 0.5 for a tie, 0 for a loss; unparseable replies and failed calls are dropped."""
    check_outcomes(outcomes)
    return np.array([VOTE_VALUES[o] for o in outcomes if o in VOTE_VALUES], dtype=np.float64)


def win_rate(outcomes: Sequence[str], resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> WinRate:
    """Win rate with a bootstrap interval over the votes (ties count half, unparseable and failed not at all)."""
    values = vote_values(outcomes)
    counts = [sum(1 for x in outcomes if x == o) for o in OUTCOMES]
    if len(values) == 0:
        return WinRate(None, None, None, *counts)
    low, high = bootstrap_interval(values, np.mean, resamples, confidence, seed)
    return WinRate(float(values.mean()), low, high, *counts)


def log_length_ratios(model_lengths: Sequence[float], other_lengths: Sequence[float]) -> np.ndarray:
    model, other = np.asarray(model_lengths, dtype=np.float64), np.asarray(other_lengths, dtype=np.float64)
    if model.shape != other.shape or (model <= 0).any() or (other <= 0).any():
        raise ValueError("lengths must be positive and as many for the model as for the other side")
    return np.log(model / other)


def length_bins(outcomes: Sequence[str], model_lengths: Sequence[float], other_lengths: Sequence[float],
                edges: Sequence[float] = (-math.inf, -0.5, -0.25, 0.0, 0.25, 0.5, math.inf)) -> list[dict]:
    """Figure 8: win rate per bin of log(model length / other length); a bin is [low, high)."""
    check_outcomes(outcomes)
    ratios = log_length_ratios(model_lengths, other_lengths)
    rows = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        members = [o for o, r in zip(outcomes, ratios, strict=True) if low <= r < high]
        values = vote_values(members)
        rows.append({"low": low, "high": high, "pairs": len(members), "votes": len(values),
                     "win_rate": float(values.mean()) if len(values) else None})
    return rows


def fit_logistic(x: np.ndarray, y: np.ndarray, iterations: int = 50, ridge: float = 1e-6) -> tuple[float, float]:
    """(intercept, slope) of P(y = 1) = sigmoid(a + b x) by Newton's method; y may hold 0.5 for ties
    (a fractional outcome, as in the win rate). A tiny ridge keeps separable data finite."""
    design = np.stack([np.ones_like(x), x], axis=1)
    weights = np.zeros(2)
    for _ in range(iterations):
        p = 1 / (1 + np.exp(-design @ weights))
        gradient = design.T @ (y - p) - ridge * weights
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + ridge * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        weights = weights + step
        if np.abs(step).max() < 1e-10:
            break
    return float(weights[0]), float(weights[1])


def length_adjusted_win_rate(outcomes: Sequence[str], model_lengths: Sequence[float], other_lengths: Sequence[float],
                             resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict:
    """The win rate the fit predicts at equal length (log ratio 0), with the slope per unit of log
    length ratio (how much longer wins), and a bootstrap interval over pairs."""
    check_outcomes(outcomes)
    ratios = log_length_ratios(model_lengths, other_lengths)
    kept = np.array(
        [(r, VOTE_VALUES[o]) for o, r in zip(outcomes, ratios, strict=True) if o in VOTE_VALUES], dtype=np.float64
    )
    if len(kept) < 2:
        return {"win_rate_at_equal_length": None, "low": None, "high": None, "slope": None, "votes": len(kept)}

    def at_equal_length(rows: np.ndarray) -> float:
        return float(1 / (1 + math.exp(-fit_logistic(rows[:, 0], rows[:, 1])[0])))

    intercept, slope = fit_logistic(kept[:, 0], kept[:, 1])
    low, high = bootstrap_interval(kept, at_equal_length, resamples, confidence, seed)
    return {
        "win_rate_at_equal_length": float(1 / (1 + math.exp(-intercept))),
        "low": low,
        "high": high,
        "slope": slope,
        "votes": len(kept),
    }
