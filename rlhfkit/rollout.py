"""The data of sampled episodes: `RolloutBatch`, one row per episode (a left-padded query, the response
or multi-turn episode after it, and everything the on-policy phases compute on it), and the operations
every phase uses on it: selecting rows, moving devices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Episodes:
    """What multi-turn episodes add to their rows (rlhfkit/environments/driver.py fills it): B rows, R
    response columns, E components, named `component_names` (the environment's, logged as env/<name>)."""

    policy_mask: torch.Tensor  # (B, R) bool: the tokens the policy sampled, a subset of the episode's mask
    sample_logprobs: torch.Tensor  # (B, R) the sampled tokens' log-probabilities while sampling
    env_rewards: torch.Tensor  # (B,) the environment's reward at the episode's end
    env_components: torch.Tensor  # (B, E) what the environment reports
    component_names: tuple[str, ...] = ()

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "component_names"}

    def map(self, fn) -> Episodes:
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()})

    def widened(self, width: int) -> Episodes:
        """The per-token fields right padded to `width` columns with 0 (False): columns outside every mask."""
        def pad(value: torch.Tensor) -> torch.Tensor:
            missing = width - value.size(1)
            return torch.nn.functional.pad(value, (0, missing), value=0) if missing else value

        return dataclasses.replace(self, policy_mask=pad(self.policy_mask), sample_logprobs=pad(self.sample_logprobs))

    @classmethod
    def joined(cls, parts: list[Episodes]) -> Episodes:
        """The rows of `parts` in order, as wide as each other."""
        tensors = {k: torch.cat([p.tensors()[k] for p in parts]) for k in parts[0].tensors()}
        return dataclasses.replace(parts[0], **tensors)


@dataclass
class RolloutBatch:
    """Sampled episodes and everything computed on them. B rows; queries left padded to Q columns,
    responses R columns. `sample_responses` fills the first six fields and `episodes`; the on-policy phases
    the rest."""

    prompts: torch.Tensor  # (B,) index of each row's prompt
    query_ids: torch.Tensor  # (B, Q)
    query_mask: torch.Tensor  # (B, Q)
    responses: torch.Tensor  # (B, R) cut after the first EOS, PAD after it
    mask: torch.Tensor  # (B, R) bool: tokens up to and including EOS
    has_eos: torch.Tensor  # (B,)
    logprobs: torch.Tensor | None = None  # (B, R) policy at sampling time (the "old" policy)
    ref_logprobs: torch.Tensor | None = None  # (B, R) frozen reference policy
    teacher_logprobs: torch.Tensor | None = None  # (B, R) the distillation teacher's, of the student's tokens
    # (B, R, H) the teacher's hidden states at the response positions (its logits, (B, R, V), where its head is not
    # a plain linear map), kept where the update compares whole distributions (distill_loss=jsd, topk-forward-kl)
    teacher_features: torch.Tensor | None = None
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
    episodes: Episodes | None = None

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
        return self.mask if self.episodes is None else self.mask & self.episodes.policy_mask

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.responses], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.mask.to(self.query_mask.dtype)], dim=1)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields that are set, by name (`episodes` apart: a record of its own)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "episodes"}
        return {name: value for name, value in values.items() if value is not None}

    def map_tensors(self, fn) -> RolloutBatch:
        """`fn` applied to every tensor, the episodes' included."""
        episodes = self.episodes.map(fn) if self.episodes is not None else None
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()}, episodes=episodes)

    @classmethod
    def joined(cls, parts: list[RolloutBatch]) -> RolloutBatch:
        """The rows of `parts` in order; the parts are as wide as each other (`onpolicy.collect.widen`)."""
        first = parts[0]
        tensors = {k: torch.cat([p.tensors()[k] for p in parts]) for k in first.tensors()}
        episodes = Episodes.joined([p.episodes for p in parts]) if first.episodes is not None else None
        return dataclasses.replace(first, **tensors, episodes=episodes)

    def select(self, rows: torch.Tensor | np.ndarray | slice) -> RolloutBatch:
        """The same fields for a subset of rows (columns unchanged, so every row is computed alike)."""
        return self.map_tensors(lambda v: v[rows])

    def to(self, device: torch.device) -> RolloutBatch:
        return self.map_tensors(lambda v: v.to(device))
