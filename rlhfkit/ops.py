"""Pure tensor functions: no I/O, no state. Every function here is unit-tested against hand values."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def first_true_indices(bools: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Index of the first True in each row; the row width when a row has none."""
    width = bools.size(-1)
    positions = torch.arange(width, device=bools.device, dtype=dtype)
    return torch.where(bools, positions, torch.full_like(positions, width)).min(dim=-1).values


def truncate_after_eos(responses: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """Keep each response up to and including its first EOS; PAD everything after it."""
    eos_at = first_true_indices(responses == eos_id)
    positions = torch.arange(responses.size(1), device=responses.device)
    return torch.where(positions.unsqueeze(0) > eos_at.unsqueeze(1), torch.full_like(responses, pad_id), responses)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of `tokens` under `logits / temperature` (Detail 25: the same T in every forward pass)."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.gather(F.log_softmax(scaled, dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token, so left padding shifts nothing."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then nucleus (top-p) filtering: removed entries become -inf."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def token_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Sum of next-token cross-entropy over labelled positions (labels are aligned with inputs)."""
    shifted_logits = logits[:, :-1].float()
    shifted_labels = labels[:, 1:]
    return F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)), shifted_labels.reshape(-1), ignore_index=ignore_index, reduction="sum"
    )
