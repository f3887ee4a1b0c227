"""Shared-prefix rows: a group of G responses to one query read as one row, the query once.

Grouped methods (GRPO and its variants, RLOO, REINFORCE++-baseline, ReMax) sample G responses per
prompt, and every teacher-forced pass over them (the old policy's, the reference's, the reward model's,
the update's forward and backward) would read the query G times in G rows of its own. Here a group is
one row, `query r_1 r_2 ... r_G`, with a 4-D attention mask under which each response sees the query
and itself only, and positions that restart at |query| for every response: each response token's
hidden state is exactly the one its own row would give, up to float summation order. At TL;DR's
shapes (a 400-token query, 53-token responses, G = 4) a group is 612 positions instead of 1,812.

The layout is what packed reward-model pairs already do (`data.collate.pack_pairs`), for G responses;
the idea is published as Prefix Grouper (arXiv 2506.05433). A model that cannot take such a mask
(flash attention, sliding windows, a forward without position ids, or one that rebuilds its own mask,
found by a probe) keeps unshared rows, and the reason is logged once (`fall_back`).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import weakref
from dataclasses import dataclass

import torch

from .attention_masks import PADDING, QUERY, block_sees, mask_as_attention_takes_it, mask_obstacle

log = logging.getLogger(__name__)

OBSTACLE_CHECKED = "_rlhfkit_shared_rows_obstacle"
BATCH_PREFIX = "shared_"  # SharedRows' fields in a collated batch
fallbacks_logged: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> reasons logged


@dataclass
class SharedRows:
    """N groups of G responses, one row each, right padded to L columns; response slots are laid out
    as the rollout's (G x R) so that per-token outputs reshape straight back to the rollout's rows.

    input_ids, position_ids: (N, L)
    sees:        (N, 1, L, L) bool, query position i may attend to key position k
    predictors:  (N, G*R) the column whose hidden state predicts response token t of response j (the
                 query's last column for t = 0, shared by the group; column 0 past a response's end)
    tokens:      (N, G*R) the column holding that token (column 0 past a response's end)
    eos_index:   (N, G) the column of each response's last token: its EOS, or its last sampled token
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    sees: torch.Tensor
    predictors: torch.Tensor
    tokens: torch.Tensor
    eos_index: torch.Tensor

    def to(self, device: torch.device) -> SharedRows:
        return SharedRows(**{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)})

    def as_batch_fields(self) -> dict[str, torch.Tensor]:
        """Its tensors as fields of a collated batch (`BATCH_PREFIX` + name), which a trainer moves to the
        device with the rest of the batch."""
        return {BATCH_PREFIX + f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_batch(cls, batch: dict[str, torch.Tensor]) -> SharedRows | None:
        """The shared rows a batch carries (`as_batch_fields`), or None for a batch of unshared rows."""
        if BATCH_PREFIX + "input_ids" not in batch:
            return None
        return cls(**{f.name: batch[BATCH_PREFIX + f.name] for f in dataclasses.fields(cls)})

    @property
    def rows(self) -> int:
        """The rollout rows these groups hold."""
        return self.eos_index.numel()

    def inputs_for(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments, the mask in the form `model`'s attention takes it."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": mask_as_attention_takes_it(innermost(model), self.sees),
            "position_ids": self.position_ids,
        }

    def per_response_token(self, outputs: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """(B, R, ...) the (N, L, ...) `outputs` at `columns` (predictors or tokens), in rollout rows."""
        return at_columns(outputs, columns).reshape(self.rows, -1, *outputs.shape[2:])

    def per_response(self, outputs: torch.Tensor) -> torch.Tensor:
        """(B, ...) the (N, L, ...) `outputs` at each response's last token, in rollout rows."""
        return at_columns(outputs, self.eos_index).reshape(self.rows, *outputs.shape[2:])


def at_columns(outputs: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(N, C, ...) the (N, L, ...) `outputs` at the (N, C) `columns` of each row."""
    return torch.take_along_dim(outputs, columns.view(*columns.shape, *[1] * (outputs.dim() - 2)), dim=1)


def pack_groups(
    query_ids: torch.Tensor, query_mask: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor, group: int
) -> SharedRows:
    """Shared rows of a rollout's rows: `query_ids`/`query_mask` (B, Q) left padded, `responses`/`mask`
    (B, R) right padded, B a multiple of `group` with each run of `group` rows one prompt's samples
    (as `generation.sample_responses` lays them out). The query's padding and each response's PAD after
    its EOS are dropped, so no row holds padding before its last token."""
    size, width = responses.shape
    if size % group:
        raise ValueError(f"{size} rows do not make whole groups of {group}")
    lengths = mask.sum(-1).tolist()
    rows, segments, positions, predictors, tokens = [], [], [], [], []
    for first in range(0, size, group):
        query = query_ids[first][query_mask[first].bool()].cpu()
        if not torch.equal(query_ids[first : first + group], query_ids[first].expand(group, -1)):
            raise ValueError(f"rows {first}..{first + group - 1} are not one prompt's samples: their queries differ")
        parts, segment, position = [query], [torch.full_like(query, QUERY)], [torch.arange(len(query))]
        predictor = torch.zeros(group, width, dtype=torch.long)
        token = torch.zeros(group, width, dtype=torch.long)
        offset = len(query)
        for j in range(group):
            length = lengths[first + j]
            parts.append(responses[first + j, :length].cpu())
            segment.append(torch.full((length,), j + 1))
            position.append(torch.arange(len(query), len(query) + length))
            token[j, :length] = torch.arange(offset, offset + length)
            predictor[j, :length] = token[j, :length] - 1
            predictor[j, 0] = len(query) - 1  # the first token of every response is predicted by the query's end
            offset += length
        rows.append(torch.cat(parts))
        segments.append(torch.cat(segment))
        positions.append(torch.cat(position))
        predictors.append(predictor.flatten())
        tokens.append(token)
    columns = max(len(r) for r in rows)

    def right_padded(parts: list[torch.Tensor], fill: int) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(p, (0, columns - len(p)), value=fill) for p in parts])

    segment_ids = right_padded(segments, PADDING)  # response j of a group is segment j + 1
    token_columns = torch.stack(tokens)
    lasts = (torch.tensor(lengths).view(-1, group) - 1).clamp(min=0)
    device = responses.device
    return SharedRows(
        input_ids=right_padded(rows, 0).to(device),  # any id: no position sees a padding key
        position_ids=right_padded(positions, 0).to(device),
        sees=block_sees(segment_ids).unsqueeze(1).to(device),
        predictors=torch.stack(predictors).to(device),
        tokens=token_columns.flatten(1).to(device),
        eos_index=token_columns.gather(2, lasts.unsqueeze(-1)).squeeze(-1).to(device),
    )


def innermost(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose config and forward decide how it takes a mask: inside DDP or DeepSpeed's
    `module`, a reference with its adapter switched off, PEFT's base model, a reward or value model's
    backbone."""
    model = getattr(model, "module", model)
    model = model.__dict__.get("inner", model)  # adapters.AdapterDisabled: the adapted model it switches
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return getattr(model, "backbone", model)


def shared_rows_obstacle(model: torch.nn.Module) -> str | None:
    """Why `model` cannot read shared rows (None: it can). Checked once per model: its attention, its
    windows and its forward's arguments from the config and class, then a probe comparing a shared row
    with unshared ones on a few tokens, which catches a model that rebuilds its own mask."""
    if OBSTACLE_CHECKED not in model.__dict__:
        try:
            obstacle = static_obstacle(innermost(model)) or probe_obstacle(model)
        except Exception as e:  # a model that refuses the rows outright (say, one that builds ALiBi from a 2-D mask)
            obstacle = f"a probe with shared rows failed: {type(e).__name__}: {e}"
        model.__dict__[OBSTACLE_CHECKED] = obstacle
    return model.__dict__[OBSTACLE_CHECKED]


def static_obstacle(model: torch.nn.Module) -> str | None:
    config = model.config
    obstacle = mask_obstacle(model)
    if obstacle is not None:
        return obstacle
    if getattr(config, "sliding_window", None) or any(
        kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()
    ):
        return "the model has sliding-window layers, whose window a custom 4-D mask would replace"
    if "position_ids" not in inspect.signature(type(model).forward).parameters:
        return f"{type(model).__name__}.forward takes no position_ids, so a response's positions cannot restart"
    return None


@torch.no_grad()
def probe_obstacle(model: torch.nn.Module) -> str | None:
    """A 3-token query with responses of 2 and 3 tokens, shared and unshared, in fp32: a causal LM's
    logits (through its own forward, so that a sharded model gathers its weights as it always does), or
    a reward or value model's hidden states, must agree."""
    device = next(model.parameters()).device
    query, first, second = [1, 2, 3], [4, 5], [6, 7, 8]
    query_ids = torch.tensor([query, query], device=device)
    responses = torch.tensor([first + [5], second], device=device)
    mask = torch.tensor([[True, True, False], [True, True, True]], device=device)
    shared = pack_groups(query_ids, torch.ones_like(query_ids), responses, mask, group=2)
    target = innermost(model)
    causal_lm = isinstance(getattr(target, "get_output_embeddings", lambda: None)(), torch.nn.Module)

    def outputs(**inputs: torch.Tensor) -> torch.Tensor:
        out = target(**inputs)
        return out.logits if causal_lm else out.last_hidden_state

    with torch.autocast(device_type=device.type, enabled=False):
        packed = shared.per_response_token(outputs(**shared.inputs_for(model)), shared.tokens)
        for row, response in enumerate((first, second)):
            apart = outputs(input_ids=torch.tensor([query + response], device=device))[0, len(query) :]
            if not torch.allclose(packed[row, : len(response)].float(), apart.float(), atol=1e-4, rtol=1e-3):
                return "a probe's shared row differed from its unshared rows (the model may build its own mask)"
    return None


def reads_shared_rows(model: torch.nn.Module, shared_prefix: str, split: str | None = None) -> bool:
    """Whether `model`'s passes read shared rows under `shared_prefix`: not when it is off, nor where the model
    cannot take their mask or `split` says why the passes would cut a group apart; that reason is logged once."""
    if shared_prefix == "off":
        return False
    obstacle = shared_rows_obstacle(model) or split
    if obstacle is not None:
        fall_back(model, obstacle)
    return obstacle is None


def fall_back(model: torch.nn.Module, reason: str) -> None:
    """Log, once per model and reason, why a forward reads unshared rows."""
    logged = fallbacks_logged.setdefault(model, set())
    if reason not in logged:
        logged.add(reason)
        log.warning("rlhfkit: unshared rows (each response with its own copy of the query): %s", reason)
