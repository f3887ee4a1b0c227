"""How the decoding steps after the prompt run (`decoding=`): eager forward calls of the whole batch
(`eager.py`), or batch-size buckets on buffers laid out once, each bucket's step replayed as a CUDA graph
or run eagerly (`buckets.py`). The way never changes what is sampled: `generation.py` samples every row
from its own RNG on the logits any of them return.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from . import buckets, eager

DECODING = ("auto", "eager", "cuda-graphs", "buckets")


def decoding_steps(
    model: torch.nn.Module,
    prefill: Cache,
    query_mask: torch.Tensor,
    repeats: int,
    mode: str,
    max_new_tokens: int,
    logits: torch.Tensor,
) -> eager.EagerSteps | buckets.BucketSteps:
    """How a call decodes `max_new_tokens` after the prompt: `mode` is one of `DECODING` ("auto": CUDA
    graphs on a CUDA device, eager steps elsewhere), falling back to eager steps, with the reason logged,
    where the model cannot. `logits` are the prompt's last ones, per row, which bucketed steps keep
    updating in place."""
    if mode not in DECODING:
        raise ValueError(f"decoding={mode!r}: choose one of {', '.join(DECODING)}")
    if mode == "auto":
        mode = "cuda-graphs" if query_mask.device.type == "cuda" else "eager"
    if mode != "eager":
        target = eager.unwrapped(model)
        length = query_mask.size(1) + max_new_tokens
        obstacle = buckets.bucket_obstacle(target, eager.plain_cache_layers(target, prefill, length))
        if mode == "cuda-graphs":
            obstacle = obstacle or buckets.graph_obstacle(target, query_mask.device)
        if obstacle is None:
            dtype = eager.cache_dtype(prefill.layers[0].keys, prefill.layers[0].values)
            decoder = buckets.decoder_for(
                target, prefill, query_mask.size(0), length, dtype, capture=mode == "cuda-graphs"
            )
            return buckets.BucketSteps(decoder, prefill, query_mask, repeats, logits)
        buckets.fall_back(target, obstacle)
    return eager.EagerSteps(model, prefill, query_mask, repeats, max_new_tokens)
