"""Padding token lists into tensors (Detail 5).

Right padding for query+response (SFT and reward-model training), left padding for queries
(generation). PAD is never EOS (Detail 3), so the first PAD marks the end of a right-padded row.
"""

from __future__ import annotations

import torch

from ..attention_masks import PADDING, QUERY, block_sees

IGNORE_INDEX = -100


def pad(
    sequences: list[list[int]], pad_id: int, side: str, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
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


# segment ids of a packed pair row's responses, between the query's and the padding's (`block_sees`)
CHOSEN, REJECTED = 1, 2


def pack_pairs(
    queries: list[list[int]], chosen: list[list[int]], rejected: list[list[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """One right-padded row per pair, query + chosen + rejected, so the shared query is read once.

    The rejected response restarts at the query's last position + 1 and a 4-D mask (`block_sees`) hides
    the chosen tokens from it, so each response sees exactly what it would see in a row of its own: every score
    equals the unpacked one, at about half the tokens when the query is long (TL;DR, HH dialogues).
    """
    rows = [q + c + r for q, c, r in zip(queries, chosen, rejected, strict=True)]
    ids, mask = pad(rows, pad_id, "right")
    segments = torch.full_like(ids, PADDING)
    positions = torch.zeros_like(ids)
    for row, (q, c, r) in enumerate(zip(queries, chosen, rejected, strict=True)):
        segments[row, : len(q)] = QUERY
        segments[row, len(q) : len(q) + len(c)] = CHOSEN
        segments[row, len(q) + len(c) : len(rows[row])] = REJECTED
        positions[row, : len(rows[row])] = torch.cat(
            [torch.arange(len(q) + len(c)), torch.arange(len(q), len(q) + len(r))]
        )
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "pair_mask": block_sees(segments).unsqueeze(1),
        "position_ids": positions,
        "chosen_mask": segments == CHOSEN,
        "rejected_mask": segments == REJECTED,
    }

