"""Eager decoding steps: one forward call of the whole batch per token, finished rows included, into a KV
cache laid out once for the whole generation where the model's cache allows it (`static_decode_cache`),
else the growing one the prompt's forward returned. Every model decodes this way; the bucketed and graphed
steps (`buckets.py`) fall back to it.

Also here, because every way of decoding needs them: the name a model's forward takes its cache by, the
cache a forward returned, and the cast of frozen weights once per call under autocast.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel: decoding needs no gradient, so no collective either."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def cache_keyword(model: torch.nn.Module) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.24, which
    deprecated `past_key_values` (and, given both, ignores the cache). Read from the model class, since
    wrappers (PEFT, accelerate) take **kwargs."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else unwrapped(model)
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def returned_cache(output) -> Cache | None:
    """The KV cache a forward returned (`cache` from transformers 5.24, `past_key_values` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


class OneDtypeStaticLayer(StaticLayer):
    """A preallocated layer that stores keys and values in one dtype (`cache_dtype`). Under autocast the
    keys come out of the rotary embedding in fp32 while the values stay bf16, and a preallocated
    buffer, unlike a growing one, must take both in its own dtype."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
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
    # allocates nothing: only its layer kinds are read
    planned = StaticCache(config=model.config, max_cache_len=max_length)
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
        target.update(
            source.keys.to(dtype).repeat_interleave(repeats, dim=0),
            source.values.to(dtype).repeat_interleave(repeats, dim=0),
        )
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


class EagerSteps:
    """Decoding steps as forward calls of the whole batch, finished rows included, into a cache laid out
    once (`static_decode_cache`) where the model allows it, else the growing one."""

    name = "eager"

    def __init__(
        self, model: torch.nn.Module, prefill: Cache, query_mask: torch.Tensor, repeats: int, max_new_tokens: int
    ):
        batch, self.width = query_mask.shape
        self.model, self.keyword = model, cache_keyword(model)
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
        out = self.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=visible,
            position_ids=self.position + step,
            use_cache=True,
            **{self.keyword: self.cache},
        )
        return out.logits[:, -1]
