"""What the models say about a policy's samples: reward-model score, KL to the reference, token shift.

- RM score: the frozen reward model on query + response (Detail 12), -1 for a response without EOS
  as in training (Detail 23);
- KL: sum over the response tokens of log pi(y_t) - log pi_ref(y_t) on the policy's own samples
  (equation 3's k1 estimate; with greedy samples it measures how far the policy's choices sit in the
  reference's distribution rather than the exact KL);
- token shift (Appendix F.2, Lin et al. 2024): each response token's rank under the reference:
  rank 1 "unshifted", rank 2-3 "marginal", beyond "shifted": what alignment changed.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..data.collate import right_pad_query_response
from ..data.formats import encode_completion, encode_text
from ..logprobs import sequence_logprobs

SHIFT_COLORS = {"unshifted": "#cfe3ff", "marginal": "#fff2b3", "shifted": "#ffc9c9"}


def encoded_samples(tokenizer, rows: Sequence[dict[str, Any]]) -> tuple[list[list[int]], list[list[int]]]:
    """(query ids, response ids) of sample rows: the ids `rlhfkit generate` recorded when it did (exact),
    else the texts encoded as the stages encode them (Detail 3), EOS only where the sample had it."""
    if all("query_ids" in r and "ids" in r for r in rows):
        return [list(r["query_ids"]) for r in rows], [list(r["ids"]) for r in rows]
    responses = []
    for row in rows:
        ids = encode_completion(tokenizer, row["text"])
        responses.append(ids if row.get("has_eos", True) else ids[:-1])
    return [encode_text(tokenizer, r["query"]) for r in rows], responses


def batches(n: int, size: int) -> list[range]:
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


@torch.no_grad()
def response_logprob_sums(
    model, queries: list[list[int]], responses: list[list[int]], pad_id: int, batch_size: int
) -> np.ndarray:
    """(N,) log pi(response | query) summed over the response tokens."""
    device = next(model.parameters()).device
    out = np.zeros(len(queries))
    for rows in batches(len(queries), batch_size):
        batch = right_pad_query_response([queries[i] for i in rows], [responses[i] for i in rows], pad_id)
        ids, mask, response = (batch[k].to(device) for k in ("input_ids", "attention_mask", "response_mask"))
        out[list(rows)] = sequence_logprobs(model, ids, mask, response).float().cpu().numpy()
    return out


def kl_to_reference(policy, reference, queries, responses, pad_id: int, batch_size: int = 8) -> np.ndarray:
    """(N,) k1 KL estimate of each sample: log pi - log pi_ref summed over its response tokens."""
    return response_logprob_sums(policy, queries, responses, pad_id, batch_size) - response_logprob_sums(
        reference, queries, responses, pad_id, batch_size
    )


@torch.no_grad()
def token_ranks(model, query: list[int], response: list[int]) -> list[int]:
    """Rank (1 = the model's greedy choice) of each response token under `model`, given what precedes it."""
    device = next(model.parameters()).device
    ids = torch.tensor([query + response], device=device)
    logits = model(input_ids=ids).logits[0, len(query) - 1 : -1].float()
    chosen = logits.gather(-1, torch.tensor(response, device=device).unsqueeze(-1))
    return ((logits > chosen).sum(-1) + 1).tolist()


def shift_category(rank: int) -> str:
    return "unshifted" if rank == 1 else "marginal" if rank <= 3 else "shifted"


def shift_shares(ranks: Sequence[Sequence[int]]) -> dict[str, float]:
    """Share of all response tokens in each category."""
    flat = [shift_category(r) for row in ranks for r in row]
    return {c: (flat.count(c) / len(flat) if flat else 0.0) for c in SHIFT_COLORS}


def shift_html(tokenizer, response: list[int], ranks: list[int]) -> str:
    """The response with each token coloured by its category (Table 8's blue, yellow and red)."""
    spans = []
    for token, rank in zip(response, ranks, strict=True):
        text = tokenizer.decode([token])
        color = SHIFT_COLORS[shift_category(rank)]
        spans.append(f'<span style="background:{color}" title="rank {rank}">{html.escape(text)}</span>')
    return "".join(spans)
