"""The data of sampled episodes: `RolloutBatch`, one row per episode (a left-padded query, the response
or multi-turn episode after it, and everything the on-policy phases compute on it), and the operations
every phase uses on it: selecting rows, moving devices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RolloutBatch:
    """Sampled episodes and everything computed on them. B rows; queries left padded to Q columns,
    responses R columns. `sample_responses` fills the first six fields; the on-policy phases the rest."""

    prompts: torch.Tensor  # (B,) index of each row's prompt
    query_ids: torch.Tensor  # (B, Q)
    query_mask: torch.Tensor  # (B, Q)
    responses: torch.Tensor  # (B, R) cut after the first EOS, PAD after it
    mask: torch.Tensor  # (B, R) bool: tokens up to and including EOS
    has_eos: torch.Tensor  # (B,)
    logprobs: torch.Tensor | None = None  # (B, R) policy at sampling time (the "old" policy)
    ref_logprobs: torch.Tensor | None = None  # (B, R) frozen reference policy
    values: torch.Tensor | None = None  # (B, R) value model at sampling time
    reward_components: torch.Tensor | None = None  # (B, C) each reward function's score, then the RM's
    reward_failures: torch.Tensor | None = None  # (B, F) bool: the row a reward function failed on
    raw_scores: torch.Tensor | None = None  # (B,) the components' weighted sum
    scores: torch.Tensor | None = None  # (B,) after the EOS trick
    kl: torch.Tensor | None = None  # (B, R) per-token KL estimate
    rewards: torch.Tensor | None = None  # (B, R) equation 3
    advantages: torch.Tensor | None = None  # (B, R)
    returns: torch.Tensor | None = None  # (B, R)
    baseline_scores: torch.Tensor | None = None  # (B,) ReMax: the shaped score of the prompt's greedy answer
    # multi-turn episodes (rlhfkit/environments): `responses` holds the policy's and the environment's ids
    policy_mask: torch.Tensor | None = None  # (B, R) bool: the tokens the policy sampled, a subset of `mask`
    sample_logprobs: torch.Tensor | None = None  # (B, R) the sampled tokens' log-probabilities while sampling
    env_rewards: torch.Tensor | None = None  # (B,) the environment's reward at the episode's end
    env_components: torch.Tensor | None = None  # (B, E) what the environment reports (env/<name>)

    @property
    def size(self) -> int:
        return self.responses.size(0)

    @property
    def context_length(self) -> int:
        return self.query_ids.size(1)

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    @property
    def trained_mask(self) -> torch.Tensor:
        """(B, R) the tokens losses, KL, advantages and metrics count: the policy's own. `mask` (the whole
        episode) is what the models attend to."""
        return self.mask if self.policy_mask is None else self.mask & self.policy_mask

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.responses], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.mask.to(self.query_mask.dtype)], dim=1)

    def tensors(self) -> dict[str, torch.Tensor]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: value for name, value in values.items() if value is not None}

    def map_tensors(self, fn) -> RolloutBatch:
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()})

    def select(self, rows: torch.Tensor | np.ndarray | slice) -> RolloutBatch:
        """The same fields for a subset of rows (columns unchanged, so every row is computed alike)."""
        return self.map_tensors(lambda v: v[rows])

    def to(self, device: torch.device) -> RolloutBatch:
        return self.map_tensors(lambda v: v.to(device))
