"""Reward models as the stages load them: a folder written by `rlhfkit rm` (`ScalarModel`), a
sequence classifier trained elsewhere (TRL's `RewardTrainer` writes these), or a DPO policy's implicit
reward (Detail 19), each behind the reward model's interface."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from .errors import ModelError
from .models import (
    DPO_RECORD,
    SCALAR_CONFIG,
    ScalarModel,
    check_model_source,
    disable_dropout,
    load_policy,
    load_tokenizer,
    model_loading,
    resolve_model_path,
)
from .preference_ops import PreferenceObjective, implicit_rewards
from .vocab import match_vocab


def classifier_architectures(source: str, trust_remote_code: bool) -> list[str]:
    """The `ForSequenceClassification` architectures a folder's or hub id's config.json names."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return []
    return [a for a in (config.architectures or []) if a.endswith("ForSequenceClassification")]


def from_sequence_classifier(source: str, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool = False) -> ScalarModel:
    """A reward model trained elsewhere (TRL's RewardTrainer writes these): an
    AutoModelForSequenceClassification with one output, as a ScalarModel whose eos-linear head is its
    score layer, read at the response's EOS like rlhfkit's own (Detail 12). Its embeddings get the row of
    the [PAD] the tokenizer gained when its PAD was its EOS, as a policy's do (vocab.match_vocab)."""
    from transformers import AutoModelForSequenceClassification

    with model_loading(source):
        classifier = AutoModelForSequenceClassification.from_pretrained(source, trust_remote_code=trust_remote_code, dtype=torch.float32,
                                                                        use_safetensors=True)  # never unpickled (docs/reliability.md)
    match_vocab(classifier, tokenizer, f"reward_model={source}")
    if classifier.config.num_labels != 1:
        raise ModelError(f"{source} is a sequence classifier with {classifier.config.num_labels} outputs; a reward model has one")
    score = next((getattr(classifier, name) for name in ("score", "classifier") if isinstance(getattr(classifier, name, None), torch.nn.Linear)), None)
    if score is None:
        raise ModelError(f"{source}: its classification head is not one linear layer named score or classifier; rlhfkit cannot read it at EOS")
    model = ScalarModel(disable_dropout(classifier.base_model), "eos-linear", classifier.config.pad_token_id)
    with torch.no_grad():
        model.head.weight.copy_(score.weight)
        model.head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))
    return model


def load_reward_model(folder: str | Path, trust_remote_code: bool = False) -> tuple[ScalarModel, PreTrainedTokenizerBase]:
    """A reward model and its tokenizer: a folder written by `rlhfkit rm`, or any
    AutoModelForSequenceClassification folder or hub id with one output."""
    check_model_source(str(folder))
    source = resolve_model_path(str(folder))
    if (Path(source) / SCALAR_CONFIG).is_file() or Path(source).is_dir() and not (Path(source) / "config.json").is_file():
        model = ScalarModel.from_pretrained(source, trust_remote_code)
    elif classifier_architectures(source, trust_remote_code):
        model = from_sequence_classifier(source, load_tokenizer(source, trust_remote_code), trust_remote_code)
    else:
        raise ModelError(f"{folder} is not a reward model folder: it has no {SCALAR_CONFIG} (a model written by `rlhfkit rm`) and "
                         "its config.json names no ForSequenceClassification architecture (a reward model trained elsewhere)")
    return model.eval(), load_tokenizer(source, trust_remote_code)



class ImplicitRewardModel(torch.nn.Module):
    """The reward a preference loss implicitly fits, behind the reward model's interface, so `rlhfkit
    rm-eval` scores a DPO-family policy exactly as it scores a reward model (Detail 19): beta * (log
    pi(y|x) - log pi_ref(y|x)) (equation 5) for dpo, ipo and cdpo, beta * log pi(y|x) / |y| for simpo,
    which has no reference (`reference` is None)."""

    head_type = "dpo-implicit"

    def __init__(self, policy: torch.nn.Module, reference: torch.nn.Module | None, objective: PreferenceObjective):
        super().__init__()
        self.policy, self.reference, self.objective = policy, reference, objective

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        from .logprobs import sequence_logprobs

        policy = sequence_logprobs(self.policy, input_ids, attention_mask, response_mask)
        reference = sequence_logprobs(self.reference, input_ids, attention_mask, response_mask) if self.objective.uses_reference else None
        return implicit_rewards(policy, self.objective, reference, response_mask.sum(-1)).float()


def recorded_objective(record: dict, beta: float) -> PreferenceObjective:
    """The preference loss `rlhfkit dpo` recorded (a record without a loss type is DPO's), `beta` given in place of its own."""
    return PreferenceObjective(record.get("loss_type", "dpo"), beta or record.get("beta", 0.0), record.get("label_smoothing", 0.0),
                               record.get("simpo_gamma", 0.0))


def load_implicit_reward_model(folder: str | Path, reference: str, beta: float, trust_remote_code: bool = False
                               ) -> tuple[ImplicitRewardModel, PreTrainedTokenizerBase]:
    """A DPO-family policy as a reward model. The loss type, `reference` and `beta` default to what
    `rlhfkit dpo` recorded in the folder; a policy from elsewhere needs reference and beta given (DPO's reward)."""
    record_path = Path(folder) / DPO_RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    objective = recorded_objective(record, beta)
    reference = reference or record.get("reference_model", "")
    if not objective.beta or objective.uses_reference and not reference:
        raise ModelError(f"{folder} is neither a reward model ({SCALAR_CONFIG} missing) nor a DPO policy written by "
                         f"`rlhfkit dpo` ({DPO_RECORD} missing): to score a policy's implicit reward give reference_model= and beta=")
    policy, tokenizer = load_policy(str(folder), trust_remote_code)
    reference_policy = load_policy(reference, trust_remote_code)[0] if objective.uses_reference else None
    return ImplicitRewardModel(policy, reference_policy, objective).eval(), tokenizer
