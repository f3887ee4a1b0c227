"""A model folder with random weights in the shape of another folder's `config.json`, with that folder's
tokenizer: what every rlhfkit stage loads, at a real model's size, where its weights cannot travel.

    python benchmarks/random_model.py --like .gpu/smollm2-135m --out /tmp/random-135m          # on a GPU
    python benchmarks/random_model.py --like .gpu/smollm2-135m --out /tmp/random-tiny --tiny   # smoke test

`--tiny` keeps the tokenizer and the architecture but shrinks the decoder to 2 layers of width 64, so a
CPU can run the GPU suite's stage part as a check of its commands. The weights are fp32, drawn from the
architecture's own initialiser seeded by `--seed`; the config is the copied one, dropout included.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

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
    parser.add_argument("--tiny", action="store_true", help="2 layers of width 64, for a CPU smoke test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    config = AutoConfig.from_pretrained(args.like)
    for key, value in (TINY if args.tiny else {}).items():
        setattr(config, key, value)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(args.out)
    AutoTokenizer.from_pretrained(args.like).save_pretrained(args.out)
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": args.out, "like": args.like, "parameters": parameters, "tiny": args.tiny}))


if __name__ == "__main__":
    main()
