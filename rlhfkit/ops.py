"""Pure tensor functions: no I/O, no state. Every function here is unit-tested against hand values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


def first_true_indices(bools: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Index of the first True in each row; the row width when a row has none."""
    width = bools.size(-1)
    positions = torch.arange(width, device=bools.device, dtype=dtype)
    return torch.where(bools, positions, torch.full_like(positions, width)).min(dim=-1).values


def truncate_after_eos(responses: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """Keep each response up to and including its first EOS; PAD everything after it."""
    eos_at = first_true_indices(responses == eos_id)
    positions = torch.arange(responses.size(1), device=responses.device)
    return torch.where(positions.unsqueeze(0) > eos_at.unsqueeze(1), torch.full_like(responses, pad_id), responses)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of `tokens` under `logits / temperature`: the sampling temperature is applied in
    every forward pass that computes log-probabilities (Table 7), so sampling and training agree."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.gather(F.log_softmax(scaled, dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set (over everything, or along `dim`); 0 where nothing is set."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token, so left padding shifts nothing."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row's real tokens come first and its padding only after them (Detail 5's layout)."""
    mask = attention_mask.long()
    return torch.equal(mask.cumprod(-1), mask)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then nucleus (top-p) filtering: removed entries become -inf."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits



def sample_rows(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """(B,) one token per row of the (B, V) `probs`, row i drawn from `generators[i]` alone.

    The exponential race: argmax_v p_v / E_v with E_v ~ Exp(1) picks v with probability p_v (the way
    `torch.multinomial` draws one sample). Each row draws its own V numbers from its own stream, so a
    row's token does not depend on which rows share its batch, how many there are, or their order."""
    noise = torch.stack(
        [torch.empty(probs.size(-1), device=probs.device).exponential_(generator=g) for g in generators]
    )
    # an exact 0 from the draw (about 2^-53 on a CPU) would make 0 / 0 = NaN, which argmax picks
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(-1)

# ---------------------------------------------------------------------------------------------
# RL maths shared by the on-policy trainers. Shapes: B rows (episodes), T response positions.
# `mask` (B, T) marks each row's valid response prefix: every token up to and including EOS.
# ---------------------------------------------------------------------------------------------


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` where `mask` is set; Bessel-corrected when `unbiased` (needs 2+ entries)."""
    centered = values - masked_mean(values, mask)
    variance = masked_mean(centered**2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError("masked_var(unbiased=True) needs at least two unmasked values")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """The paper's `whiten` (Details 24-25; its listing uses the biased variance) over unmasked entries:
    unit variance, and mean 0 when `shift_mean` (advantages), the original mean kept otherwise
    (rewards). Masked entries become 0."""
    mean, variance = masked_mean(values, mask), masked_var(values, mask, unbiased=False)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)


def chunked_logprobs_entropy(
    features: torch.Tensor,
    tokens: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int = 256,
    excluded_token: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities of `tokens`, entropies), both (B, T), at `temperature`, `chunk_rows` positions at a time,
    over every token but `excluded_token` (PAD, which is never sampled: Detail 3).

    `features` are either hidden states (B, T, H) with the LM head `weight` (V, H) and `bias`, or
    logits (B, T, V) when `weight` is None. Only one chunk's float32 (chunk_rows, V) logits exist at
    once, in the forward pass and, through recomputation, in the backward pass too: with a 49k
    vocabulary the full (B, T, V) tensor would be the largest of the step.
    """
    rows, flat_tokens = features.reshape(-1, features.size(-1)), tokens.reshape(-1)
    recompute = torch.is_grad_enabled() and (features.requires_grad or (weight is not None and weight.requires_grad))
    logprobs, entropies = [], []
    for start in range(0, rows.size(0), chunk_rows):
        args = (
            rows[start : start + chunk_rows],
            flat_tokens[start : start + chunk_rows],
            weight,
            bias,
            temperature,
            excluded_token,
        )
        if recompute:
            lp, ent = torch.utils.checkpoint.checkpoint(logprobs_entropy_of_chunk, *args, use_reentrant=False)
        else:
            lp, ent = logprobs_entropy_of_chunk(*args)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs).view(tokens.shape), torch.cat(entropies).view(tokens.shape)


def logprobs_entropy_of_chunk(
    rows: torch.Tensor,
    tokens: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    temperature: float,
    excluded_token: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = rows if weight is None else F.linear(rows, weight, bias)
    scaled = without_token(logits.float() / (temperature if temperature > 0 else 1.0), excluded_token)
    logp = scaled.log_softmax(-1)
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # PAD only fills rows after their EOS, masked everywhere: 0 keeps masked products finite
    if excluded_token is not None:
        picked = picked.masked_fill(tokens == excluded_token, 0.0)
    return picked, -(logp.exp() * logp).sum(-1)


def without_token(logits: torch.Tensor, token: int | None) -> torch.Tensor:
    """`logits` with `token` given probability 0 and every other token's probability as if it were not in the
    vocabulary (Detail 3: an added PAD row must change nothing). The floor is the dtype's finite minimum, not
    -inf, so that an entropy's 0 x log 0 stays 0 rather than NaN."""
    if token is None or not 0 <= token < logits.size(-1):
        return logits
    return logits.index_fill(-1, torch.tensor([token], device=logits.device), torch.finfo(logits.dtype).min)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate from sampled-token log-probabilities (Schulman 2020), L = log(pi/pi_ref):
    k1 = L (the paper's; unbiased, can be negative); k2 = L^2 / 2 (biased, low variance);
    k3 = pi_ref/pi - 1 - log(pi_ref/pi) (unbiased and never negative).

    These are values. As a reward (equation 3, kl_placement=reward) the policy gradient multiplies the
    reward by grad log pi, and only k1 then gives the gradient of KL(pi || pi_ref); as a loss term use
    `kl_loss`, whose forms are chosen for their gradients. docs/algorithms.md has the derivations.
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


def kl_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, T) per-token KL loss terms (kl_placement=loss) whose gradient, in expectation over tokens
    sampled from the rollout policy pi_old, is the gradient of KL(pi || pi_ref) = E_pi[L], L = log(pi/pi_ref):

        k1: r * L            grad = r (L + 1) grad log pi; the +1 term has mean 0 under pi
        k2: sg(r) * L^2 / 2  grad = sg(r) L grad log pi
        k3: r * k3           grad = r L grad log pi (DeepSeek-V3.2's correction; TRL #4637)

    with r = pi / pi_old, 1 in value before the first step. GRPO's plain k3 term, without r, has
    gradient (1 - pi_ref/pi) grad log pi: the gradient of the forward KL(pi_ref || pi), not the reverse
    one, and plain k1 has a gradient of mean 0 (it regularises nothing)."""
    ratio = torch.exp(logprobs - old_logprobs)
    value = kl_penalty(logprobs, ref_logprobs, kind)
    return (ratio.detach() if kind == "k2" else ratio) * value


def eos_trick(scores: torch.Tensor, has_eos: torch.Tensor, missing_eos_score: float) -> torch.Tensor:
    """Detail 23: a response that never emitted EOS has no valid reward-model score; it gets a constant."""
    return torch.where(has_eos, scores, torch.full_like(scores, missing_eos_score))


def rlhf_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Equation 3 per token: (B, T) rewards.

    Every valid token is rewarded -kl_coef * KL (the non-score reward); the sequence score (B,) is added at the
    row's last valid token, the EOS itself (or the last sampled token when there is none), not one past it.
    """
    rewards = -kl_coef * kl * mask.to(kl.dtype)
    last = mask.long().sum(-1).clamp(min=1) - 1
    rewards[torch.arange(rewards.size(0), device=rewards.device), last] += scores.to(rewards.dtype)
    return rewards


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation: (advantages, returns), both (B, T).

    values[:, t] is V(state before token t). The episode ends after each row's valid prefix: the
    value after the last valid token is 0, and advantages and returns are 0 beyond the prefix.
    """
    mask = mask.to(rewards.dtype)
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        next_value = values[:, t + 1] if t + 1 < rewards.size(1) else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages, advantages + values


def ppo_value_loss(
    new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clip fraction): half the squared error to the returns, with the new values kept within
    `clip` of the rollout's values (Table 7: value function loss clipping, 0.2); None: no clipping."""
    unclipped = (new_values - returns) ** 2
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask), torch.zeros((), device=new_values.device)
    clipped_values = old_values + torch.clamp(new_values - old_values, -clip, clip)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask).detach()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) over unmasked tokens: 1 is a perfect value model, 0 a constant."""
    return 1 - masked_var(returns - values, mask, unbiased=False) / masked_var(returns, mask, unbiased=False).clamp(
        min=1e-8
    )


def pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Correlation of two 1-D tensors; 0 when either is constant."""
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    denominator = (x.norm() * y.norm()).clamp(min=1e-12)
    return (x * y).sum() / denominator


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: float, steps: int) -> float:
    """Ziegler et al. 2019's proportional controller: move the KL coefficient toward `target` KL,
    by at most 20% of `steps / horizon` per update."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * steps / horizon)


def group_sums(values: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of each row's group, size of each row's group), both (B,), for group ids (B,) in any order."""
    _, inverse = torch.unique(groups, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    counts = torch.bincount(inverse).to(values.dtype)
    return sums[inverse], counts[inverse]


def require_groups_of_two(counts: torch.Tensor, what: str) -> None:
    if bool((counts < 2).any()):
        raise ValueError(f"{what} needs at least two samples per prompt (group); set samples_per_prompt >= 2")


def group_relative_advantages(
    scores: torch.Tensor, groups: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO (Shao et al. 2024): each sequence's score minus the mean of its group (the samples of one
    prompt), divided by the group's standard deviation (Bessel-corrected) + eps when `scale_by_std`
    (Liu et al. 2025, "Dr. GRPO", drop the division: it up-weights prompts whose samples barely differ).
    scores, groups: (B,). A group whose scores are all equal gets advantage 0."""
    sums, counts = group_sums(scores, groups)
    require_groups_of_two(counts, "group-relative advantages")
    centered = scores - sums / counts
    if not scale_by_std:
        return centered
    variance = group_sums(centered**2, groups)[0] / (counts - 1)
    return centered / (variance.sqrt() + eps)


def leave_one_out_baseline(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): for each sequence, the mean score of the *other* samples of its
    prompt, (group sum - own score) / (k - 1). scores, groups: (B,)."""
    sums, counts = group_sums(scores, groups)
    require_groups_of_two(counts, "the leave-one-out baseline")
    return (sums - scores) / (counts - 1)


# Advantage estimators, looked up by name by the on-policy trainer. Each takes the per-token
# rewards (B, T), the valid-token mask (B, T) and keyword inputs (values, group ids, gamma, lam,
# scale_by_std), and returns (advantages, returns), both (B, T). Adding an estimator is one
# function and one entry here.


def sequence_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One advantage per sequence (B,) given to each of its valid tokens: (advantages, returns), both
    (B, T). Without a value model there is nothing to regress, so the returns are the advantages."""
    per_token = advantages.unsqueeze(1) * mask.to(advantages.dtype)
    return per_token, per_token


def leave_one_out_advantages(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO: each sequence's score minus the mean score of the other samples of its prompt."""
    return scores - leave_one_out_baseline(scores, groups)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """(B, T) the discounted sum of each token's reward and every later one's within its row:
    REINFORCE's return, the advantage of REINFORCE++ and ReMax before their baselines."""
    rewards = rewards * mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask.to(rewards.dtype)


def compact_tokens(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's masked entries moved to the front in order: ((B, P) values, (B, P) their columns,
    (B, P) mask), P the most any row has. A multi-turn episode's policy tokens as one unbroken sequence,
    so GAE bootstraps a turn's last token from the value at the next turn's first token, across the
    environment's tokens between them, as verl's GAE skips observation tokens."""
    columns = torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)
    width = int(mask.sum(-1).max()) if mask.numel() else 0
    columns = columns[:, : max(width, 1)]
    kept = torch.gather(mask.bool(), 1, columns)
    return torch.gather(values, 1, columns) * kept.to(values.dtype), columns, kept


def expand_tokens(compacted: torch.Tensor, columns: torch.Tensor, kept: torch.Tensor, width: int) -> torch.Tensor:
    """`compact_tokens` undone: (B, width), each value back in its column, 0 at every other column."""
    expanded = compacted.new_zeros(compacted.size(0), width)
    return expanded.scatter(1, columns, compacted * kept.to(compacted.dtype))


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, equation 13), (B,): 0 up to max_length - buffer
    tokens, then falling linearly to -factor at max_length, and -factor beyond it."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    excess = (lengths.float() - (max_length - buffer)).clamp(min=0)
    return -factor * torch.clamp(excess / buffer, max=1.0)


def group_spread(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """(B,) max - min of the scores of each row's group (DAPO's dynamic sampling drops groups at 0: all
    their advantages are 0 and they teach nothing)."""
    _, inverse = torch.unique(groups, return_inverse=True)
    count = int(inverse.max()) + 1
    highest = torch.full((count,), float("-inf"), dtype=scores.dtype, device=scores.device).scatter_reduce(
        0, inverse, scores, "amax"
    )
    lowest = torch.full((count,), float("inf"), dtype=scores.dtype, device=scores.device).scatter_reduce(
        0, inverse, scores, "amin"
    )
    return (highest - lowest)[inverse]


def length_penalised_scores(scores: torch.Tensor, lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """score - alpha * length (response tokens): a reward that stops paying for length alone, usable at
    scoring time by the on-policy trainers and by `rlhfkit rm-eval` (Detail 24's length discussion)."""
    return scores - alpha * lengths.to(scores.dtype)


def disentangled_length_loss(quality: torch.Tensor, length_scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """ODIN (Chen et al. 2024): |corr(quality head, length)| - corr(length head, length) over the
    responses of a batch. Minimising it pushes everything that tracks length into the length head,
    so the quality head, the reward RL optimises, carries what length cannot explain."""
    lengths = lengths.to(quality.dtype)
    return pearson(quality, lengths).abs() - pearson(length_scores, lengths)


def head_orthogonality_loss(quality_weight: torch.Tensor, length_weight: torch.Tensor) -> torch.Tensor:
    """ODIN's |W_Q^T W_L|: the two linear heads read different directions of the hidden state."""
    return (quality_weight.flatten() * length_weight.flatten()).sum().abs()
