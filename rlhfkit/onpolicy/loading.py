"""Loading an on-policy stage's models with the checks that name the option at fault: a model that is not given
or cannot load, a reward or value model that does not read the policy's tokens, a value model without a
per-token head, a teacher that would score other tokens than the student's."""

from __future__ import annotations

from ..errors import ConfigError, ModelError
from ..models import check_model_source
from ..reward_models import ScalarModel, load_reward_model


def require_folder(path: str, key: str, what: str) -> None:
    """Fail at start, naming the key, when a model is not given or is a local folder that cannot load."""
    if not path:
        raise ConfigError(f"{key} is required: {what}")
    check_model_source(path, key)


def check_same_tokenizer(policy_tok, other_tok, policy_path: str, other_path: str) -> None:
    if policy_tok.get_vocab() != other_tok.get_vocab() or (policy_tok.pad_token_id, policy_tok.eos_token_id) != (
        other_tok.pad_token_id, other_tok.eos_token_id):
        raise ModelError(f"the policy ({policy_path}) and {other_path} have different tokenizers; the reward and value "
                         "models must read the policy's tokens: train the reward model from this SFT model")


def load_value_model(source: str, tokenizer, policy_path: str, trust_remote_code: bool) -> ScalarModel:
    """A value model from a reward model: rlhfkit's own or a sequence classifier trained elsewhere."""
    require_folder(
        source, "value_model", "give the model/ folder written by `rlhfkit rm`, or a sequence-classification model"
    )
    value, value_tok = load_reward_model(source, trust_remote_code)
    if value.head_type != "eos-linear":
        raise ModelError(
            f"value_model={source} has a {value.head_type} head; a value model needs a per-token "
            "(eos-linear) head: give value_model= an eos-linear reward model"
        )
    check_same_tokenizer(tokenizer, value_tok, policy_path, f"the value model ({source})")
    return value


def check_teacher_vocabulary(student_tok, teacher_tok, teacher_rows: int, teacher_path: str) -> None:
    """A teacher reads the student's token ids and scores them by its own vocabulary: a tokenizer that is not the
    student's, token for token, would score other tokens than those sampled, silently. The teacher's embedding
    may have more rows than tokens (padded to a multiple), never fewer."""
    student_vocab, teacher_vocab = student_tok.get_vocab(), teacher_tok.get_vocab()
    if teacher_vocab != student_vocab:
        differ = sum(teacher_vocab.get(token) != index for token, index in student_vocab.items())
        raise ModelError(
            f"teacher={teacher_path} has another tokenizer: {len(teacher_vocab)} tokens against the student's "
            f"{len(student_vocab)}, {differ} of the student's tokens with another id or none; a teacher must read the "
            "student's token ids: distil from a teacher of the same tokenizer (the same model family)"
        )
    if teacher_rows < len(student_vocab):
        raise ModelError(
            f"teacher={teacher_path} has {teacher_rows} embedding rows for the tokenizer's {len(student_vocab)} "
            "tokens: its checkpoint does not fit its tokenizer"
        )
