"""Collection, the first phase of an update: prompts drawn from the stream, sampled, scored and
gathered across processes (Detail 21, Section 7).

    prompts  = the next total_batch_size / samples_per_prompt prompts of an endless stream over a
               fresh permutation per pass                                               (Detail 21)
    episodes = samples_per_prompt responses to each prompt, sampled by each process for its
               contiguous share of the prompts (whole groups), then scored (`scoring.score_rollout`)
    rollout  = every process's episodes, gathered in process order: the update's whole rollout

Every sampled row draws from its own RNG, derived from (seed, update, the position of its prompt in
the update, its index in the group) (`generation.SampleKeys`), so a resumed run needs no RNG state
and every response is the same however the update is split into generation chunks and processes.
Usually one draw is the update. With DAPO's dynamic sampling, groups whose scores do not
differ (all their advantages would be 0) are dropped and further draws refill the update, up to
dynamic_sampling_max_draws; every process decides on the same gathered scores, so all keep the same
groups. An estimator that declares a greedy baseline (ReMax) also has each prompt answered greedily
and that answer scored.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import ops
from ..config import RolloutOptions
from ..devices import autocast, evaluation_mode, model_device
from ..distributed import ONE_PROCESS, process_share
from ..generation import TRAINING_STREAM, SampleKeys, SamplingParams, sample_responses
from ..rollout import RolloutBatch
from .advantages import needs_of, row_groups, shaped_scores
from .episodes import episode_prompts
from .scoring import OnPolicyModels, PromptTexts, ScoringPlan, model_scores, reward_components, score_rollout

GREEDY_STREAM = 17  # ReMax's greedy answers draw no randomness, but keep their row keys apart anyway


@dataclass
class PromptStream:
    """How far the run has read the prompt stream: an update reads one draw, more with dynamic sampling.
    Saved in checkpoints, so a resumed run draws the prompts it would have."""

    position: int = 0


@dataclass(frozen=True)
class RolloutSetup:
    """What every update's rollout is collected from, fixed for the run: the models, the prompts and
    what reward functions read about them, how it is sampled and scored, the precision and the processes."""

    models: OnPolicyModels
    prompts: list[list[int]]
    options: RolloutOptions
    scoring: ScoringPlan
    precision: str
    accelerator: Any = ONE_PROCESS
    texts: PromptTexts | None = None


def collect(setup: RolloutSetup, update: int, timings: dict[str, float], show=lambda phase: None,
            stream: PromptStream | None = None, counts: dict[str, float] | None = None) -> RolloutBatch:
    """Sample and score update `update` (0-based) from `stream` (None: the update's own place in it,
    update x prompts per update), gathered into the whole update's rollout; `show(phase)` reports
    progress, `timings` gets each phase's seconds. Dynamic sampling's tallies go to `counts`."""
    options = setup.options
    stream = stream if stream is not None else PromptStream(update * options.prompts_per_update)
    timings["generation"] = timings["scoring"] = 0.0

    def draw(attempt: int) -> RolloutBatch:
        return draw_rollout(setup, update, attempt, stream, timings, show)

    if options.dynamic_sampling:
        tallies = counts if counts is not None else {}
        return dynamic_sample(draw, options, tallies, setup.models.tokenizer.pad_token_id)
    return draw(0)


def draw_rollout(setup: RolloutSetup, update: int, attempt: int, stream: PromptStream,
                 timings: dict[str, float], show) -> RolloutBatch:
    """The next draw of the stream, sampled by every process for its share and gathered, scored."""
    models, options, accelerator = setup.models, setup.options, setup.accelerator
    device = next(models.policy.parameters()).device
    per_update = options.prompts_per_update
    picked = prompt_indices(len(setup.prompts), per_update, options.seed, stream.position)
    stream.position += per_update
    share = process_share(per_update, accelerator.process_index, accelerator.num_processes)
    offset = attempt * per_update  # the row RNGs of a refill are keyed past those of the earlier draws
    params = SamplingParams(max_new_tokens=options.max_response_length, temperature=options.temperature,
                            decoding=options.decoding)
    own = [setup.prompts[i] for i in picked[share]]
    show("sampling")
    began = time.perf_counter()
    # eval mode: with activation checkpointing on, a model in train mode refuses the KV cache
    with autocast(device, setup.precision), evaluation_mode(models.policy):
        batch = sample_responses(
            models.policy, own, params, models.tokenizer, options.generation_batch_size,
            SampleKeys(options.seed, update, TRAINING_STREAM, offset + share.start),
            samples_per_prompt=options.samples_per_prompt, episodes=models.episodes,
            prompts=episode_prompts(setup.texts, picked[share].tolist()) if models.episodes is not None else ())
    batch.prompts = torch.as_tensor(picked[share], device=device).repeat_interleave(options.samples_per_prompt)
    if needs_of(options.advantage_estimator).greedy_baseline:  # its greedy answers count as generation time
        prompt_ids = batch.prompts[:: options.samples_per_prompt]
        baseline = greedy_baseline(setup, own, prompt_ids, update, offset + share.start)
        batch.baseline_scores = baseline.repeat_interleave(options.samples_per_prompt)
    timings["generation"] += time.perf_counter() - began
    show("scoring")
    began = time.perf_counter()
    batch = widen_to_all_processes(batch, accelerator, models.tokenizer.pad_token_id)
    batch = gather_rollout(score_rollout(models, batch, setup.scoring, setup.precision, setup.texts), accelerator)
    timings["scoring"] += time.perf_counter() - began
    # on the whole batch: every process alike
    models.reward_sources().check_update(batch, update + 1, accelerator)
    return batch


@torch.no_grad()
def greedy_baseline(setup: RolloutSetup, queries: list[list[int]], prompt_ids: torch.Tensor, update: int,
                    position: int) -> torch.Tensor:
    """ReMax (Li et al. 2023): (P,) the shaped score of each prompt's greedy answer, from the same
    reward model and functions as the sampled answers."""
    models, options, precision = setup.models, setup.options, setup.precision
    device = next(models.policy.parameters()).device
    params = SamplingParams(max_new_tokens=options.max_response_length, temperature=0.0, decoding=options.decoding)
    with autocast(device, precision), evaluation_mode(models.policy):
        greedy = sample_responses(
            models.policy, queries, params, models.tokenizer, options.generation_batch_size,
            SampleKeys(options.seed, update, GREEDY_STREAM, position), episodes=models.episodes,
            prompts=episode_prompts(setup.texts, prompt_ids.tolist()) if models.episodes is not None else ())
    greedy.prompts = prompt_ids
    # under the autocast score_rollout scores in
    with autocast(model_device(models.reward) if models.reward is not None else device, precision):
        scores = model_scores(models, greedy, options.forward_batch_size)
    components, failed = reward_components(models, greedy, scores, setup.texts, options.max_response_length)
    raw = models.reward_sources().combine(components, failed)
    return shaped_scores(options.shaping, raw, greedy.lengths, greedy.has_eos)


def informative_groups(batch: RolloutBatch, options: RolloutOptions) -> torch.Tensor:
    """(B,) True for the rows of groups whose shaped scores spread by more than
    dynamic_sampling_min_spread."""
    scores = shaped_scores(options.shaping, batch.raw_scores, batch.lengths, batch.has_eos)
    spread = ops.group_spread(scores, row_groups(batch, options.samples_per_prompt))
    return spread > options.dynamic_sampling_min_spread


def dynamic_sample(draw, options: RolloutOptions, counts: dict[str, float], pad_id: int) -> RolloutBatch:
    """DAPO's dynamic sampling: draws until the update holds prompts-per-update informative groups, or
    dynamic_sampling_max_draws draws; short of that, the update is filled with dropped groups (which
    add nothing to the gradient), so its shape never changes. Tallies the groups in `counts`."""
    group, wanted = options.samples_per_prompt, options.prompts_per_update
    kept: list[RolloutBatch] = []
    dropped: list[RolloutBatch] = []
    kept_groups = dropped_groups = draws = 0
    while kept_groups < wanted and draws < options.dynamic_sampling_max_draws:
        batch = draw(draws)
        draws += 1
        keep = informative_groups(batch, options)
        kept.append(batch.select(keep))
        dropped.append(batch.select(~keep))
        kept_groups += int(keep.sum()) // group
        dropped_groups += int((~keep).sum()) // group
    filled = max(0, wanted - kept_groups)
    counts |= {"sampling/draws": float(draws), "sampling/dropped_groups": float(dropped_groups),
               "sampling/filled_groups": float(filled),
               "sampling/kept_share": kept_groups / max(1, kept_groups + dropped_groups)}
    return concatenate_rows(kept + dropped, wanted * group, pad_id)


def concatenate_rows(parts: list[RolloutBatch], rows: int, pad_id: int) -> RolloutBatch:
    """The first `rows` rows of `parts`, in order, padded to their widest query and response."""
    parts = [p for p in parts if p.size]
    query_width = max(p.context_length for p in parts)
    response_width = max(p.responses.size(1) for p in parts)
    wide = [widen(p, query_width, response_width, pad_id) for p in parts]
    return RolloutBatch.joined(wide).select(slice(0, rows))


def prompt_indices(num_prompts: int, count: int, seed: int, start: int) -> np.ndarray:
    """Detail 21: prompts `start .. start+count` of an endless stream that walks through a fresh
    permutation of the prompts each time the previous one is used up (sampling without replacement).
    A function of (seed, position) only, so a resumed run draws exactly the prompts it would have."""
    positions = np.arange(start, start + count)
    epochs, offsets = np.divmod(positions, num_prompts)
    perms = {int(e): np.random.default_rng([seed, int(e)]).permutation(num_prompts)
             for e in np.unique(epochs)}
    return np.array([perms[int(e)][o] for e, o in zip(epochs, offsets, strict=True)], dtype=np.int64)


QUERY_COLUMNS = ("query_ids", "query_mask")  # left padded: widened on the left
ROW_COLUMNS = ("reward_components", "reward_failures")  # one column per component: never widened


def widen(batch: RolloutBatch, query_width: int, response_width: int, pad_id: int) -> RolloutBatch:
    """The same rollout with queries left padded to `query_width` and responses right padded to
    `response_width` columns: masked columns, which change no masked sum."""
    def pad(name: str, value: torch.Tensor) -> torch.Tensor:
        if value.dim() == 1 or name in ROW_COLUMNS:
            return value
        target = query_width if name in QUERY_COLUMNS else response_width
        missing = target - value.size(1)
        filler = pad_id if name in ("query_ids", "responses") else 0
        side = (missing, 0) if name in QUERY_COLUMNS else (0, missing)
        return torch.nn.functional.pad(value, side, value=filler) if missing else value

    episodes = batch.episodes.widened(response_width) if batch.episodes is not None else None
    return dataclasses.replace(batch, **{k: pad(k, v) for k, v in batch.tensors().items()}, episodes=episodes)


def widen_to_all_processes(batch: RolloutBatch, accelerator, pad_id: int) -> RolloutBatch:
    """This process's rows padded to the widest query and response of any process: the columns a
    single process sampling the whole update would have, so that every forward pass sees each row
    exactly as that process would (padding is masked, but bf16 sums still depend on the width)."""
    if accelerator.num_processes == 1:
        return batch
    widths = torch.tensor([batch.context_length, batch.responses.size(1)], device=accelerator.device)
    query_width, response_width = accelerator.reduce(widths, "max").tolist()
    return widen(batch, query_width, response_width, pad_id)


def gather_rollout(batch: RolloutBatch, accelerator) -> RolloutBatch:
    """The whole update's rollout on every process, from rows already widened alike
    (`widen_to_all_processes`): each process's rows in process order, which is the prompt order of
    a single-process run."""
    if accelerator.num_processes == 1:
        return batch
    return batch.map_tensors(lambda value: gather_rows(value, accelerator))


def gather_rows(value: torch.Tensor, accelerator) -> torch.Tensor:
    """Every process's rows of `value`, in process order (booleans travel as bytes: gloo has no bool)."""
    if value.dtype == torch.bool:
        return accelerator.gather(value.to(torch.uint8)).bool()
    return accelerator.gather(value)
