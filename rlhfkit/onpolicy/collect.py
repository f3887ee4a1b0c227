"""One update's rollout: prompts drawn from the stream, sampled, scored and gathered across
processes, then its advantages (Detail 21, Section 7).

A draw takes the next total_batch_size / samples_per_prompt prompts of the stream; each process
samples and scores its share, and the whole draw is gathered. Usually one draw is the update. With
DAPO's dynamic sampling, groups whose scores do not differ (all their advantages would be 0) are
dropped and further draws refill the update, up to dynamic_sampling_max_draws; every process decides
on the same gathered scores, so all keep the same groups. ReMax also answers each prompt greedily
and scores that answer: its baseline.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

import torch

from .. import ops
from ..config import OnPolicyConfig
from ..devices import autocast, evaluation_mode, model_device
from ..distributed import ONE_PROCESS
from ..generation import SamplingParams
from .rewarding import PromptTexts
from .rollout import (
    RolloutBatch,
    chunk_generator,
    gather_rollout,
    process_share,
    prompt_indices,
    sample_responses,
    widen,
    widen_to_all_processes,
)
from .update import (
    OnPolicyModels,
    compute_advantages,
    model_scores,
    reward_components,
    row_groups,
    score_rollout,
    shaped_scores,
)

GREEDY_STREAM = 17  # ReMax's greedy answers draw no randomness, but keep their chunk keys apart anyway


@dataclass
class PromptStream:
    """How far the run has read the prompt stream: an update reads one draw, more with dynamic sampling.
    Saved in checkpoints, so a resumed run draws the prompts it would have."""

    position: int = 0


def prompts_per_update(cfg: OnPolicyConfig) -> int:
    return cfg.total_batch_size // cfg.samples_per_prompt


def collect(models: OnPolicyModels, prompts: list[list[int]], cfg: OnPolicyConfig, update: int, kl_coef: float, precision: str,
            timings: dict[str, float], show=lambda phase: None, accelerator=ONE_PROCESS, texts: PromptTexts | None = None,
            stream: PromptStream | None = None, counts: dict[str, float] | None = None) -> RolloutBatch:
    """Sample and score update `update` (0-based) from `stream` (None: the update's own place in it,
    update x prompts per update), gather the whole rollout and estimate its advantages; `show(phase)`
    reports progress; reward functions read the prompts' `texts`. Dynamic sampling's tallies go to `counts`."""
    stream = stream if stream is not None else PromptStream(update * prompts_per_update(cfg))
    timings["generation"] = timings["scoring"] = 0.0
    draw = functools.partial(draw_rollout, models, prompts, cfg, update, stream=stream, precision=precision, timings=timings, show=show,
                             accelerator=accelerator, texts=texts)
    if cfg.dynamic_sampling:
        batch = dynamic_sample(draw, cfg, counts if counts is not None else {}, models.tokenizer.pad_token_id)
    else:
        batch = draw(0)
    return compute_advantages(batch, cfg, kl_coef)


def draw_rollout(models: OnPolicyModels, prompts: list[list[int]], cfg: OnPolicyConfig, update: int, attempt: int, stream: PromptStream,
                 precision: str, timings: dict[str, float], show, accelerator, texts: PromptTexts | None) -> RolloutBatch:
    """The next draw of the stream, sampled by every process for its share and gathered, scored."""
    device = next(models.policy.parameters()).device
    per_update = prompts_per_update(cfg)
    picked = prompt_indices(len(prompts), per_update, cfg.seed, stream.position)
    stream.position += per_update
    share = process_share(per_update, accelerator.process_index, accelerator.num_processes)
    offset = attempt * per_update  # the chunk RNGs of a refill are keyed past those of the earlier draws
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.temperature, decoding=cfg.decoding)
    own = [prompts[i] for i in picked[share]]
    show("sampling")
    began = time.perf_counter()
    # eval mode: with activation checkpointing on, a model in train mode refuses the KV cache
    with autocast(device, precision), evaluation_mode(models.policy):
        batch = sample_responses(models.policy, own, params, models.tokenizer, cfg.generation_batch_size,
                                 lambda i: chunk_generator(cfg.seed, update, offset + share.start + i, device),
                                 samples_per_prompt=cfg.samples_per_prompt)
    batch.prompts = torch.as_tensor(picked[share], device=device).repeat_interleave(cfg.samples_per_prompt)
    if cfg.advantage_estimator == "remax":  # its greedy answers count as generation time
        batch.baseline_scores = greedy_baseline(models, own, batch.prompts[:: cfg.samples_per_prompt], cfg, update, offset + share.start,
                                                precision, texts).repeat_interleave(cfg.samples_per_prompt)
    timings["generation"] += time.perf_counter() - began
    show("scoring")
    began = time.perf_counter()
    batch = widen_to_all_processes(batch, accelerator, models.tokenizer.pad_token_id)
    batch = gather_rollout(score_rollout(models, batch, cfg, precision, texts), accelerator)
    timings["scoring"] += time.perf_counter() - began
    models.reward_sources().stop_if_all_failed(batch.reward_failures, update + 1)  # on the whole batch: every process alike
    return batch


@torch.no_grad()
def greedy_baseline(models: OnPolicyModels, queries: list[list[int]], prompt_ids: torch.Tensor, cfg: OnPolicyConfig, update: int,
                    position: int, precision: str, texts: PromptTexts | None) -> torch.Tensor:
    """ReMax (Li et al. 2023): (P,) the shaped score of each prompt's greedy answer, from the same
    reward model and functions as the sampled answers."""
    device = next(models.policy.parameters()).device
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=0.0, decoding=cfg.decoding)
    with autocast(device, precision), evaluation_mode(models.policy):
        greedy = sample_responses(models.policy, queries, params, models.tokenizer, cfg.generation_batch_size,
                                  lambda i: chunk_generator(cfg.seed, update, position + i, device, GREEDY_STREAM))
    greedy.prompts = prompt_ids
    with autocast(model_device(models.reward) if models.reward is not None else device, precision):  # as score_rollout scores
        scores = model_scores(models, greedy, cfg)
    components, _ = reward_components(models, greedy, scores, texts, cfg.max_response_length)
    raw = models.reward_sources().combine(components)
    return shaped_scores(cfg, raw, greedy.lengths, greedy.has_eos)


def informative_groups(batch: RolloutBatch, cfg: OnPolicyConfig) -> torch.Tensor:
    """(B,) True for the rows of groups whose shaped scores spread by more than dynamic_sampling_min_spread."""
    scores = shaped_scores(cfg, batch.raw_scores, batch.lengths, batch.has_eos)
    return ops.group_spread(scores, row_groups(batch, cfg)) > cfg.dynamic_sampling_min_spread


def dynamic_sample(draw, cfg: OnPolicyConfig, counts: dict[str, float], pad_id: int) -> RolloutBatch:
    """DAPO's dynamic sampling: draws until the update holds prompts-per-update informative groups, or
    dynamic_sampling_max_draws draws; short of that, the update is filled with dropped groups (which
    add nothing to the gradient), so its shape never changes. Tallies the groups in `counts`."""
    group, wanted = cfg.samples_per_prompt, prompts_per_update(cfg)
    kept: list[RolloutBatch] = []
    dropped: list[RolloutBatch] = []
    kept_groups = dropped_groups = draws = 0
    while kept_groups < wanted and draws < cfg.dynamic_sampling_max_draws:
        batch = draw(draws)
        draws += 1
        keep = informative_groups(batch, cfg)
        kept.append(batch.select(keep))
        dropped.append(batch.select(~keep))
        kept_groups += int(keep.sum()) // group
        dropped_groups += int((~keep).sum()) // group
    filled = max(0, wanted - kept_groups)
    counts |= {"sampling/draws": float(draws), "sampling/dropped_groups": float(dropped_groups),
               "sampling/filled_groups": float(filled), "sampling/kept_share": kept_groups / max(1, kept_groups + dropped_groups)}
    return concatenate_rows(kept + dropped, wanted * group, pad_id)


def concatenate_rows(parts: list[RolloutBatch], rows: int, pad_id: int) -> RolloutBatch:
    """The first `rows` rows of `parts`, in order, padded to their widest query and response."""
    parts = [p for p in parts if p.size]
    query_width = max(p.context_length for p in parts)
    response_width = max(p.responses.size(1) for p in parts)
    wide = [widen(p, query_width, response_width, pad_id) for p in parts]
    fields = wide[0].tensors().keys()
    joined = {k: torch.cat([w.tensors()[k] for w in wide])[:rows] for k in fields}
    return dataclasses.replace(wide[0], **joined)
