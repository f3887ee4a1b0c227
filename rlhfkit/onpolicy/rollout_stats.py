"""Each update's own statistics: the rollout's curves (Figure 12 and seed 000 Stage 3), multi-turn episodes'
token and turn counts, and the extreme samples written to samples.jsonl, decoded turn by turn."""

from __future__ import annotations

from typing import Any

import torch

from .. import ops
from ..rollout import RolloutBatch
from .reward_sources import RowKey, row_keys

SAMPLES_FILE = "samples.jsonl"
SAMPLE_KEYS = {"step", "rank", "score", "raw_score", "kl", "advantage", "length", "has_eos", "query", "response",
               "turns", "episode"}  # what `extreme_samples` writes of every sample, beside log_extra's columns

def rollout_metrics(batch: RolloutBatch, kl_coef: float) -> dict[str, float]:
    """The per-update curves of Figure 12 and seed 000 Stage 3, from the whole update's rollout. Per-token
    means count the policy's tokens only (an episode's environment tokens are context)."""
    mask, lengths = batch.trained_mask, batch.lengths.float()
    kl_sum = batch.kl.sum(-1)
    non_score = -kl_coef * kl_sum  # also when the KL enters the loss instead of the reward
    scored = ~batch.scores.isnan()  # the score means leave out the rows dropped from the update (scored_rows)
    metrics = {
        "objective/rlhf_reward": float((batch.scores + non_score).nanmean()),
        "objective/scores": float(batch.scores.nanmean()),
        "objective/raw_scores": float(batch.raw_scores.nanmean()),
        "objective/kl": float(kl_sum.mean()),
        "objective/non_score_reward": float(non_score.mean()),
        "objective/entropy": float((-batch.logprobs * mask).sum(-1).mean()),
        "objective/kl_coef": kl_coef,
        "response/length_mean": float(lengths.mean()),
        "response/eos_rate": float(batch.has_eos.float().mean()),
        "response/length_score_corr": float(ops.pearson(lengths[scored], batch.scores[scored])),
        "advantages/max": float(batch.advantages[mask].max()),
        "advantages/min": float(batch.advantages[mask].min()),
        "returns/mean": float(ops.masked_mean(batch.returns, mask)),
    }
    if bool((batch.has_eos & scored).any()):  # the score of valid responses alone, apart from the EOS trick's constant
        metrics["objective/scores_with_eos"] = float(batch.raw_scores[batch.has_eos & scored].mean())
    if batch.values is not None:
        metrics["val/mean"] = float(ops.masked_mean(batch.values, mask))
        metrics["val/explained_variance"] = float(ops.explained_variance(batch.values, batch.returns, mask))
    if batch.episodes is not None:
        metrics |= episode_metrics(batch)
    return metrics


def episode_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Multi-turn episodes: how many tokens are the policy's and the environment's, how many turns the
    policy took, and how far the log-probabilities the update starts from are from those sampled."""
    policy = batch.trained_mask
    inserted = batch.mask & ~policy
    # a turn starts at each policy token that follows an environment token or the episode's start
    starts = policy & ~torch.nn.functional.pad(policy[:, :-1], (1, 0), value=False)
    metrics = {
        "episode/policy_tokens_mean": float(policy.sum(-1).float().mean()),
        "episode/env_tokens_mean": float(inserted.sum(-1).float().mean()),
        "episode/turns_mean": float(starts.sum(-1).float().mean()),
    }
    if batch.logprobs is not None and bool(policy.any()):
        gap = (batch.logprobs - batch.episodes.sample_logprobs).abs()[policy]
        metrics["episode/logprob_gap_max"] = float(gap.max())
    return metrics


def extreme_samples(
    batch: RolloutBatch, tokenizer, update: int, count: int, extra: dict[RowKey, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The `count` highest- and lowest-scored episodes of the update (of those it scored), decoded, with their
    score, KL and advantage (the mean over the response's tokens), and the columns reward functions logged for
    them (`log_extra`: `extra`, by `row_keys`; a name the sample has already gets `_extra` after it)."""
    scored = (~batch.scores.isnan()).nonzero().squeeze(1)
    order = scored[torch.argsort(batch.scores[scored], descending=True)].tolist()
    picks = [("highest", i) for i in order[:count]] + [("lowest", i) for i in order[::-1][:count]]
    keys = row_keys(batch) if extra else []
    rows = []
    for rank, i in picks:
        query = batch.query_ids[i][batch.query_mask[i].bool()].tolist()
        response = batch.responses[i][batch.mask[i]].tolist()
        rows.append(
            {
                "step": update,
                "rank": rank,
                "score": float(batch.scores[i]),
                "raw_score": float(batch.raw_scores[i]),
                "kl": float(batch.kl[i].sum()),
                "advantage": float(ops.masked_mean(batch.advantages[i], batch.trained_mask[i])),
                "length": len(response),
                "has_eos": bool(batch.has_eos[i]),
                "query": tokenizer.decode(query),
                "response": tokenizer.decode(response, skip_special_tokens=True),
            }
        )
        if batch.episodes is not None:
            turns = episode_turns(batch, i, tokenizer)
            rows[-1] |= {"turns": turns, "episode": transcript(turns)}
        for column, value in (extra.get(keys[i], {}) if extra else {}).items():
            rows[-1][f"{column}_extra" if column in rows[-1] else column] = value
    return rows


def episode_turns(batch: RolloutBatch, row: int, tokenizer) -> list[dict[str, Any]]:
    """Row `row`'s episode as its runs of policy and environment tokens, in order, decoded with their special
    tokens (they show where the chat template opens and closes messages)."""
    ids = batch.responses[row][batch.mask[row]].tolist()
    sampled = batch.episodes.policy_mask[row][batch.mask[row]].tolist()
    turns: list[dict[str, Any]] = []
    for token, by_policy in zip(ids, sampled, strict=True):
        who = "policy" if by_policy else "environment"
        if not turns or turns[-1]["who"] != who:
            turns.append({"who": who, "ids": []})
        turns[-1]["ids"].append(token)
    return [{"who": t["who"], "text": tokenizer.decode(t["ids"]), "tokens": len(t["ids"])} for t in turns]


def transcript(turns: list[dict[str, Any]]) -> str:
    """The turns one per paragraph, each headed by whose tokens they are: the report's episode column."""
    return "\n".join(f"[{t['who']}, {t['tokens']} tokens] {t['text']}" for t in turns)


def speeds(timings: dict[str, float], elapsed: float, batch) -> dict[str, float]:
    """An update's phase times and speeds."""
    return {f"perf/{k}_s": v for k, v in timings.items()} | {
        "perf/update_total_s": elapsed,
        # the whole batch's tokens over this process's sampling time: the processes sample side by side
        "perf/generated_tokens_per_s": float(batch.lengths.sum()) / timings["generation"],
        "perf/episodes_per_s": batch.size / elapsed,
    }
