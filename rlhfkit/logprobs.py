"""Teacher-forced log-probabilities: the log-probabilities (and entropies) that a model gives the
tokens of given sequences, from one forward pass, with logits formed a chunk at a time at the
positions that predict the tokens asked for. The on-policy scoring and update (`response_logprobs`:
a rollout's response tokens at the sampling temperature), the SFT loss (`target_logprobs`), DPO and its
implicit reward (`sequence_logprobs`) and the evaluations read them here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .devices import is_deepspeed_engine
from .ops import chunked_logprobs_entropy, is_right_padded, position_ids_from_mask
from .shared_rows import SharedRows

# Config fields of models whose logits are not a plain linear map of the last hidden state
# (soft-capping, scaling): their log-probabilities come from the model's own logits instead.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                    "lm_head_multiplier", "softcap")
PLAIN_HEAD_CHECKED = "_rlhfkit_plain_lm_head"


def plain_lm_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when logits = head(last hidden state) exactly, else None. Besides the known config
    fields, this is checked once per model against the model's own logits on a few tokens, so an
    unknown transform falls back to the slower exact path instead of giving wrong log-probabilities."""
    from torch.distributed.fsdp import FSDPModule

    wrapper = isinstance(model, torch.nn.parallel.DistributedDataParallel | FSDPModule)
    if wrapper or is_deepspeed_engine(model):
        # calling the backbone directly would bypass DDP's gradient sync, FSDP's gathering of the root's
        # weights, or DeepSpeed's (the engine's forward also drives ZeRO-3's gathering)
        return None
    head = model.get_output_embeddings()
    transformed = any(getattr(model.config, key, None) not in (None, 0) for key in LOGIT_TRANSFORMS)
    if not isinstance(head, torch.nn.Linear) or transformed:
        return None
    if PLAIN_HEAD_CHECKED not in model.__dict__:
        device = head.weight.device
        ids = torch.arange(3, device=device).unsqueeze(0)
        # in fp32 whatever the caller's autocast, and through the class's own forward: accelerate's mixed
        # precision replaces the instance's forward with one that enters bf16 autocast itself, whose logits
        # would differ from the fp32 head's and send every later call down the slow full-logits path
        with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
            hidden = getattr(model, model.base_model_prefix)(input_ids=ids).last_hidden_state
            logits = type(model).forward(model, input_ids=ids).logits
            plain = torch.allclose(head(hidden).float(), logits.float(), atol=1e-4, rtol=1e-3)
            model.__dict__[PLAIN_HEAD_CHECKED] = plain
    return head if model.__dict__[PLAIN_HEAD_CHECKED] else None


def pad_token_of(model: torch.nn.Module) -> int | None:
    """The PAD id a model's config carries (vocab.match_vocab sets it), through DDP's and DeepSpeed's
    wrappers: the token no log-probability gives mass to, as `generation.pick_next` never samples it
    (Detail 3)."""
    config = getattr(getattr(model, "module", model), "config", None)
    pad, eos = getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)
    return pad if isinstance(pad, int) and pad != eos else None


@dataclass(frozen=True)
class HeadInputs:
    """What a model's next-token distributions at some positions are formed from: hidden states (..., H) with its
    LM head (weight, bias), or the model's own logits (..., V) when its head is not a plain linear map (`weight`
    None). Logits are formed from them a chunk of positions at a time (`ops.chunked_logprobs_entropy`)."""

    features: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None

    def logprobs_entropy(self, tokens: torch.Tensor, temperature: float, excluded_token: int | None,
                         chunk_rows: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
        return chunked_logprobs_entropy(self.features, tokens, self.weight, self.bias, temperature, chunk_rows,
                                        excluded_token)


def response_head_inputs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, context_length: int
) -> HeadInputs:
    """`HeadInputs` (B, R, ...) at the positions that predict the response tokens `input_ids[:, context_length:]`,
    from one forward pass over left-padded query + response."""
    responses = input_ids[:, context_length:]
    positions = position_ids_from_mask(attention_mask)
    head = plain_lm_head(model)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       logits_to_keep=responses.size(1) + 1).logits[:, :-1]
        return HeadInputs(logits, None, None)
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)
    return HeadInputs(hidden.last_hidden_state[:, context_length - 1 : -1], head.weight, head.bias)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    context_length: int,
    temperature: float,
    chunk_rows: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities, entropies), both (B, R), of the response tokens `input_ids[:, context_length:]`
    under `model` at the sampling temperature, from one forward pass over left-padded query + response.

    Logits are formed from the hidden states a chunk at a time (ops.chunked_logprobs_entropy), never
    as a (B, L, vocab) tensor; only the positions that predict response tokens are computed.
    """
    inputs = response_head_inputs(model, input_ids, attention_mask, context_length)
    return inputs.logprobs_entropy(input_ids[:, context_length:], temperature, pad_token_of(model), chunk_rows)


def shared_response_head_inputs(model: torch.nn.Module, shared: SharedRows, responses: torch.Tensor) -> HeadInputs:
    """`response_head_inputs` of the rollout rows whose groups `shared` packs, in the rollout's rows (B, R, ...),
    each query read once for its group."""
    inputs = shared.inputs_for(model)
    head = plain_lm_head(model)
    if head is None:  # the model's own logits, formed only at the predicting columns
        logits = model(**inputs, logits_to_keep=shared.predictors).logits
        return HeadInputs(logits.reshape(*responses.shape, -1), None, None)
    hidden = getattr(model, model.base_model_prefix)(**inputs).last_hidden_state
    return HeadInputs(shared.per_response_token(hidden, shared.predictors), head.weight, head.bias)


def shared_response_logprobs(
    model: torch.nn.Module, shared: SharedRows, responses: torch.Tensor, temperature: float, chunk_rows: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` of the rollout rows whose groups `shared` packs (`shared_rows.pack_groups`),
    each query read once for its group: (B, R) log-probabilities and entropies of `responses` (B, R),
    in the rollout's rows, from one forward pass over the shared rows."""
    inputs = shared_response_head_inputs(model, shared, responses)
    return inputs.logprobs_entropy(responses, temperature, pad_token_of(model), chunk_rows)


def causal_inputs(attention_mask: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """The attention mask and positions of a teacher-forced pass. Right-padded rows need no padding mask: under
    causal attention a real position never sees the padding after it, so the model may take its causal fast path
    (SDPA's is_causal, without a mask to read); positions then simply count on through the padding, since
    repeated ones would read as packed sequences to `transformers`."""
    if is_right_padded(attention_mask):
        return {"attention_mask": None,
                "position_ids": torch.arange(attention_mask.size(1), device=attention_mask.device).expand_as(
                    attention_mask)}
    return {"attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask)}


def target_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities (temperature 1) of the tokens `input_ids[:, 1:][targets]`, each predicted from
    the position before it, as a flat (N,) tensor with the row of each. Any padding side; logits are
    formed only at those positions, a chunk at a time: the SFT loss and DPO read a few response
    tokens of each row, and a (B, L, vocab) tensor would be the largest of the step."""
    targets = targets.bool()
    head = plain_lm_head(model)
    inputs = {"input_ids": input_ids, **causal_inputs(attention_mask)}
    if head is None:
        logits = model(**inputs).logits[:, :-1]
        features, weight, bias = logits[targets], None, None
    else:
        hidden = getattr(model, model.base_model_prefix)(**inputs)
        features, weight, bias = hidden.last_hidden_state[:, :-1][targets], head.weight, head.bias
    tokens = input_ids[:, 1:][targets]
    excluded = pad_token_of(model)
    logprobs, _ = chunked_logprobs_entropy(features, tokens, weight, bias, 1.0, chunk_rows, excluded)
    return logprobs, rows_of(targets)


def rows_of(selected: torch.Tensor) -> torch.Tensor:
    """The row of each set entry of a (B, T) bool mask, in the order `tensor[selected]` flattens them."""
    return torch.arange(selected.size(0), device=selected.device).unsqueeze(1).expand_as(selected)[selected]


def summed_by_row(values: torch.Tensor, rows: torch.Tensor, size: int) -> torch.Tensor:
    """(size,) the flat `values` summed into the `rows` they belong to."""
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, rows, values)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    chunk_rows: int = 256,
) -> torch.Tensor:
    """(B,) summed log-probabilities (temperature 1) of the tokens where `response_mask` is set: log
    pi(y|x) of DPO (equation 4) and of its implicit reward (equation 5)."""
    logprobs, rows = target_logprobs(model, input_ids, attention_mask, response_mask[:, 1:], chunk_rows)
    return summed_by_row(logprobs, rows, input_ids.size(0))


def shared_sequence_logprobs(
    model: torch.nn.Module, shared: SharedRows, responses: torch.Tensor, response_mask: torch.Tensor,
    chunk_rows: int = 256,
) -> torch.Tensor:
    """`sequence_logprobs` of the rows whose groups `shared` packs, each query read once: (B,) summed
    log-probabilities (temperature 1) of the tokens of `responses` (B, R) where `response_mask` is set, logits
    formed only at the positions that predict those tokens."""
    inputs = shared_response_head_inputs(model, shared, responses)
    kept = response_mask.bool()
    logprobs, _ = chunked_logprobs_entropy(inputs.features[kept], responses[kept], inputs.weight, inputs.bias, 1.0,
                                           chunk_rows, pad_token_of(model))
    return summed_by_row(logprobs, rows_of(kept), responses.size(0))
