"""On-policy distillation's pure maths: what a teacher's next-token distribution says of a student's sampled
tokens. Three forms, one per `distill_loss`:

    reverse-kl-advantage  A_t = sum_{u >= t} discount^(u-t) * -coef * (log pi_S(y_u) - log pi_T(y_u))
                          the sampled-token reverse KL as a per-token advantage (tinker, prime-rl, verl's
                          policy-gradient mode); discount 0: each token's own
    jsd                   beta * KL(T || M) + (1 - beta) * KL(S || M), M = beta * T + (1 - beta) * S, over the
                          whole vocabulary; beta 0 is the forward KL(T || S), beta 1 the reverse KL(S || T)
                          (TRL's generalized JSD, its two ends taken exactly as TRL takes them)
    topk-forward-kl       sum over the teacher's top k tokens of p_T (log p_T - log p_S), plus the rest of the
                          vocabulary as one bucket: (1 - P_T) log((1 - P_T) / (1 - P_S)) (verl's form)

Per-token values, (B, T): the update aggregates them as it aggregates its policy loss. Logits are formed from
hidden states a chunk of positions at a time, so neither model's (B, T, V) logits exist at once.
"""

from __future__ import annotations

import math

import torch

from .ops import returns_to_go

STUDENT_TAIL_FLOOR = 1e-6  # the student's probability outside the teacher's top k, floored as verl floors it


def reverse_kl_advantages(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, coef: float, discount: float
) -> torch.Tensor:
    """(B, T) each sampled token's advantage: -coef times the student's log-probability minus the teacher's,
    summed over it and the later tokens of its row with `discount` (0: its own alone); 0 outside `mask`."""
    signal = -coef * (student_logprobs - teacher_logprobs).detach()
    return returns_to_go(signal, mask, discount)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0) -> torch.Tensor:
    """(N,) the generalized JSD of each row's next-token distributions, both at `temperature`."""
    student = torch.log_softmax(at_least_fp32(student_logits) / temperature, dim=-1)
    teacher = torch.log_softmax(at_least_fp32(teacher_logits) / temperature, dim=-1)
    if beta == 0:
        return kl_divergence(teacher, student)
    if beta == 1:
        return kl_divergence(student, teacher)
    mixture = torch.logsumexp(torch.stack([student + math.log1p(-beta), teacher + math.log(beta)]), dim=0)
    return beta * kl_divergence(teacher, mixture) + (1 - beta) * kl_divergence(student, mixture)


def at_least_fp32(values: torch.Tensor) -> torch.Tensor:
    """`values` in float32, or float64 when they are (bf16 logits would make the divergences noise)."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """(N,) KL(P || Q) of each row, from log-probabilities; a token P gives no mass adds nothing."""
    return torch.where(log_p.isneginf(), 0.0, log_p.exp() * (log_p - log_q)).sum(-1)


def topk_forward_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """(N,) the forward KL over the teacher's top k tokens with the rest of the vocabulary as one bucket, from
    (N, k) log-probabilities of those k tokens under each model (full-vocabulary log-softmaxes)."""
    teacher_p = teacher_logprobs.exp()
    head = (teacher_p * (teacher_logprobs - student_logprobs)).sum(-1)
    teacher_tail = (1 - teacher_p.sum(-1)).clamp(min=0)
    student_tail = (1 - student_logprobs.exp().sum(-1)).clamp(min=STUDENT_TAIL_FLOOR)
    tail = torch.where(teacher_tail > 0, teacher_tail * (teacher_tail.clamp(min=1e-30).log() - student_tail.log()), 0.0)
    return head + tail


def topk_forward_kl_of_logits(student_logits: torch.Tensor, teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) `topk_forward_kl` over the teacher's `k` most likely tokens of each row, from both models' logits."""
    teacher = torch.log_softmax(at_least_fp32(teacher_logits), dim=-1)
    top, tokens = teacher.topk(min(k, teacher.size(-1)), dim=-1)
    student = torch.log_softmax(at_least_fp32(student_logits), dim=-1).gather(-1, tokens)
    return topk_forward_kl(student, top)


def chunked_divergence(
    student_features: torch.Tensor,
    teacher_features: torch.Tensor,
    student_head: tuple[torch.Tensor, torch.Tensor | None],
    teacher_head: tuple[torch.Tensor, torch.Tensor | None],
    divergence,
    chunk_rows: int = 256,
) -> torch.Tensor:
    """(B, T) `divergence(student_logits, teacher_logits)` of each position, the logits formed from (B, T, H)
    hidden states and each model's LM head (weight, bias) `chunk_rows` positions at a time (features that are
    logits already where a head's weight is None); with gradients, each chunk's student logits are recomputed in
    the backward pass instead of kept."""
    shape = student_features.shape[:-1]
    student_rows = student_features.reshape(-1, student_features.size(-1))
    teacher_rows = teacher_features.reshape(-1, teacher_features.size(-1))
    head_trained = student_head[0] is not None and student_head[0].requires_grad
    recompute = torch.is_grad_enabled() and (student_rows.requires_grad or head_trained)
    values = []
    for start in range(0, student_rows.size(0), chunk_rows):
        args = (student_rows[start : start + chunk_rows], teacher_rows[start : start + chunk_rows],
                *student_head, *teacher_head, divergence)
        if recompute:
            values.append(torch.utils.checkpoint.checkpoint(divergence_of_chunk, *args, use_reentrant=False))
        else:
            values.append(divergence_of_chunk(*args))
    return torch.cat(values).view(shape)


def divergence_of_chunk(student_rows, teacher_rows, student_weight, student_bias, teacher_weight, teacher_bias,
                        divergence) -> torch.Tensor:
    student_logits = logits_of(student_rows, student_weight, student_bias)
    with torch.no_grad():  # the teacher is frozen
        teacher_logits = logits_of(teacher_rows, teacher_weight, teacher_bias)
    return divergence(student_logits, teacher_logits)


def logits_of(rows: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Logits from hidden-state rows and an LM head; rows that are logits already when `weight` is None."""
    if weight is None:
        return at_least_fp32(rows)
    return torch.nn.functional.linear(
        at_least_fp32(rows), at_least_fp32(weight), None if bias is None else at_least_fp32(bias)
    )
