"""The one reward-scoring service: every score a reward model (or DPO's implicit reward, Detail 19)
gives is read here, whether to train the model, evaluate it, judge with it or reward a policy.

- Rows (Detail 5): a response after its query in a right-padded row of its own (`collate_scored`);
  a pair in one packed row that reads the query once (`collate_packed_pairs`) or in two rows
  (`collate_pairs`, DPO's layout); a sampled response after its left-padded query (`scores_at_eos`).
- Batching: rows are scored longest first, so a batch pads only to its own longest row, under a
  progress bar; the scores come back in input order (`score_in_batches`).
- The reward is read at the response's EOS token (Detail 12). A response that never emitted EOS has
  no valid score and gets a constant instead (Detail 23), only through `ops.eos_trick`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import ops
from .data.collate import pack_pairs, pad, right_pad_query_response
from .data.examples import PairExample, response_length_columns
from .devices import evaluation_mode, model_device
from .reward_features import FeatureCache, collate_features
from .reward_models import ScalarModel
from .shared_rows import pack_groups

# the fields of a pair batch the model reads; the rest (lengths, loss units) are for the loss
MODEL_INPUTS = ("input_ids", "attention_mask", "pair_mask", "position_ids", "chosen_mask", "rejected_mask",
                "chosen_features", "rejected_features")
MISSING_EOS_SCORE = -1.0  # Detail 23: the paper's score of a response without EOS

Batch = dict[str, torch.Tensor]


# ---------------------------------------------------------------- rows


def collate_scored(queries: list[list[int]], responses: list[list[int]], pad_id: int) -> Batch:
    """Right-padded query+response rows (Detail 5) with a mask of the response tokens."""
    batch = right_pad_query_response(queries, responses, pad_id)
    batch.pop("labels")
    return batch


def collate_pairs(examples: list[PairExample], pad_id: int) -> Batch:
    """Chosen rows first, then rejected rows, in one right-padded batch of 2B rows (DPO's layout)."""
    queries = [e.query.ids for e in examples] * 2
    responses = [e.chosen for e in examples] + [e.rejected for e in examples]
    batch = collate_scored(queries, responses, pad_id)
    batch["loss_units"] = torch.ones(len(examples), dtype=torch.long)
    return batch


def collate_shared_pairs(examples: list[PairExample], pad_id: int) -> Batch:
    """DPO's pairs, one row each with the query read once: `shared_rows.pack_groups` with a group of two (chosen,
    then rejected), each response seeing the query and itself, so its log-probabilities are those of its
    `collate_pairs` row, at about half the tokens when the query is long (TL;DR: a ~350-token post, ~30-token
    summaries). `pair_responses`/`pair_response_mask` (2B, R) hold the responses, chosen and rejected alternating;
    `attention_mask` marks each packed row's tokens, which the trainer counts."""
    query_ids, query_mask = pad([e.query.ids for e in examples for _ in range(2)], pad_id, "left")
    responses, response_mask = pad([r for e in examples for r in (e.chosen, e.rejected)], pad_id, "right")
    shared = pack_groups(query_ids, query_mask, responses, response_mask, group=2)
    widths = torch.tensor([e.packed_width() for e in examples])
    return shared.as_batch_fields() | {
        "pair_responses": responses,
        "pair_response_mask": response_mask,
        "attention_mask": (torch.arange(shared.input_ids.size(1)) < widths.unsqueeze(1)).long(),
        "loss_units": torch.ones(len(examples), dtype=torch.long),
    }


def chosen_and_rejected(values: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen and rejected halves of per-row `values` (2B, ...) of a pair batch: alternating rows in shared
    pairs (`collate_shared_pairs`), the first and second halves in `collate_pairs`'."""
    if "pair_responses" in batch:
        return values[0::2], values[1::2]
    chosen, rejected = values.chunk(2)
    return chosen, rejected


def pair_response_tokens(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) tokens of each pair's chosen and of its rejected response, in either pair layout."""
    mask = batch["pair_response_mask"] if "pair_responses" in batch else batch["response_mask"]
    return chosen_and_rejected(mask.sum(-1), batch)


def response_lengths(examples: list[PairExample]) -> Batch:
    """`PairExample.response_lengths` of a batch, as the `chosen_lengths` and `rejected_lengths` tensors."""
    chosen, rejected = response_length_columns(examples)
    return {
        "chosen_lengths": torch.tensor(chosen, dtype=torch.long),
        "rejected_lengths": torch.tensor(rejected, dtype=torch.long),
    }


def collate_packed_pairs(examples: list[PairExample], pad_id: int) -> Batch:
    """One packed row per pair (`collate.pack_pairs`): the query is read once for both responses."""
    batch = pack_pairs(
        [e.query.ids for e in examples], [e.chosen for e in examples], [e.rejected for e in examples], pad_id
    )
    return batch | response_lengths(examples) | {"loss_units": torch.ones(len(examples), dtype=torch.long)}


# ---------------------------------------------------------------- reading scores off a batch


def row_scores(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """(B,) scores of `collate_scored` rows, each read at its response's EOS, the first PAD minus 1 (Detail 12)."""
    return model(batch["input_ids"], batch["attention_mask"], batch["response_mask"])


def pair_scores(model: ScalarModel, batch: Batch) -> Batch:
    """`ScalarModel.pair_scores` of a packed or cached-feature pair batch, called through `forward` so
    that a DDP-wrapped model syncs its gradients."""
    return model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})


def head_scores(model: torch.nn.Module, batch: Batch) -> Batch:
    """Every head's (B,) scores of a pair batch: `chosen`, `rejected` and, for an ODIN model,
    `chosen_length`, `rejected_length`; for `collate_pairs` rows, the chosen and rejected halves."""
    if "pair_mask" in batch or "chosen_features" in batch:
        return {k: v for k, v in pair_scores(model, batch).items() if v.dim() == 1}
    chosen, rejected = row_scores(model, batch).chunk(2)
    return {"chosen": chosen, "rejected": rejected}


def scores_at_eos(
    model: ScalarModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    context_length: int,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) scores of sampled responses, the on-policy stages' rewards before the EOS trick.

    Each row is a query left padded to `context_length` columns (Detail 14: positions follow the
    mask, so the padding changes nothing) followed by a response of `lengths` tokens and PAD. The
    score is read at the response's last token: its EOS (Detail 12), or the last sampled token when
    it has none, which is the index equation 3 puts the score on. Gradients follow the caller's mode."""
    eos_index = context_length + lengths - 1
    return model(input_ids, attention_mask, context_length=context_length, eos_index=eos_index)


def with_eos_trick(
    scores: np.ndarray, has_eos: Sequence[bool], missing_eos_score: float = MISSING_EOS_SCORE
) -> np.ndarray:
    """Detail 23 on scores already read: `missing_eos_score` wherever the response has no EOS."""
    return ops.eos_trick(torch.from_numpy(scores), torch.tensor(has_eos, dtype=torch.bool), missing_eos_score).numpy()


# ---------------------------------------------------------------- longest-first batching


def longest_first(widths: Sequence[int], batch_size: int, desc: str) -> Iterator[list[int]]:
    """Indices in batches of `batch_size`, the widest rows first, so that rows of like width share a
    batch; a progress bar when there is more than one batch."""
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=len(order) <= batch_size):
        yield order[start : start + batch_size]


@torch.no_grad()
def score_in_batches(
    model: torch.nn.Module,
    items: Sequence[Any],
    collate: Callable[[list[Any]], Batch],
    width: Callable[[Any], int],
    read: Callable[[torch.nn.Module, Batch], Batch],
    batch_size: int,
    desc: str,
) -> dict[str, np.ndarray]:
    """What `read` gives for every item, by name, as float64 arrays in input order: the items are
    collated longest first (`longest_first`) and read in eval mode on the model's device."""
    device = model_device(model)
    out: dict[str, np.ndarray] = {}
    with evaluation_mode(model):
        for rows in longest_first([width(item) for item in items], batch_size, desc):
            batch = {k: v.to(device) for k, v in collate([items[i] for i in rows]).items()}
            for name, values in read(model, batch).items():
                out.setdefault(name, np.zeros(len(items)))[rows] = values.float().cpu().numpy()
    return out


# ---------------------------------------------------------------- the scores callers ask for


def score_texts(
    model: torch.nn.Module,
    pad_id: int,
    queries: list[list[int]],
    responses: list[list[int]],
    batch_size: int,
    desc: str = "scoring",
    has_eos: Sequence[bool] | None = None,
    missing_eos_score: float = MISSING_EOS_SCORE,
) -> np.ndarray:
    """(N,) rewards of query+response rows, in input order. Given `has_eos`, the EOS trick
    (`with_eos_trick`) replaces the score of every response that never ended."""
    rows = list(zip(queries, responses, strict=True))
    scores = score_in_batches(
        model,
        rows,
        lambda picked: collate_scored([q for q, _ in picked], [r for _, r in picked], pad_id),
        lambda row: len(row[0]) + len(row[1]),
        lambda m, batch: {"reward": row_scores(m, batch)},
        batch_size,
        desc,
    )
    rewards = scores["reward"] if rows else np.zeros(0)
    return rewards if has_eos is None else with_eos_trick(rewards, has_eos, missing_eos_score)


def score_pair_heads(
    model: torch.nn.Module,
    pad_id: int,
    examples: list[PairExample],
    batch_size: int,
    desc: str = "scoring",
    features: FeatureCache | None = None,
) -> dict[str, np.ndarray]:
    """Every head's scores of the chosen and rejected responses, in input order (`head_scores`): a packed
    row per pair; with a feature cache of the model's frozen backbone the heads read the cached features."""
    if features is not None:
        items, collate, width = (
            features.features(model, pad_id, examples, batch_size),
            collate_features,
            (lambda item: item.width()),
        )
    elif isinstance(model, ScalarModel):
        items, collate, width = (
            examples,
            (lambda b: collate_packed_pairs(b, pad_id)),
            (lambda item: item.packed_width()),
        )
    # DPO's implicit reward (Detail 19) reads next-token predictions, which a packed row would shift: a row per response
    else:
        items, collate, width = examples, (lambda b: collate_pairs(b, pad_id)), (lambda item: item.width())
    return score_in_batches(model, items, collate, width, head_scores, batch_size, desc)


def score_pairs(
    model: torch.nn.Module,
    pad_id: int,
    examples: list[PairExample],
    batch_size: int,
    desc: str = "scoring",
    features: FeatureCache | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) rewards in input order."""
    scores = score_pair_heads(model, pad_id, examples, batch_size, desc, features)
    return scores["chosen"], scores["rejected"]
