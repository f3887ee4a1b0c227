"""Batched generation from left-padded queries, with the KV cache, and the log-probabilities of a
rollout's response tokens from one forward pass.

`generate` returns the sampled tokens, their log-probabilities under the temperature used to sample
(Table 7: the temperature divides the logits in every forward pass), and responses truncated after
the first EOS with PAD after it: the mechanics the PPO EOS trick (Detail 23) needs. Rows that never
emit EOS keep all their tokens. `response_logprobs` recomputes those log-probabilities (and the
entropies) the way the trainers do.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import DynamicCache, PreTrainedTokenizerBase, StaticCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from . import decoding
from .data.collate import left_pad_queries
from .devices import is_deepspeed_engine
from .ops import (
    chunked_logprobs_entropy,
    filter_logits,
    first_true_indices,
    logprobs_from_logits,
    position_ids_from_mask,
    truncate_after_eos,
)


@dataclass
class SamplingParams:
    max_new_tokens: int = 53
    temperature: float = 0.7  # 0 means greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    decoding: str = "auto"  # decoding.DECODING: how the steps after the prompt run; never what is sampled


@dataclass
class Rollout:
    queries: torch.Tensor  # (B, Q) left padded
    responses: torch.Tensor  # (B, R) truncated after the first EOS, PAD after it
    logprobs: torch.Tensor  # (B, R) log-probabilities of the sampled tokens; 0 after the EOS
    lengths: torch.Tensor  # (B,) tokens up to and including EOS (R when there is none)
    has_eos: torch.Tensor  # (B,) whether the response contains EOS
    decoding: str = "eager"  # how the steps ran: eager, buckets or cuda-graphs


def pick_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, pad_id: int | None = None) -> torch.Tensor:
    """The next token, greedy or sampled; never PAD (Detail 3: PAD marks where a response ended, so a
    sampled PAD would move where the reward model reads its score)."""
    if pad_id is not None and pad_id < logits.size(-1):
        logits = logits.clone()
        logits[..., pad_id] = float("-inf")
    if params.temperature <= 0:
        return logits.argmax(-1)
    filtered = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    return torch.multinomial(filtered.softmax(-1), 1, generator=generator).squeeze(-1)


class OneDtypeStaticLayer(StaticLayer):
    """A preallocated layer that stores keys and values in one dtype (`cache_dtype`). Under autocast the
    keys come out of the rotary embedding in fp32 while the values stay bf16, and a preallocated
    buffer, unlike a growing one, must take both in its own dtype."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_initialized:
            key_states, value_states = key_states.to(self.keys.dtype), value_states.to(self.values.dtype)
        return super().update(key_states, value_states, *args, **kwargs)


def cache_dtype(keys: torch.Tensor, values: torch.Tensor) -> torch.dtype:
    """The dtype of the preallocated cache: under autocast, the one attention computes in, else the
    wider of the keys' and values'. Autocast casts the keys and values to its dtype in every attention
    call, so a buffer kept in fp32 would be cast whole, in every layer, at every decoded token, for the
    same values it holds in autocast's dtype: the same tokens, a slower decode (docs/performance.md,
    "Generation under bf16 autocast") and twice the cache memory."""
    device = keys.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(keys.dtype, values.dtype)


def plain_cache_layers(model: torch.nn.Module, prefill: Cache, max_length: int) -> bool:
    """Whether the prompt's cache is one plain growing layer per attention layer and the model's cache
    would be one plain preallocated layer per attention layer: the layout a copy into preallocated
    buffers understands (sliding-window, hybrid or quantised caches are not)."""
    if not isinstance(prefill, DynamicCache) or any(type(layer) is not DynamicLayer for layer in prefill.layers):
        return False
    planned = StaticCache(config=model.config, max_cache_len=max_length)  # allocates nothing: only its layer kinds are read
    return len(planned.layers) == len(prefill.layers) and all(type(layer) is StaticLayer for layer in planned.layers)


def static_decode_cache(model: torch.nn.Module, prefill: Cache, repeats: int, max_length: int) -> Cache | None:
    """The prompt's KV cache copied (each row `repeats` times) into a cache allocated once for the whole
    generation, or None when the model's cache is not the plain per-layer kind this copy understands
    (those keep the growing cache). A growing cache concatenates every layer's keys and values at every
    decoded token, which was two thirds of a decode step on CPU."""
    if not plain_cache_layers(model, prefill, max_length):
        return None
    static = Cache(layers=[OneDtypeStaticLayer(max_cache_len=max_length) for _ in prefill.layers])
    for source, target in zip(prefill.layers, static.layers, strict=True):
        dtype = cache_dtype(source.keys, source.values)
        target.update(source.keys.to(dtype).repeat_interleave(repeats, dim=0), source.values.to(dtype).repeat_interleave(repeats, dim=0))
    return static


@contextlib.contextmanager
def frozen_weights_cast_once(model: torch.nn.Module, device: torch.device):
    """Under autocast with grad mode off, the model's frozen fp32 weights marked as requiring grad for
    the block, and frozen again after it. Autocast keeps its low-precision copy of a weight for the rest
    of its context only when the weight requires grad; frozen weights (LoRA's base weights, a
    reference) were cast afresh at every forward, that is at every decoded token: SmolLM2-135M then
    decoded 1.5x slower than in fp32, and 2x slower than with each weight cast once (docs/performance.md,
    "Generation under bf16 autocast"). With grad mode off nothing is recorded, so the flag changes nothing else."""
    frozen = []
    if torch.is_autocast_enabled(device.type) and not torch.is_grad_enabled():
        frozen = [p for p in model.parameters() if not p.requires_grad and p.dtype == torch.float32]
    for parameter in frozen:
        parameter.requires_grad_(True)
    try:
        yield
    finally:
        for parameter in frozen:
            parameter.requires_grad_(False)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    params: SamplingParams,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator | None = None,
    samples_per_prompt: int = 1,
) -> Rollout:
    """Sample up to `max_new_tokens` for each left-padded query; stop early once every row has EOS.

    With `samples_per_prompt` G > 1 each query is encoded once and its KV cache repeated G times, so
    a group of G samples (GRPO, RLOO) costs one prefill; the rows come out as G consecutive samples
    of query 0, then of query 1, and so on. Decoding writes into a KV cache laid out once for the
    whole batch (`static_decode_cache`) where the model allows it; on a CUDA device each step is a
    replayed CUDA graph and finished rows are dropped (rlhfkit/decoding.py, `params.decoding`)."""
    device = query_ids.device
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    rewind = generator.get_state()
    with frozen_weights_cast_once(model, device):
        try:
            return prefill_and_decode(model, query_ids, query_mask, params, eos_id, pad_id, generator, samples_per_prompt)
        except decoding.GraphMismatch:
            generator.set_state(rewind)
            eager = dataclasses.replace(params, decoding="eager")
            return prefill_and_decode(model, query_ids, query_mask, eager, eos_id, pad_id, generator, samples_per_prompt)


def prefill_and_decode(model: torch.nn.Module, query_ids: torch.Tensor, query_mask: torch.Tensor, params: SamplingParams,
                       eos_id: int, pad_id: int, generator: torch.Generator, samples_per_prompt: int) -> Rollout:
    """`generate`'s prefill and decoding loop. Sampling happens here, on every row's logits, whichever
    way the steps run (`decoding_steps`), so the random stream does not depend on it."""
    device = query_ids.device
    # logits_to_keep=1: only the last position's logits are needed, not (B, Q, vocab)
    out = model(input_ids=query_ids, attention_mask=query_mask, position_ids=position_ids_from_mask(query_mask),
                use_cache=True, logits_to_keep=1)
    query_ids, query_mask, logits = (t.repeat_interleave(samples_per_prompt, dim=0) for t in (query_ids, query_mask, out.logits[:, -1]))
    steps = decoding_steps(model, decoding.returned_cache(out), query_mask, samples_per_prompt, params, logits)
    tokens, logps = [], []
    finished = torch.zeros(query_ids.size(0), dtype=torch.bool, device=device)
    for step in range(params.max_new_tokens):
        nxt = pick_next(logits, params, generator, pad_id)
        tokens.append(nxt)
        logps.append(logprobs_from_logits(logits, nxt, params.temperature))
        finished |= nxt == eos_id
        if bool(finished.all()) or len(tokens) == params.max_new_tokens:
            break
        logits = steps.step(nxt, finished, step)
    raw = torch.stack(tokens, dim=1)
    responses = truncate_after_eos(raw, eos_id, pad_id)
    eos_at = first_true_indices(raw == eos_id)
    has_eos = eos_at < raw.size(1)
    lengths = torch.where(has_eos, eos_at + 1, torch.full_like(eos_at, raw.size(1)))
    valid = torch.arange(raw.size(1), device=device).unsqueeze(0) < lengths.unsqueeze(1)
    logprobs = torch.stack(logps, dim=1) * valid
    return Rollout(query_ids, responses, logprobs, lengths, has_eos, steps.name)


class EagerSteps:
    """Decoding steps as forward calls of the whole batch, finished rows included, into a cache laid out
    once (`static_decode_cache`) where the model allows it, else the growing one."""

    name = "eager"

    def __init__(self, model: torch.nn.Module, prefill: Cache, query_mask: torch.Tensor, repeats: int, max_new_tokens: int):
        batch, self.width = query_mask.shape
        self.model, self.keyword = model, decoding.cache_keyword(model)
        self.cache = static_decode_cache(model, prefill, repeats, self.width + max_new_tokens)
        self.preallocated = self.cache is not None
        if not self.preallocated:
            self.cache = prefill
            if repeats > 1:
                prefill.batch_repeat_interleave(repeats)
        # the mask of every position the cache will hold, set to 1 as each token is decoded
        self.mask = torch.cat([query_mask, query_mask.new_zeros(batch, max_new_tokens)], dim=1)
        self.position = query_mask.sum(-1, keepdim=True)

    def step(self, tokens: torch.Tensor, finished: torch.Tensor, step: int) -> torch.Tensor:
        self.mask[:, self.width + step] = 1
        visible = self.mask if self.preallocated else self.mask[:, : self.width + step + 1]
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=visible, position_ids=self.position + step, use_cache=True,
                         **{self.keyword: self.cache})
        return out.logits[:, -1]


def decoding_steps(model: torch.nn.Module, prefill: Cache, query_mask: torch.Tensor, repeats: int, params: SamplingParams,
                   logits: torch.Tensor) -> EagerSteps | decoding.BucketSteps:
    """How this call decodes: `params.decoding` ("auto": CUDA graphs on a CUDA device, eager steps
    elsewhere), falling back to eager steps, with the reason logged, where the model cannot."""
    mode = params.decoding
    if mode not in decoding.DECODING:
        raise ValueError(f"decoding={mode!r}: choose one of {', '.join(decoding.DECODING)}")
    if mode == "auto":
        mode = "cuda-graphs" if query_mask.device.type == "cuda" else "eager"
    if mode != "eager":
        target = decoding.unwrapped(model)
        length = query_mask.size(1) + params.max_new_tokens
        obstacle = decoding.bucket_obstacle(target, plain_cache_layers(target, prefill, length))
        if mode == "cuda-graphs":
            obstacle = obstacle or decoding.graph_obstacle(target, query_mask.device)
        if obstacle is None:
            dtype = cache_dtype(prefill.layers[0].keys, prefill.layers[0].values)
            decoder = decoding.decoder_for(target, prefill, query_mask.size(0), length, dtype, capture=mode == "cuda-graphs")
            return decoding.BucketSteps(decoder, prefill, query_mask, repeats, logits)
        decoding.fall_back(target, obstacle)
    return EagerSteps(model, prefill, query_mask, repeats, params.max_new_tokens)


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

    if isinstance(model, torch.nn.parallel.DistributedDataParallel | FSDPModule) or is_deepspeed_engine(model):
        # calling the backbone directly would bypass DDP's gradient sync, FSDP's gathering of the root's
        # weights, or DeepSpeed's (the engine's forward also drives ZeRO-3's gathering)
        return None
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or any(getattr(model.config, key, None) not in (None, 0) for key in LOGIT_TRANSFORMS):
        return None
    if PLAIN_HEAD_CHECKED not in model.__dict__:
        device = head.weight.device
        ids = torch.arange(3, device=device).unsqueeze(0)
        # in fp32 whatever the caller's autocast: a wrapper may return fp32 logits from a bf16 forward
        with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
            hidden = getattr(model, model.base_model_prefix)(input_ids=ids).last_hidden_state
            logits = model(input_ids=ids).logits
            model.__dict__[PLAIN_HEAD_CHECKED] = torch.allclose(head(hidden).float(), logits.float(), atol=1e-4, rtol=1e-3)
    return head if model.__dict__[PLAIN_HEAD_CHECKED] else None


def pad_token_of(model: torch.nn.Module) -> int | None:
    """The PAD id a model's config carries (vocab.match_vocab sets it), through DDP's and DeepSpeed's
    wrappers: the token no log-probability gives mass to, as `pick_next` never samples it (Detail 3)."""
    config = getattr(getattr(model, "module", model), "config", None)
    pad, eos = getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)
    return pad if isinstance(pad, int) and pad != eos else None


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
    responses = input_ids[:, context_length:]
    positions = position_ids_from_mask(attention_mask)
    head = plain_lm_head(model)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       logits_to_keep=responses.size(1) + 1).logits[:, :-1]
        return chunked_logprobs_entropy(logits, responses, temperature=temperature, chunk_rows=chunk_rows,
                                        excluded_token=pad_token_of(model))
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
    return chunked_logprobs_entropy(hidden[:, context_length - 1 : -1], responses, head.weight, head.bias, temperature, chunk_rows,
                                    pad_token_of(model))


def target_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, chunk_rows: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities (temperature 1) of the tokens `input_ids[:, 1:][targets]`, each predicted from
    the position before it, as a flat (N,) tensor with the row of each. Any padding side; logits are
    formed only at those positions, a chunk at a time: the SFT loss and DPO read a few response
    tokens of each row, and a (B, L, vocab) tensor would be the largest of the step."""
    targets = targets.bool()
    positions = position_ids_from_mask(attention_mask)
    head = plain_lm_head(model)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits[:, :-1]
        features, weight, bias = logits[targets], None, None
    else:
        hidden = getattr(model, model.base_model_prefix)(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)
        features, weight, bias = hidden.last_hidden_state[:, :-1][targets], head.weight, head.bias
    logprobs = chunked_logprobs_entropy(features, input_ids[:, 1:][targets], weight, bias, 1.0, chunk_rows, pad_token_of(model))[0]
    rows = torch.arange(input_ids.size(0), device=input_ids.device).unsqueeze(1).expand_as(targets)[targets]
    return logprobs, rows


def sequence_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor, chunk_rows: int = 256
) -> torch.Tensor:
    """(B,) summed log-probabilities (temperature 1) of the tokens where `response_mask` is set: log
    pi(y|x) of DPO (equation 4) and of its implicit reward (equation 5)."""
    logprobs, rows = target_logprobs(model, input_ids, attention_mask, response_mask[:, 1:], chunk_rows)
    return torch.zeros(input_ids.size(0), dtype=logprobs.dtype, device=logprobs.device).index_add(0, rows, logprobs)


def response_texts(rollout: Rollout, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Decoded responses without EOS or PAD."""
    texts = []
    for row, length in zip(rollout.responses, rollout.lengths.tolist(), strict=True):
        ids = row[:length].tolist()
        texts.append(tokenizer.decode([t for t in ids if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]))
    return texts


def generate_texts(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    queries: list[list[int]],
    params: SamplingParams,
    batch_size: int = 8,
    desc: str = "generating",
) -> list[dict]:
    """Generate for many queries in batches (longest first, to pad less); results keep input order."""
    device = next(model.parameters()).device
    order = sorted(range(len(queries)), key=lambda i: -len(queries[i]))
    results: list[dict | None] = [None] * len(queries)
    generator = torch.Generator(device=device).manual_seed(params.seed)
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        idx = order[start : start + batch_size]
        batch = left_pad_queries([queries[i] for i in idx], tokenizer.pad_token_id)
        rollout = generate(
            model, batch["input_ids"].to(device), batch["attention_mask"].to(device), params,
            tokenizer.eos_token_id, tokenizer.pad_token_id, generator,
        )
        for j, (i, text) in enumerate(zip(idx, response_texts(rollout, tokenizer), strict=True)):
            length = int(rollout.lengths[j])
            results[i] = {"text": text.strip(), "tokens": length, "has_eos": bool(rollout.has_eos[j]),
                          "ids": rollout.responses[j, :length].tolist()}
    model.train(was_training)
    return results
