"""LoRA adapters (peft) on the trained models of every stage.

`lora_rank > 0` wraps every linear layer of the decoder blocks (or `lora_target_modules`) of the policy,
or of a reward/value model's backbone, in a LoRA adapter; the base weights are frozen, and the scalar
heads of reward and value models stay fully trainable. The adapter's B matrix starts at zero, so an
adapted model computes exactly what its base does until the first step: that is what lets the
adapter-disabled policy serve as the frozen reference (`AdapterDisabled`), with no second copy loaded.

Checkpoints hold the adapter (and scalar heads), never the base weights: resume rebuilds the base
from `model=` (or the reward model) and loads the adapter over it. The final `model/` folder is the
merged model, loadable by plain `transformers`; `adapter/` beside it holds the adapter alone.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .config import LoraOptions, ModelSource
from .errors import ConfigError, ModelError
from .faults import continue_run, room_for
from .models import backbone_of, decoder_layers, load_policy
from .reward_models import LENGTH_HEAD, PEFT_WRAPPER, SCALAR_HEAD, ScalarModel

ADAPTER_FOLDER = "adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def decoder_linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct names of the linear layers inside the decoder blocks (q_proj, ..., down_proj for
    Llama; query_key_value, ..., dense_4h_to_h for GPT-NeoX): the LM head and embeddings are outside."""
    _, blocks = decoder_layers(backbone_of(model))
    return sorted(
        {name.rsplit(".", 1)[-1] for name, module in blocks.named_modules() if isinstance(module, torch.nn.Linear)}
    )


def lora_config(lora: LoraOptions, model: torch.nn.Module):
    from peft import LoraConfig

    targets = list(lora.target_modules) or decoder_linear_names(model)
    return LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, bias="none"
    )


def add_adapter(model: torch.nn.Module, lora: LoraOptions, saved: Path | None = None) -> torch.nn.Module:
    """`model` itself with a fresh LoRA adapter injected into its linear layers (base weights frozen),
    or the adapter saved in `saved` (a checkpoint's model folder) loaded over it. The model stays the
    transformers (or scalar) model it was, so every caller treats it as before; the peft wrapper that
    saves, merges and switches the adapter rides along (`peft_part`). A scalar model keeps its heads
    trainable, read from `saved` too when given."""
    from peft import get_peft_model, set_peft_model_state_dict

    target = model.backbone if isinstance(model, ScalarModel) else model
    try:
        wrapper = get_peft_model(target, lora_config(lora, model))
    except ValueError as e:  # peft names the modules it could not match
        raise ConfigError(f"lora_target_modules={lora.target_modules}: {e}") from e
    target.__dict__[PEFT_WRAPPER] = wrapper  # outside the module tree: no parameter is listed twice
    if saved is not None:
        weights = Path(saved) / ADAPTER_WEIGHTS
        if not weights.is_file():
            raise ModelError(f"{saved} holds no {ADAPTER_WEIGHTS}: it was saved without LoRA; resume with lora_rank=0")
        result = set_peft_model_state_dict(wrapper, load_file(str(weights)))
        if result.unexpected_keys:
            raise ModelError(
                f"{weights} does not fit this model and LoRA settings (unexpected: {result.unexpected_keys[:3]})"
            )
        if isinstance(model, ScalarModel):
            load_heads(model, Path(saved))
    return model


def load_heads(model: ScalarModel, folder: Path) -> None:
    model.head.load_state_dict(load_file(str(folder / SCALAR_HEAD)))
    if model.length_head is not None:
        model.length_head.load_state_dict(load_file(str(folder / LENGTH_HEAD)))


def peft_part(model: torch.nn.Module):
    """The peft wrapper of an adapted model (of a scalar model's backbone), else None."""
    inner = model.backbone if isinstance(model, ScalarModel) else model
    return inner.__dict__.get(PEFT_WRAPPER)


def is_adapted(model: torch.nn.Module) -> bool:
    return peft_part(model) is not None


def trainable_summary(model: torch.nn.Module) -> str:
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return f"{trained:,} of {total:,} parameters trainable ({100 * trained / total:.2f}%)"


class AdapterDisabled(torch.nn.Module):
    """The frozen reference as the adapted policy with its adapter switched off: the starting policy's
    weights, shared rather than copied. Every forward pass through it, or through its backbone (the
    fast log-probability path calls the backbone directly), runs with the adapter off; everything
    else (config, LM head, parameters for the device) is read from the policy.

    The policy is held outside the module tree, so moving, freezing or switching this wrapper to
    evaluation mode never touches the policy's parameters."""

    def __init__(self, model: torch.nn.Module, switch=None):
        super().__init__()
        switch = switch or peft_part(model)
        if switch is None:
            raise ModelError("AdapterDisabled needs a model with a LoRA adapter")
        self.__dict__.update(inner=model, switch=switch)

    def forward(self, *args, **kwargs):
        with self.switch.disable_adapter():
            return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        value = getattr(self.__dict__["inner"], name)
        if isinstance(value, torch.nn.Module) and name == getattr(self.inner, "base_model_prefix", None):
            return AdapterDisabled(value, self.switch)
        return value

    def parameters(self, recurse: bool = True):
        return self.inner.parameters(recurse)

    def to(self, *args, **kwargs):
        return self  # it lives where the policy does

    def requires_grad_(self, requires_grad: bool = True):
        return self  # the policy's adapter keeps training


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of an adapted model with the adapter merged into the base weights, without peft: what a
    plain `from_pretrained` of the saved folder computes. The trained model itself is left as it is."""
    merged = copy.deepcopy(model)
    target = merged.backbone if isinstance(merged, ScalarModel) else merged
    target.__dict__.pop(PEFT_WRAPPER).merge_and_unload()  # merges into `target` in place
    return merged


def save_weights(model: torch.nn.Module, folder: Path) -> None:
    """`save_pretrained` of a model, or of its adapter alone (plus a scalar model's heads and metadata)
    when it has one: what a checkpoint holds. Embedding layers are never saved with an adapter: resume
    rebuilds the base from its source, a new PAD row included."""
    extra = {"save_embedding_layers": False} if is_adapted(model) else {}
    owner = peft_part(model) if extra and not isinstance(model, ScalarModel) else model
    owner.save_pretrained(folder, safe_serialization=True, **extra)


def save_final_model(model: torch.nn.Module, tokenizer: Any, run_dir: Path, folder: str = "model") -> Path:
    """The trained model as `run_dir/folder`, loadable by plain transformers: with an adapter, merged
    into the base weights, and the adapter alone beside it in `run_dir/adapter` (`value_adapter` for
    the folder `value`)."""
    out = run_dir / folder
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with room_for(run_dir, f"the final model {folder}/", size, continue_run(run_dir)):
        if is_adapted(model):
            adapter = run_dir / (ADAPTER_FOLDER if folder == "model" else f"{folder}_{ADAPTER_FOLDER}")
            save_weights(model, adapter)
            tokenizer.save_pretrained(adapter)
            model = merged_copy(model)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    return out


def trained_policy(source: ModelSource, lora: LoraOptions, checkpoint: Path | None) -> tuple[torch.nn.Module, Any]:
    """The policy a stage trains, and its tokenizer: `model=`, or the checkpoint's model when resuming;
    with LoRA, `model=` with a fresh adapter, or with the checkpoint's adapter loaded over it."""
    saved = checkpoint / "model" if checkpoint else None
    if not lora.enabled:
        return load_policy(str(saved or source.model), source.trust_remote_code, allow_pickle=source.allow_pickle)
    policy, tokenizer = load_policy(source.model, source.trust_remote_code, allow_pickle=source.allow_pickle)
    return add_adapter(policy, lora, saved), tokenizer


def frozen_reference(source: ModelSource, policy: torch.nn.Module, path: str) -> torch.nn.Module:
    """The frozen reference policy loaded from `path` as `source` allows; with LoRA and `path` the
    policy's own starting model (`source.model`), the policy with its adapter off instead of a second copy."""
    if is_adapted(policy) and path == source.model:
        return AdapterDisabled(policy)
    return load_policy(path, source.trust_remote_code, allow_pickle=source.allow_pickle)[0]
