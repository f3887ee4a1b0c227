"""A model's shape (layers, widths, linear layers, parameter counts) read from its config.json alone, with
no weights: a local folder or file, a hub id, or a published config shipped with rlhfkit
(rlhfkit/model_configs), for `rlhfkit plan`. A config.json that cannot describe a model (a size that is
missing, zero or negative) is one line naming the file and the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import ConfigError

# published config.json files shipped with rlhfkit (rlhfkit/model_configs), read without network
SHIPPED_IDS = {"meta-llama/Llama-3.2-1B": "llama-3.2-1b", "HuggingFaceTB/SmolLM2-135M": "smollm2-135m"} | {
    f"EleutherAI/pythia-{size}-deduped": f"pythia-{size}-deduped" for size in ("1b", "2.8b", "6.9b")}
# looked up case-insensitively, by hub id or by its name alone (Llama-3.2-1B, as `rlhfkit plan --help`
# spells it); the embedded SmolLM2-135M-Instruct has the base model's shapes
SHIPPED = {
    spelling.lower(): name for hub_id, name in SHIPPED_IDS.items() for spelling in (hub_id, hub_id.split("/")[1])
}


def shipped_config(name: str) -> dict[str, Any]:
    return json.loads(resources.files("rlhfkit").joinpath("model_configs", f"{name}.json").read_text())


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


# the sizes every plan reads, by their transformers names (a config class may store them under its own,
# e.g. GPT-2's n_embd: `attribute_map`); the optional ones must be positive when given
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
OPTIONAL_SIZE_FIELDS = ("intermediate_size", "num_key_value_heads", "head_dim")


def check_sizes(values: dict[str, Any], attribute_map: dict[str, str], where: str) -> None:
    """Every size the plan divides or multiplies by is a whole number above 0: a config.json with a zero,
    negative or missing size fails here, naming the file and the field, instead of deep in transformers
    (a missing size would otherwise take the architecture's default and plan another model)."""
    for field in SIZE_FIELDS + OPTIONAL_SIZE_FIELDS:
        name = attribute_map.get(field, field)
        value = values.get(name)
        if value is None and field in OPTIONAL_SIZE_FIELDS:
            continue
        if value is None:
            raise ConfigError(f"{where} has no {name}; give the model's own config.json")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {name}={value!r} must be a whole number above 0")


def checked_for_model(values: Any, where: str):
    """The transformers config built from the dict of a config.json, once its model type and sizes are checked."""
    from transformers import CONFIG_MAPPING, AutoConfig

    if not isinstance(values, dict):
        raise ConfigError(f"{where} holds a JSON {type(values).__name__}, not a config object")
    model_type = values.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"{where}: model_type={model_type!r} is not a transformers model type")
    check_sizes(values, CONFIG_MAPPING[model_type].attribute_map, where)
    return AutoConfig.for_model(**values)


def model_config(source: str, key: str = "model"):
    """The transformers config of `source`: a shipped config, a config.json file, a folder holding one,
    or a hub id (the local Hugging Face cache, or the network). Errors name the key, in one line."""
    from transformers import AutoConfig

    try:
        if source.lower() in SHIPPED:
            return AutoConfig.for_model(**shipped_config(SHIPPED[source.lower()]))
        path, where = Path(source).expanduser(), f"{key}={source}"
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ConfigError(f"{key}={source}: the folder has no config.json")
            path, where = path / "config.json", f"{key}={source} (its config.json)"
        if path.is_file():
            return checked_for_model(json.loads(path.read_text()), where)
        if source.count("/") != 1 or source.startswith((".", "/", "~")):
            raise ConfigError(f"{key}={source}: no such file or folder, and not a hub id (org/name)")
        config = AutoConfig.from_pretrained(source)
        check_sizes(config.to_dict(), config.attribute_map, f"{key}={source}")
        return config
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{key}={source}: cannot read its config ({first_line(e)}); shipped configs: "
            f"{', '.join(SHIPPED_IDS)}; without network, HF_HUB_OFFLINE=1 skips the retries"
        ) from None


@dataclass(frozen=True)
class Shape:
    """What the formulas read from one architecture, counted on a model built on the meta device."""

    source: str
    architecture: str
    params: int  # the causal LM
    backbone_params: int  # without an untied LM head: a reward or value model's backbone
    layer_params: int  # one decoder block
    layer_linear_weights: int  # weights of one block's linear layers (what autocast casts)
    linears: tuple[tuple[str, int, int], ...]  # (name, instances over all blocks, sum of in + out) per block linear
    layers: int
    hidden: int
    heads: int
    kv_dim: int  # key/value heads x head dimension
    intermediate: int
    vocab: int
    gated: bool  # gate/up/down MLP with separate q/k/v (Llama) or plain MLP with fused qkv (GPT-NeoX)

    def lora_sum(self, targets: list[str]) -> tuple[int, int]:
        """(sum of in + out, wrapped linears per block) over the linears LoRA wraps (`targets`, or all)."""
        picked = [(n, c, s) for n, c, s in self.linears if not targets or n in targets]
        if targets and not picked:
            raise ConfigError(
                f"lora_target_modules={','.join(targets)} names no linear layer of {self.source}'s decoder "
                f"blocks ({', '.join(n for n, _, _ in self.linears)})"
            )
        return sum(s for _, _, s in picked), sum(c for _, c, _ in picked) // self.layers


def read_shape(source: str, key: str = "model") -> Shape:
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config(source, key)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"{key}={source}: transformers cannot build a causal LM from its config ({first_line(e)})"
        ) from None
    base = getattr(model, model.base_model_prefix, model)
    layers = config.num_hidden_layers
    blocks = next((m for m in base.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers), None)
    if blocks is None:
        raise ConfigError(f"{key}={source}: cannot find the {layers} decoder blocks of {type(model).__name__}")
    from transformers.pytorch_utils import Conv1D

    linears: dict[str, tuple[int, int]] = {}
    first_block: list[tuple[int, int]] = []
    for index, block in enumerate(blocks):
        for name, module in block.named_modules():
            if isinstance(module, torch.nn.Linear):
                size = (module.in_features, module.out_features)
            elif isinstance(module, Conv1D):
                size = (module.weight.shape[0], module.nf)
            else:
                continue
            leaf = name.rsplit(".", 1)[-1]
            count, total = linears.get(leaf, (0, 0))
            linears[leaf] = (count + 1, total + sum(size))
            if index == 0:
                first_block.append(size)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    return Shape(
        source=source,
        architecture=type(model).__name__,
        params=sum(p.numel() for p in model.parameters()),
        backbone_params=sum(p.numel() for p in base.parameters()),
        layer_params=sum(p.numel() for p in blocks[0].parameters()),
        layer_linear_weights=sum(i * o for i, o in first_block),
        linears=tuple((n, c, s) for n, (c, s) in sorted(linears.items())),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_dim=kv_heads * head_dim,
        intermediate=intermediate,
        vocab=model.get_input_embeddings().num_embeddings,
        gated=sum(o == intermediate for _, o in first_block) >= 2,
    )
