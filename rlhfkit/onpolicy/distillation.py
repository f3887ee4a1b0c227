"""On-policy distillation's teacher (docs/distillation.md): a frozen model that scores every token the student
samples, once per update, in the scoring pass.

    teacher_logprobs  log pi_T(y_t | prompt, y_<t) of each sampled token, at teacher_temperature
    teacher_features  what the teacher's whole next-token distributions are formed from, kept for the update
                      (distill_loss=jsd, topk-forward-kl): hidden states (B, R, H) and the teacher's LM head, so
                      the (B, R, V) logits of both models never exist at once

The three losses are the maths of distill_ops.py: reverse-kl-advantage enters the advantages
(advantages.with_teacher_advantages), the other two are a term of the update's loss (`Teacher.divergence`).
Self-distillation (teacher=self) is the student's own starting weights reading a privileged prompt: the prompt
with `teacher_hint` filled in from its columns (`hinted_queries`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

import torch

from .. import ops
from ..config import DistillOptions, ModelSource
from ..data.collate import left_pad_queries
from ..data.examples import SFTExample
from ..data.formats import CHAT, encode_chat_query, encode_text
from ..distill_ops import chunked_divergence, generalized_jsd, topk_forward_kl_of_logits
from ..errors import ConfigError, warn
from ..logprobs import HeadInputs, pad_token_of, plain_lm_head, response_head_inputs
from ..models import load_policy
from ..rollout import RolloutBatch
from .loading import check_teacher_vocabulary, require_folder


@dataclass
class Teacher:
    """The frozen teacher of a run and how it reads the student's rows."""

    model: torch.nn.Module
    options: DistillOptions
    vocabulary: int  # the tokens of the shared tokenizer: both models' distributions are compared over them
    pad_id: int
    queries: list[list[int]] | None = None  # teacher=self: each training prompt as the teacher reads it
    rows_scored: int = 0  # rows the teacher has read since `take_rows_scored`: once each per update

    @property
    def keeps_distributions(self) -> bool:
        """Whether the update compares whole next-token distributions (jsd, topk-forward-kl), for which scoring
        keeps the teacher's features."""
        return not self.options.per_token_advantage

    def take_rows_scored(self) -> int:
        rows, self.rows_scored = self.rows_scored, 0
        return rows

    def rows_of(self, part: RolloutBatch) -> RolloutBatch:
        """The rows as the teacher reads them: the student's, or with teacher=self each prompt with its hint."""
        if self.queries is None:
            return part
        padded = left_pad_queries([self.queries[p] for p in part.prompts.tolist()], self.pad_id)
        device = part.query_ids.device
        return dataclasses.replace(part, query_ids=padded["input_ids"].to(device, part.query_ids.dtype),
                                   query_mask=padded["attention_mask"].to(device, part.query_mask.dtype))

    def score(self, part: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) the teacher's log-probabilities of `part`'s sampled tokens at its temperature and, where the
        update compares whole distributions, the features they come from (B, R, ...); one forward pass."""
        rows = self.rows_of(part)
        inputs = response_head_inputs(self.model, rows.input_ids(), rows.attention_mask(), rows.context_length)
        logprobs, _ = inputs.logprobs_entropy(rows.responses, self.options.temperature, pad_token_of(self.model))
        self.rows_scored += part.size
        return logprobs, inputs.features if self.keeps_distributions else None

    def divergence(self, student: HeadInputs, teacher_features: torch.Tensor, student_temperature: float,
                   student_pad: int | None) -> torch.Tensor:
        """(B, R) the configured divergence of the student's next-token distribution from the teacher's at each
        response position, with gradients to the student, a chunk of positions at a time."""
        divergence = functools.partial(
            divergence_of_logits, options=self.options, vocabulary=self.vocabulary,
            temperatures=(student_temperature, self.options.temperature), pads=(student_pad, pad_token_of(self.model)),
        )
        features = teacher_features.to(student.features.device)
        return chunked_divergence(student.features, features, (student.weight, student.bias),
                                  head_of(self.model, features.device), divergence)


def head_of(model: torch.nn.Module, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The LM head (weight, bias) that formed a model's kept features into logits, on `device`; (None, None) when
    its features are its logits (a head that is not a plain linear map: `logprobs.plain_lm_head`)."""
    head = plain_lm_head(model)
    if head is None:
        return None, None
    return head.weight.to(device), head.bias.to(device) if head.bias is not None else None


def divergence_of_logits(student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, options: DistillOptions,
                         vocabulary: int, temperatures: tuple[float, float],
                         pads: tuple[int | None, int | None]) -> torch.Tensor:
    """(N,) the divergence `options.loss` names between rows of the two models' logits, each at its temperature,
    over the shared tokenizer's tokens without PAD (which neither model ever samples: Detail 3)."""
    student, teacher = (
        ops.without_token(logits[..., :vocabulary].float() / temperature, pad)
        for logits, temperature, pad in zip((student_logits, teacher_logits), temperatures, pads, strict=True)
    )
    if options.loss == "jsd":
        return generalized_jsd(student, teacher, options.beta)
    return topk_forward_kl_of_logits(student, teacher, options.top_k)


def load_teacher(options: DistillOptions, tokenizer, source: ModelSource, reference: torch.nn.Module,
                 device: torch.device) -> Teacher:
    """The run's teacher on the frozen models' `device`: the model `teacher=` names, refused when it does not read
    the student's tokens, or with teacher=self the frozen reference (the student's starting weights) itself."""
    if options.is_self:
        model = reference
    else:
        require_folder(options.teacher, "teacher", "give the teacher's model folder, embedded name or hub id")
        model, teacher_tokenizer = load_policy(options.teacher, source.trust_remote_code,
                                               allow_pickle=source.allow_pickle)
        check_teacher_vocabulary(tokenizer, teacher_tokenizer, model.get_input_embeddings().weight.size(0),
                                 options.teacher)
        warn_if_never_ends(model, tokenizer, options.teacher)
        model = model.to(device)
    return Teacher(model.eval().requires_grad_(False), options, len(tokenizer), tokenizer.pad_token_id)


def warn_if_never_ends(model: torch.nn.Module, tokenizer, path: str) -> None:
    """Name a teacher whose own answers end with another token than the student's EOS: it then gives that EOS a
    low probability, and distillation teaches the student not to stop."""
    config = getattr(model, "generation_config", None) or model.config
    ends = getattr(config, "eos_token_id", None)
    ends = {ends} if isinstance(ends, int) else set(ends or ())
    if ends and tokenizer.eos_token_id not in ends:
        names = ", ".join(f"{e} ({tokenizer.convert_ids_to_tokens(e)!r})" for e in sorted(ends))
        warn(f"teacher={path} ends its answers with {names}, never the student's EOS {tokenizer.eos_token_id} "
             f"({tokenizer.eos_token!r}): it will teach the student not to stop (watch distill/teacher_eos_logprob)")


def hinted_queries(examples: list[SFTExample], hint: str, tokenizer, max_query_length: int) -> list[list[int]]:
    """Self-distillation: each prompt as the teacher reads it, `hint` filled in from the prompt's columns and
    added to its last user turn (a conversation) or after its text (a plain-text prompt)."""
    queries = []
    for example in examples:
        columns = example.record.columns or {}
        try:
            text = hint.format(**columns)
        except (KeyError, IndexError) as missing:
            raise ConfigError(
                f"teacher_hint={hint!r} names the column {missing}, which the prompt at {example.record.where} does "
                f"not have (its columns: {', '.join(sorted(columns)) or 'none'})"
            ) from None
        budget = max_query_length + len(encode_text(tokenizer, text)) + 8
        if example.record.task == CHAT:
            messages = json.loads(example.record.fields["messages"])
            messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}\n\n{text}"}
            queries.append(encode_chat_query(tokenizer, messages, budget).ids)
        else:
            queries.append(example.query.ids + encode_text(tokenizer, f"\n\n{text}"))
    return queries


def distill_metrics(batch: RolloutBatch, rows_per_update_row: float) -> dict[str, float]:
    """What the teacher says of the update's samples: the sampled-token reverse KL per token (the k1 estimate
    of KL(student || teacher)), the teacher's mean log-probability, its log-probability of the student's EOS
    where the student ended, and how many times the teacher read each row (1: once per update)."""
    trained = batch.trained_mask
    gap = (batch.logprobs - batch.teacher_logprobs) * trained
    ended = batch.has_eos & (batch.lengths > 0)
    last = (batch.lengths - 1).clamp(min=0).unsqueeze(1)
    metrics = {
        "distill/reverse_kl": float(ops.masked_mean(gap, trained)),
        "distill/reverse_kl_sum": float(gap.sum(-1).mean()),
        "distill/teacher_logprob": float(ops.masked_mean(batch.teacher_logprobs, trained)),
        "perf/teacher_reads_per_row": rows_per_update_row,
    }
    if ended.any():
        eos = batch.teacher_logprobs.gather(1, last).squeeze(1)[ended]
        metrics["distill/teacher_eos_logprob"] = float(eos.mean())
    return metrics
