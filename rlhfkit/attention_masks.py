"""4-D attention masks: what several rows packed into one may attend to, and the form a model's attention
takes such a mask in.

Packed reward-model pairs (`data.collate.pack_pairs`), shared-prefix rows (`shared_rows.pack_groups`) and
decoding from buffers shared by several batch sizes (`decoding.buckets`) each hand the model a mask of their
own instead of letting it build a causal one from a 2-D padding mask. Only some attention implementations
take such a mask as it is, and they take it in different forms; both facts live here.
"""

from __future__ import annotations

import torch

ATTENTION_WITH_4D_MASKS = ("sdpa", "eager")  # implementations that take a prepared 4-D mask as it is

# segment ids of a packed row (`block_sees`): the shared query, then one id per response (1, 2, ...), padding
QUERY, PADDING = 0, -1


def block_sees(segments: torch.Tensor) -> torch.Tensor:
    """(N, L, L) what each position of a packed row may attend to, given its (N, L) segment ids (QUERY,
    then one id per response, PADDING): earlier positions of the query and of its own segment, never
    padding; a padding position sees itself, so no softmax is over nothing (SDPA gives NaN for an
    all-masked row, and 0 x NaN would still poison a gradient)."""
    width = segments.size(1)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    sees = causal & (key != PADDING) & ((key == QUERY) | (key == query))
    return sees | torch.eye(width, dtype=torch.bool)


def mask_obstacle(model: torch.nn.Module) -> str | None:
    """Why `model`'s attention cannot take a prepared 4-D mask as it is, or None."""
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in ATTENTION_WITH_4D_MASKS:
        return f"attention implementation {attention!r} takes no custom 4-D mask (sdpa and eager do)"
    return None


def mask_as_attention_takes_it(model: torch.nn.Module, sees: torch.Tensor) -> torch.Tensor:
    """A boolean 4D mask (True: the query may attend to the key) in the form `model`'s attention takes as it is:
    booleans for sdpa; for eager attention, which adds the mask to its scores, 0 / most-negative in the embeddings'
    dtype, as transformers builds it (a boolean there would add 1 and 0 and attend everywhere)."""
    if model.config._attn_implementation == "sdpa":
        return sees
    dtype = model.get_input_embeddings().weight.dtype
    return torch.zeros((), dtype=dtype, device=sees.device).masked_fill(~sees, torch.finfo(dtype).min)
