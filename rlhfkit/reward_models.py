"""The reward model: its architecture (`ScalarModel`, a causal LM's backbone plus a scalar head,
Details 10-14, and ODIN's length head) and how the stages load one: a folder written by `rlhfkit rm`,
a sequence classifier trained elsewhere (TRL's `RewardTrainer` writes these), or a DPO policy's
implicit reward (Detail 19), each behind the reward model's interface."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PreTrainedTokenizerBase
from transformers.modeling_utils import set_zero3_state

from .attention_masks import mask_as_attention_takes_it
from .errors import ModelError
from .logprobs import sequence_logprobs
from .models import (
    SCALAR_CONFIG,
    check_model_source,
    decoder_layers,
    disable_dropout,
    enable_activation_checkpointing,
    load_policy,
    load_tokenizer,
    model_loading,
    refuse_foreign_tokenizer,
    resolve_model_path,
    supplied_model,
)
from .ops import first_true_indices, head_orthogonality_loss, position_ids_from_mask
from .preference_ops import PreferenceObjective, implicit_rewards
from .shared_rows import SharedRows
from .supplied import is_supplied
from .vocab import match_vocab

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
    return torch.nn.Sequential(
        torch.nn.Linear(hidden_size, hidden_size), torch.nn.Tanh(), linear_head(hidden_size)
    )


HEADS = {"eos-linear": linear_head, "mean-mlp": mean_mlp_head}


def head_weights(head: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A head's weights as safetensors stores them: detached, contiguous, on the CPU."""
    return {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}


class ScalarModel(torch.nn.Module):
    """A causal LM's backbone plus a scalar head: the reward model, and the value model it initialises.

    `head="eos-linear"` reads the score at the EOS token (Detail 12); `head="mean-mlp"` averages the
    response's hidden states first. Both share this one code path: only the pooling differs.
    """

    def __init__(self, backbone: torch.nn.Module, head: str = "eos-linear", pad_token_id: int | None = None,
                 length_head: bool = False):
        super().__init__()
        if head not in HEADS:
            raise ModelError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
        if length_head and head != "eos-linear":
            raise ModelError(
                "length_head (ODIN) needs head=eos-linear: its orthogonality term compares two linear heads"
            )
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
    def from_policy(
        cls, policy: torch.nn.Module, head: str = "eos-linear", length_head: bool = False
    ) -> ScalarModel:
        """Detail 10: the reward model starts from the (SFT) policy's backbone; its LM head is dropped."""
        backbone = getattr(policy, policy.base_model_prefix)
        return cls(disable_dropout(backbone), head, policy.config.pad_token_id, length_head)

    def activation_checkpointing_enable(self) -> None:
        enable_activation_checkpointing(self.backbone)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Detail 14: positions follow the attention mask, so left and right padding see the same positions.
        positions = position_ids_from_mask(attention_mask)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)
        return out.last_hidden_state

    def per_token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) head output at every position (Detail 13: only the one at EOS is a valid reward)."""
        if self.head_type != "eos-linear":
            raise ModelError("per-token scores exist only for the eos-linear head")
        return self.head(self.hidden_states(input_ids, attention_mask)).squeeze(-1).float()

    def shared_hidden(self, shared: SharedRows) -> torch.Tensor:
        """(N, L, H) hidden states of shared rows (`shared_rows.pack_groups`)."""
        return self.backbone(**shared.inputs_for(self.backbone)).last_hidden_state

    def shared_per_token_scores(self, shared: SharedRows) -> torch.Tensor:
        """(B, R) `per_token_scores` at the positions that predict each response token, as a value model
        reads them, from shared rows."""
        if self.head_type != "eos-linear":
            raise ModelError("per-token scores exist only for the eos-linear head")
        return self.head(shared.per_response_token(self.shared_hidden(shared), shared.predictors)).squeeze(-1).float()

    def shared_scores(self, shared: SharedRows, response_mask: torch.Tensor) -> torch.Tensor:
        """(B,) scores of the responses of shared rows: at each one's last token (its EOS, Detail 12), or
        for the mean-mlp head the mean over its tokens (`response_mask`, (B, R))."""
        hidden = self.shared_hidden(shared)
        if self.head_type == "mean-mlp":
            pooled = mean_over(shared.per_response_token(hidden, shared.tokens), response_mask)
        else:
            pooled = shared.per_response(hidden)
        return self.head(pooled).squeeze(-1).float()

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
            return self.pair_scores(
                {"input_ids": input_ids, "attention_mask": attention_mask, **packed_pairs}
            )
        hidden = self.hidden_states(input_ids, attention_mask)
        if self.head_type == "mean-mlp":
            if response_mask is None:  # the response is whatever is unpadded after the query
                if context_length == 0:
                    raise ModelError(
                        "the mean-mlp head needs response_mask or context_length to find the response"
                    )
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
        hidden = self.backbone(
            input_ids=batch["input_ids"],
            attention_mask=mask_as_attention_takes_it(self.backbone, batch["pair_mask"]),
            position_ids=batch["position_ids"],
        ).last_hidden_state
        if self.head_type == "mean-mlp":
            return mean_over(hidden, batch["chosen_mask"]), mean_over(hidden, batch["rejected_mask"])
        rows = torch.arange(hidden.size(0), device=hidden.device)
        chosen = hidden[rows, last_true_index(batch["chosen_mask"])]
        return chosen, hidden[rows, last_true_index(batch["rejected_mask"])]

    def pair_scores(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rewards of the chosen and rejected responses of a packed batch, and with an ODIN length head
        that head's scores too (`chosen_length`, `rejected_length`)."""
        chosen, rejected = self.pair_features(batch)
        scores = {"chosen": self.head(chosen).squeeze(-1).float(),
                  "rejected": self.head(rejected).squeeze(-1).float()}
        if self.length_head is not None:
            scores["chosen_length"] = self.length_head(chosen).squeeze(-1).float()
            scores["rejected_length"] = self.length_head(rejected).squeeze(-1).float()
            overlap = head_orthogonality_loss(self.head.weight, self.length_head.weight)
            scores["orthogonality"] = overlap.float()
        return scores

    def reward_index(self, input_ids: torch.Tensor, context_length: int = 0) -> torch.Tensor:
        """Detail 12: the EOS position = first PAD after the query, minus 1 (the last token when no PAD)."""
        return first_true_indices(input_ids[:, context_length:] == self.pad_token_id) - 1 + context_length

    @property
    def output_bias(self) -> torch.nn.Parameter:
        return self.head[-1].bias if isinstance(self.head, torch.nn.Sequential) else self.head.bias

    def save_pretrained(self, folder: str | Path, safe_serialization: bool = True, **kwargs) -> None:
        """The folder `from_pretrained` reads. The weights are those of the transformers sequence classifier
        that computes this reward (`as_sequence_classifier`), so `AutoModelForSequenceClassification` loads
        it with its trained head; a head no classifier has (mean-mlp) leaves the bare backbone. The heads
        are also kept whole (bias included) in SCALAR_HEAD, which is what rlhfkit reads."""
        folder = Path(folder)
        # with a LoRA adapter (adapters.py), the adapter alone: the base is rebuilt from its source
        adapter = self.backbone.__dict__.get(PEFT_WRAPPER)
        owner = adapter or as_sequence_classifier(self.backbone, self.head) or self.backbone
        owner.save_pretrained(folder, safe_serialization=True, **kwargs)
        save_file(head_weights(self.head), str(folder / SCALAR_HEAD))
        if self.length_head is not None:
            save_file(head_weights(self.length_head), str(folder / LENGTH_HEAD))
        meta = {"head": self.head_type, "pad_token_id": self.pad_token_id,
                "hidden_size": self.config.hidden_size, "length_head": self.length_head is not None}
        (folder / SCALAR_CONFIG).write_text(json.dumps(meta, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str | Path, trust_remote_code: bool = False) -> ScalarModel:
        folder = Path(folder)
        meta_path = folder / SCALAR_CONFIG
        if not meta_path.is_file():
            raise ModelError(f"{folder} is not a reward/value model folder ({SCALAR_CONFIG} missing); "
                             "train one with `rlhfkit rm`")
        if not (folder / SCALAR_HEAD).is_file():
            raise ModelError(f"{folder} has {SCALAR_CONFIG} but no {SCALAR_HEAD}: the scalar head is "
                             "missing; re-save it with `rlhfkit rm`")
        meta = json.loads(meta_path.read_text())
        backbone = saved_backbone(folder, trust_remote_code)
        model = cls(disable_dropout(backbone), meta["head"], meta["pad_token_id"],
                    meta.get("length_head", False))
        model.head.load_state_dict(load_file(str(folder / SCALAR_HEAD)))
        if model.length_head is not None:
            if not (folder / LENGTH_HEAD).is_file():
                raise ModelError(
                    f"{folder}/{SCALAR_CONFIG} names an ODIN length head but {LENGTH_HEAD} is missing"
                )
            model.length_head.load_state_dict(load_file(str(folder / LENGTH_HEAD)))
        return model


def as_sequence_classifier(backbone: torch.nn.Module, head: torch.nn.Module) -> torch.nn.Module | None:
    """The transformers sequence classifier (one label) that computes an eos-linear head's reward: `backbone`
    itself (shared, not copied) under the classifier transformers builds for its architecture, with `head` as
    its `score` layer, which reads the last token before the right padding: the EOS (Detail 12). None where no
    such classifier exists: a mean-mlp head, or an architecture whose classifier pools otherwise (BERT's).

    Decoder classifiers have no bias in `score`: there the head's bias (Detail 15's normalisation) is
    recorded in the config as `rlhfkit_score_bias`, since the classifier's logits are rlhfkit's reward minus it."""
    if not isinstance(head, torch.nn.Linear):
        return None
    config = copy.deepcopy(backbone.config)
    config.num_labels = 1
    try:
        # no weights of its own: the backbone and head are put in below. set_zero3_state tells transformers that
        # ZeRO-3 partitioning is already handled, since under `sharding=zero3` only the saving process builds this
        # skeleton and partitioning it would wait forever on a broadcast the other processes never join
        with torch.device("meta"), set_zero3_state():
            classifier = AutoModelForSequenceClassification.from_config(config)
    except (ValueError, KeyError):  # no classifier for this model type
        return None
    score = getattr(classifier, "score", None)
    if not isinstance(score, torch.nn.Linear) or type(classifier.base_model) is not type(backbone):
        return None
    setattr(classifier, classifier.base_model_prefix, backbone)
    classifier.score = score_layer(head, with_bias=score.bias is not None)
    if score.bias is None:
        classifier.config.rlhfkit_score_bias = float(head.bias.detach())
    return classifier


def score_layer(head: torch.nn.Linear, with_bias: bool) -> torch.nn.Linear:
    """A copy of `head`, with its bias or, for a classifier whose `score` has none, without it."""
    score = torch.nn.Linear(head.in_features, head.out_features, bias=with_bias, dtype=head.weight.dtype)
    with torch.no_grad():
        score.weight.copy_(head.weight)
        if with_bias:
            score.bias.copy_(head.bias)
    return score


def saved_backbone(folder: Path, trust_remote_code: bool) -> torch.nn.Module:
    """The backbone of a folder `ScalarModel.save_pretrained` wrote: inside a sequence classifier, or bare (a
    mean-mlp head, and every reward model saved before 2026-11c)."""
    with model_loading(str(folder)):
        if classifier_architectures(str(folder), trust_remote_code):
            return AutoModelForSequenceClassification.from_pretrained(
                folder, trust_remote_code=trust_remote_code, use_safetensors=True, dtype=torch.float32
            ).base_model
        return AutoModel.from_pretrained(
            folder, trust_remote_code=trust_remote_code, use_safetensors=True, dtype=torch.float32
        )


def classifier_architectures(source: str, trust_remote_code: bool) -> list[str]:
    """The `ForSequenceClassification` architectures a folder's or hub id's config.json names."""
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return []
    return [a for a in (config.architectures or []) if a.endswith("ForSequenceClassification")]


def from_sequence_classifier(
    source: str, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool = False
) -> ScalarModel:
    """A reward model trained elsewhere (TRL's RewardTrainer writes these): an
    AutoModelForSequenceClassification with one output, as a ScalarModel whose eos-linear head is its
    score layer, read at the response's EOS like rlhfkit's own (Detail 12). Its embeddings get the row of
    the [PAD] the tokenizer gained when its PAD was its EOS, as a policy's do (vocab.match_vocab)."""
    with model_loading(source):
        classifier = AutoModelForSequenceClassification.from_pretrained(
            source, trust_remote_code=trust_remote_code, dtype=torch.float32,
            use_safetensors=True,  # never unpickled (docs/reliability.md)
        )
    return scalar_from_classifier(classifier, tokenizer, source)


def scalar_from_classifier(classifier: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, source: str) -> ScalarModel:
    """`from_sequence_classifier` for a classifier already loaded."""
    refuse_foreign_tokenizer(classifier, tokenizer, f"reward_model={source}")
    match_vocab(classifier, tokenizer, f"reward_model={source}")
    if classifier.config.num_labels != 1:
        raise ModelError(f"{source} is a sequence classifier with {classifier.config.num_labels} outputs; "
                         "a reward model has one")
    score = next((getattr(classifier, name) for name in ("score", "classifier")
                  if isinstance(getattr(classifier, name, None), torch.nn.Linear)), None)
    if score is None:
        raise ModelError(f"{source}: its classification head is not one linear layer named score or "
                         "classifier; rlhfkit cannot read it at EOS")
    model = ScalarModel(disable_dropout(classifier.base_model), "eos-linear", classifier.config.pad_token_id)
    with torch.no_grad():
        model.head.weight.copy_(score.weight)
        model.head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))
    return model


def load_reward_model(
    folder: str | Path, trust_remote_code: bool = False
) -> tuple[ScalarModel, PreTrainedTokenizerBase]:
    """A reward model and its tokenizer: a folder written by `rlhfkit rm`, or any
    AutoModelForSequenceClassification folder or hub id with one output."""
    check_model_source(str(folder))
    if is_supplied(str(folder)):
        return supplied_reward_model(str(folder)).eval(), load_tokenizer(str(folder))
    source = resolve_model_path(str(folder))
    written_by_rm = (Path(source) / SCALAR_CONFIG).is_file()
    if written_by_rm or Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        model = ScalarModel.from_pretrained(source, trust_remote_code)
    elif classifier_architectures(source, trust_remote_code):
        model = from_sequence_classifier(source, load_tokenizer(source, trust_remote_code), trust_remote_code)
    else:
        raise ModelError(f"{folder} is not a reward model folder: it has no {SCALAR_CONFIG} (a model written "
                         "by `rlhfkit rm`) and its config.json names no ForSequenceClassification "
                         "architecture (a reward model trained elsewhere)")
    return model.eval(), load_tokenizer(source, trust_remote_code)


def supplied_reward_model(spec: str) -> ScalarModel:
    """A reward model given to the Python API: rlhfkit's own (a `ScalarModel`, as `rlhfkit.rm` returns it) or a
    loaded sequence classifier with one output, copied in memory so that the caller's object stays as it was."""
    model, tokenizer = supplied_model(spec)
    if isinstance(model, ScalarModel):
        return copy.deepcopy(model).float()
    if type(model).__name__.endswith("ForSequenceClassification"):
        return scalar_from_classifier(copy.deepcopy(model).float(), load_tokenizer(spec), spec)
    raise ModelError(f"{spec} is a {type(model).__name__}: a reward model is rlhfkit's ScalarModel (what rlhfkit.rm "
                     "trains) or an AutoModelForSequenceClassification with one output")


DPO_RECORD = "rlhfkit_dpo.json"  # written beside a DPO-family policy: its loss type, weights and reference


class ImplicitRewardModel(torch.nn.Module):
    """The reward a preference loss implicitly fits, behind the reward model's interface, so `rlhfkit
    rm-eval` scores a DPO-family policy exactly as it scores a reward model (Detail 19): beta * (log
    pi(y|x) - log pi_ref(y|x)) (equation 5) for dpo, ipo and cdpo, beta * log pi(y|x) / |y| for simpo,
    which has no reference (`reference` is None)."""

    head_type = "dpo-implicit"

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None,
                 objective: PreferenceObjective):
        super().__init__()
        self.policy, self.reference, self.objective = policy, reference, objective

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
                ) -> torch.Tensor:
        policy = sequence_logprobs(self.policy, input_ids, attention_mask, response_mask)
        reference = None
        if self.objective.uses_reference:
            reference = sequence_logprobs(self.reference, input_ids, attention_mask, response_mask)
        return implicit_rewards(policy, self.objective, reference, response_mask.sum(-1)).float()


def recorded_objective(record: dict, beta: float) -> PreferenceObjective:
    """The preference loss `rlhfkit dpo` recorded (a record without a loss type is DPO's), `beta` given
    in place of its own."""
    return PreferenceObjective(record.get("loss_type", "dpo"), beta or record.get("beta", 0.0),
                               record.get("label_smoothing", 0.0), record.get("simpo_gamma", 0.0))


def load_implicit_reward_model(
    folder: str | Path, reference: str, beta: float, trust_remote_code: bool = False
) -> tuple[ImplicitRewardModel, PreTrainedTokenizerBase]:
    """A DPO-family policy as a reward model. The loss type, `reference` and `beta` default to what
    `rlhfkit dpo` recorded in the folder; a policy from elsewhere needs reference and beta given (DPO's
    reward)."""
    record_path = Path(folder) / DPO_RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    objective = recorded_objective(record, beta)
    reference = reference or record.get("reference_model", "")
    if not objective.beta or objective.uses_reference and not reference:
        raise ModelError(f"{folder} is neither a reward model ({SCALAR_CONFIG} missing) nor a DPO policy "
                         f"written by `rlhfkit dpo` ({DPO_RECORD} missing): to score a policy's implicit "
                         "reward give reference_model= and beta=")
    policy, tokenizer = load_policy(str(folder), trust_remote_code)
    reference_policy = load_policy(reference, trust_remote_code)[0] if objective.uses_reference else None
    return ImplicitRewardModel(policy, reference_policy, objective).eval(), tokenizer
