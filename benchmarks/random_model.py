"""A model folder with random weights in the shape of another folder's `config.json`, with that folder's
tokenizer: what every rlhfkit stage loads, at a real model's size, where its weights cannot travel.

    python benchmarks/random_model.py --like .gpu/smollm2-135m --out /tmp/random-135m          # on a GPU
    python benchmarks/random_model.py --like .gpu/smollm2-135m --out /tmp/random-tiny --tiny   # smoke test
    python benchmarks/random_model.py --like .gpu/smollm2-135m --shape llama-3.2-1b --out /tmp/random-1b

`--shape NAME` takes the decoder of a published config shipped in rlhfkit/model_configs instead of `--like`'s, with
`--like`'s tokenizer: its vocabulary size, BOS and EOS replace the config's, since a model's own tokenizer
cannot travel either (Llama-3.2-1B's decoder then has SmolLM2's 49,152-row embedding, not its own 128,256).
`--tiny` keeps the tokenizer and the architecture but shrinks the decoder to 2 layers of width 64, so a
CPU can run the GPU suite's stage part as a check of its commands. The weights are fp32, drawn from the
architecture's own initialiser seeded by `--seed`; the config is the copied one, dropout included.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from rlhfkit.model_shape import shipped_config

TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--like", required=True, help="folder with the config.json and tokenizer to copy")
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--shape", help="a config of rlhfkit/model_configs (e.g. llama-3.2-1b) for the decoder")
    parser.add_argument("--tiny", action="store_true", help="2 layers of width 64, for a CPU smoke test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.like)
    config = shaped_config(args.shape, tokenizer) if args.shape else AutoConfig.from_pretrained(args.like)
    for key, value in (TINY if args.tiny else {}).items():
        setattr(config, key, value)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        json.dumps(
            {"model": args.out, "like": args.like, "shape": args.shape, "parameters": parameters, "tiny": args.tiny}
        )
    )


def shaped_config(name: str, tokenizer) -> PretrainedConfig:
    """The shipped config `name` with `tokenizer`'s vocabulary: rlhfkit refuses a model whose embedding has more
    than twice the rows its tokenizer has tokens (rlhfkit.models.refuse_foreign_tokenizer)."""
    fields = shipped_config(name)
    fields |= {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return AutoConfig.for_model(fields.pop("model_type"), **{k: v for k, v in fields.items() if not k.startswith("_")})


if __name__ == "__main__":
    main()
