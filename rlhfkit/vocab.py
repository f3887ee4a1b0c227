"""Detail 3: a PAD token distinct from EOS, and the embedding row it needs.

A tokenizer whose PAD is its EOS (SmolLM2's, many hub models') gains rlhfkit's [PAD]; a model whose
embeddings lack its row gains a zero row, the same in every model built from the same source and on every
reload. PAD is never sampled and no log-probability gives it mass (logprobs.pad_token_of), so the row
changes no other token's probability.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from .errors import ModelError

PAD_TOKEN = "[PAD]"


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Detail 3: give the tokenizer a [PAD] distinct from EOS; return True when a token was added."""
    if tokenizer.eos_token_id is None:
        raise ModelError("the tokenizer has no EOS token; completions must end with one (Detail 3)")
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return False
    added = tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return added > 0


def match_vocab(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, source: str = "the model") -> None:
    """Give the model rows for every token of the tokenizer, refusing a tokenizer that is not the model's.

    Only the [PAD] that `ensure_pad_token` added may be missing (Detail 3). Its row is zero, not drawn at
    random: every model built from the same source (policy, reference, value and reward model) and every
    reload holds the same row, so KL is 0 and the ratio 1 at step 0 and a resumed run is bit-identical. No
    log-probability gives PAD mass and it is never sampled (logprobs.pad_token_of), so the row changes
    no other token's probability."""
    rows, needed = model.get_input_embeddings().num_embeddings, len(tokenizer)
    own_tokens = needed - (1 if has_added_pad(tokenizer) else 0)
    if own_tokens > rows:
        raise ModelError(
            f"{source}: its tokenizer has {own_tokens} tokens but the model's embeddings have {rows} rows: "
            "the tokenizer does not belong to this model; save the model's own tokenizer beside it "
            "(tokenizer.save_pretrained)"
        )
    if needed > rows:
        add_zero_rows(model, needed)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id


def has_added_pad(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's PAD is rlhfkit's [PAD], added last (a model saved by rlhfkit has its row already)."""
    return tokenizer.pad_token == PAD_TOKEN and tokenizer.pad_token_id == len(tokenizer) - 1


def add_zero_rows(model: torch.nn.Module, rows: int) -> None:
    """Grow the input (and an untied output) embedding to `rows`, the new rows zero. `resize_token_embeddings`
    draws them from the global RNG, which is forked so that loading a model leaves the run's random stream as it was."""
    before = model.get_input_embeddings().num_embeddings
    with torch.random.fork_rng(devices=[]):
        model.resize_token_embeddings(rows, mean_resizing=False)
    matrices = {
        id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    }
    with torch.no_grad():
        for weight in matrices.values():
            weight[before:] = 0.0
