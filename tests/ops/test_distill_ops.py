"""On-policy distillation's maths (rlhfkit/distill_ops.py), by hand on a five-token vocabulary and against TRL."""

import math
import os

import pytest
import torch

from rlhfkit import distill_ops


def test_the_reverse_kl_advantage_is_each_tokens_log_ratio_discounted_over_the_later_ones():
    student = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.2, 0.4, 0.9]]))
    teacher = torch.log(torch.tensor([[0.25, 0.25, 1.0], [0.4, 0.4, 0.9]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    own = distill_ops.reverse_kl_advantages(student, teacher, mask, coef=2.0, discount=0.0)
    log2 = math.log(2)
    torch.testing.assert_close(own, torch.tensor([[-2 * log2, 0.0, 2 * log2], [2 * log2, 0.0, 0.0]]))
    discounted = distill_ops.reverse_kl_advantages(student, teacher, mask, coef=2.0, discount=0.5)
    torch.testing.assert_close(discounted, torch.tensor([[-1.5 * log2, log2, 2 * log2], [2 * log2, 0.0, 0.0]]))


def test_the_advantage_carries_no_gradient_to_the_student():
    student = torch.zeros(1, 2, requires_grad=True)
    advantages = distill_ops.reverse_kl_advantages(student, torch.ones(1, 2), torch.ones(1, 2), 1.0, 0.0)
    assert not advantages.requires_grad


def jsd_by_hand(p: list[float], q: list[float], beta: float) -> float:
    """beta KL(T || M) + (1 - beta) KL(S || M), M = beta T + (1 - beta) S, with p the student's, q the teacher's."""
    m = [beta * b + (1 - beta) * a for a, b in zip(p, q, strict=True)]
    kl_t = sum(b * math.log(b / c) for b, c in zip(q, m, strict=True))
    kl_s = sum(a * math.log(a / c) for a, c in zip(p, m, strict=True))
    return beta * kl_t + (1 - beta) * kl_s


STUDENT = [0.1, 0.2, 0.3, 0.15, 0.25]
TEACHER = [0.3, 0.3, 0.1, 0.2, 0.1]


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_the_generalized_jsd_by_hand_on_five_tokens(beta):
    student, teacher = (torch.tensor([p], dtype=torch.float64).log() for p in (STUDENT, TEACHER))
    got = float(distill_ops.generalized_jsd(student, teacher, beta))
    if beta == 0:
        expected = sum(b * math.log(b / a) for a, b in zip(STUDENT, TEACHER, strict=True))  # KL(T || S)
    elif beta == 1:
        expected = sum(a * math.log(a / b) for a, b in zip(STUDENT, TEACHER, strict=True))  # KL(S || T)
    else:
        expected = jsd_by_hand(STUDENT, TEACHER, beta)
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_a_student_equal_to_its_teacher_has_divergence_and_gradient_zero(beta):
    torch.manual_seed(0)
    logits = torch.randn(4, 7, dtype=torch.float64)
    student = logits.clone().requires_grad_()
    divergence = distill_ops.generalized_jsd(student, logits, beta)
    divergence.sum().backward()
    if beta in (0.0, 1.0):
        assert divergence.eq(0).all()  # KL(P || P): each term is p * 0
    torch.testing.assert_close(divergence, torch.zeros(4, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(student.grad, torch.zeros_like(logits), atol=1e-12, rtol=0)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_generalized_jsd_equals_trls_on_the_same_logits(beta, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.gkd import GKDTrainer

    torch.manual_seed(1)
    student, teacher = torch.randn(2, 3, 11, dtype=torch.float64), torch.randn(2, 3, 11, dtype=torch.float64)
    ours = distill_ops.generalized_jsd(student, teacher, beta, temperature=0.7).mean()
    labels = torch.zeros(2, 3, dtype=torch.long)  # every position counts: TRL's mean over the labelled tokens
    trl = GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=beta, temperature=0.7)
    torch.testing.assert_close(ours, trl.to(ours.dtype), atol=1e-12, rtol=1e-10)
    assert "TRL_EXPERIMENTAL_SILENCE" in os.environ


def test_topk_with_k_the_whole_vocabulary_is_the_full_forward_kl():
    torch.manual_seed(2)
    student, teacher = torch.randn(5, 9, dtype=torch.float64), torch.randn(5, 9, dtype=torch.float64)
    student_lp, teacher_lp = student.log_softmax(-1), teacher.log_softmax(-1)
    full = distill_ops.generalized_jsd(student, teacher, beta=0.0)
    torch.testing.assert_close(distill_ops.topk_forward_kl(student_lp, teacher_lp), full, atol=1e-12, rtol=1e-10)


def test_topk_puts_the_rest_of_the_vocabulary_in_one_bucket():
    student, teacher = torch.tensor([STUDENT]).log(), torch.tensor([TEACHER]).log()
    top = [0, 1]  # the teacher's two most likely tokens
    got = distill_ops.topk_forward_kl(student[:, top], teacher[:, top])
    head = sum(TEACHER[i] * math.log(TEACHER[i] / STUDENT[i]) for i in top)
    teacher_tail, student_tail = 1 - 0.6, 1 - 0.3
    assert float(got) == pytest.approx(head + teacher_tail * math.log(teacher_tail / student_tail), rel=1e-6)


@pytest.mark.parametrize("chunk_rows", [1, 4, 100])
def test_the_chunked_divergence_equals_the_whole_one_with_gradients(chunk_rows):
    torch.manual_seed(3)
    student_hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    student_weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    teacher_hidden, teacher_weight = torch.randn(2, 5, 6, dtype=torch.float64), torch.randn(13, 6, dtype=torch.float64)
    teacher_bias = torch.randn(13, dtype=torch.float64)

    def jsd(s, t):
        return distill_ops.generalized_jsd(s, t, beta=0.5)

    chunked = distill_ops.chunked_divergence(student_hidden, teacher_hidden, (student_weight, None),
                                             (teacher_weight, teacher_bias), jsd, chunk_rows)
    chunked.sum().backward()
    grads = student_hidden.grad.clone(), student_weight.grad.clone()
    student_hidden.grad = student_weight.grad = None
    whole = jsd(student_hidden @ student_weight.T, teacher_hidden @ teacher_weight.T + teacher_bias).view(2, 5)
    whole.sum().backward()
    torch.testing.assert_close(chunked, whole, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(grads, (student_hidden.grad, student_weight.grad), atol=1e-12, rtol=1e-10)
