"""Padding token lists into tensors (Detail 5).

Right padding for query+response (SFT and reward-model training), left padding for queries
(generation). PAD is never EOS (Detail 3), so the first PAD marks the end of a right-padded row.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def pad(sequences: list[list[int]], pad_id: int, side: str, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of shape (len(sequences), width), padded on `side` ("left" or "right")."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    width = width or max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq) > width:
            raise ValueError(f"row {row} has {len(seq)} tokens, more than the width {width}")
        span = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        mask[row, span] = 1
    return ids, mask


def right_pad_query_response(
    queries: list[list[int]], responses: list[list[int]], pad_id: int, loss_on_query: bool = False
) -> dict[str, torch.Tensor]:
    """Detail 5: query+response concatenated and padded on the right; labels mask PAD (and the query)."""
    rows = [q + r for q, r in zip(queries, responses, strict=True)]
    ids, mask = pad(rows, pad_id, "right")
    response_mask = torch.zeros_like(mask, dtype=torch.bool)
    for row, (q, r) in enumerate(zip(queries, responses, strict=True)):
        response_mask[row, len(q) : len(q) + len(r)] = True
    labels = ids.clone()
    labels[~(mask.bool() if loss_on_query else response_mask)] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "response_mask": response_mask}


def left_pad_queries(queries: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Detail 5: queries padded on the left so generation continues every row at the same column."""
    ids, mask = pad(queries, pad_id, "left")
    return {"input_ids": ids, "attention_mask": mask}
