"""Sampling from a policy: batched generation from left-padded queries with the KV cache, and the
one way to sample many prompts (`sample_responses`: chunks, longest queries first, G samples per
prompt, into one `RolloutBatch`), with the decoded texts.

Every row draws from its own RNG, keyed by (seed, update, stream, the prompt's index in the update, the
sample's index in its group) (`SampleKeys`), one draw per decoding step: a sampled token is a function
of those and its position alone, never of the generation batch size, the chunking, the length sort,
the number of processes or the decoding path (docs/reliability.md, "The same samples however a batch
is split"). A resumed run needs no RNG state.

`generate` returns the sampled tokens and the responses truncated after the first EOS with PAD after
it: the mechanics the PPO EOS trick (Detail 23) needs. Rows that never emit EOS keep all their tokens.
Sampling divides the logits by the temperature (Table 7); the log-probabilities of the sampled tokens
are recomputed in one forward pass where they are needed (`logprobs.response_logprobs`), the way the
trainers compute them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .data.collate import left_pad_queries
from .decoding import decoding_steps, eager
from .decoding.buckets import GraphMismatch
from .devices import evaluation_mode, model_device
from .environments import ChunkEpisodes, EpisodePlan, EpisodePrompt, EpisodeStart
from .ops import (
    filter_logits,
    first_true_indices,
    position_ids_from_mask,
    sample_rows,
    truncate_after_eos,
)
from .rollout import Episodes, RolloutBatch
from .sharding import gathered_for_generation


@dataclass
class SamplingParams:
    max_new_tokens: int = 53
    temperature: float = 0.7  # 0 means greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    decoding: str = "auto"  # decoding.DECODING: how the steps after the prompt run; never what is sampled


@dataclass
class Rollout:
    queries: torch.Tensor  # (B, Q) left padded
    responses: torch.Tensor  # (B, R) truncated after the first EOS, PAD after it
    lengths: torch.Tensor  # (B,) tokens up to and including EOS (R when there is none)
    has_eos: torch.Tensor  # (B,) whether the response contains EOS
    decoding: str = "eager"  # how the steps ran: eager, buckets or cuda-graphs
    episodes: Episodes | None = None  # multi-turn episodes: what they add to the rows


def pick_next(
    logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator], pad_id: int | None = None
) -> torch.Tensor:
    """The next token of each row, greedy or sampled (row i from `generators[i]`); never PAD (Detail 3:
    PAD marks where a response ended, so a sampled PAD would move where the reward model reads its score)."""
    if pad_id is not None and pad_id < logits.size(-1):
        logits = logits.clone()
        logits[..., pad_id] = float("-inf")
    if params.temperature <= 0:
        return logits.argmax(-1)
    filtered = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    return sample_rows(filtered.softmax(-1), generators)


TRAINING_STREAM, EVALUATION_STREAM = 7, 13


@dataclass(frozen=True)
class SampleKeys:
    """Where the randomness of a call's rows comes from: sample g of query i draws from an RNG seeded
    by (seed, update, stream, first_prompt + i, g) alone. `first_prompt` is the position in the update
    of the call's query 0 (a process's share starts past the others'); the stream keeps training,
    evaluation and baseline draws apart."""

    seed: int
    update: int = 0
    stream: int = TRAINING_STREAM
    first_prompt: int = 0

    def row_seed(self, query: int, sample: int) -> int:
        key = [self.seed, self.update, self.stream, self.first_prompt + query, sample]
        return int(np.random.default_rng(key).integers(2**62))

    def row_seeds(self, queries: Sequence[int], samples_per_prompt: int) -> list[int]:
        """The seeds of the rows of `queries` (indices of the caller's queries), G consecutive rows each."""
        return [self.row_seed(q, g) for q in queries for g in range(samples_per_prompt)]


def row_generators(seeds: Sequence[int], device: torch.device) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(seed) for seed in seeds]


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    params: SamplingParams,
    eos_id: int,
    pad_id: int,
    seeds: Sequence[int] | None = None,
    samples_per_prompt: int = 1,
    episodes: ChunkEpisodes | None = None,
) -> Rollout:
    """Sample up to `max_new_tokens` for each left-padded query; stop early once every row has EOS.
    Output row r draws from an RNG seeded with `seeds[r]` (default: `SampleKeys(params.seed)`'s, query
    i's sample g at row g + G x i), one draw per step.
    With `episodes` (the rows' episodes, rlhfkit/environments/plan.py) each row is a multi-turn episode: the
    environment's ids are fed between the policy's turns, and a row ends when its episode does.

    With `samples_per_prompt` G > 1 each query is encoded once and its KV cache repeated G times, so
    a group of G samples (GRPO, RLOO) costs one prefill; the rows come out as G consecutive samples
    of query 0, then of query 1, and so on. Decoding writes into a KV cache laid out once for the
    whole batch (`decoding.eager.static_decode_cache`) where the model allows it; on a CUDA device each
    step is a replayed CUDA graph and finished rows are dropped (rlhfkit/decoding/, `params.decoding`)."""
    device = query_ids.device
    if seeds is None:
        seeds = SampleKeys(params.seed).row_seeds(range(query_ids.size(0)), samples_per_prompt)
    with eager.frozen_weights_cast_once(model, device):
        try:
            return prefill_and_decode(
                model, query_ids, query_mask, params, eos_id, pad_id, row_generators(seeds, device),
                samples_per_prompt, episodes,
            )
        except GraphMismatch:  # again with eager steps and fresh RNGs: what an eager call samples
            eager_params = dataclasses.replace(params, decoding="eager")
            return prefill_and_decode(
                model, query_ids, query_mask, eager_params, eos_id, pad_id, row_generators(seeds, device),
                samples_per_prompt, episodes,
            )


def prefill_and_decode(
    model: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    params: SamplingParams,
    eos_id: int,
    pad_id: int,
    generators: list[torch.Generator],
    samples_per_prompt: int,
    episodes: ChunkEpisodes | None = None,
) -> Rollout:
    """`generate`'s prefill and decoding loop. Sampling happens here, on every row's logits, whichever
    way the steps run (`decoding_steps`), so the random streams do not depend on it, nor on what an
    episode's environment inserts: every row samples at every step from its own RNG (`generators`), a
    finished or forced row discarding its sample."""
    device = query_ids.device
    # logits_to_keep=1: only the last position's logits are needed, not (B, Q, vocab)
    out = model(
        input_ids=query_ids,
        attention_mask=query_mask,
        position_ids=position_ids_from_mask(query_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    query_ids, query_mask, logits = (
        t.repeat_interleave(samples_per_prompt, dim=0) for t in (query_ids, query_mask, out.logits[:, -1])
    )
    steps = decoding_steps(
        model, eager.returned_cache(out), query_mask, samples_per_prompt, params.decoding, params.max_new_tokens, logits
    )
    tokens = []
    finished = torch.zeros(query_ids.size(0), dtype=torch.bool, device=device)
    driver = episodes.driver(params.max_new_tokens, params.temperature) if episodes is not None else None
    for step in range(params.max_new_tokens):
        nxt = pick_next(logits, params, generators, pad_id)
        if driver is None:
            finished |= nxt == eos_id
        else:
            nxt, finished = driver.advance(nxt, logits)
        tokens.append(nxt)
        if bool(finished.all()) or len(tokens) == params.max_new_tokens:
            break
        logits = steps.step(nxt, finished, step)
    if driver is not None:
        results = driver.results(len(tokens), device)
        return Rollout(query_ids, results.responses, results.lengths, results.has_eos, steps.name, results.episodes)
    raw = torch.stack(tokens, dim=1)
    responses = truncate_after_eos(raw, eos_id, pad_id)
    eos_at = first_true_indices(raw == eos_id)
    has_eos = eos_at < raw.size(1)
    lengths = torch.where(has_eos, eos_at + 1, torch.full_like(eos_at, raw.size(1)))
    return Rollout(query_ids, responses, lengths, has_eos, steps.name)


def trim_left_padding(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (a length-sorted chunk needs fewer)."""
    used = mask.sum(0).nonzero()
    first = int(used[0]) if used.numel() else 0
    return ids[:, first:], mask[:, first:]


@torch.no_grad()
def sample_responses(
    policy: torch.nn.Module,
    queries: list[list[int]],
    params: SamplingParams,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    keys: SampleKeys,
    desc: str = "",
    samples_per_prompt: int = 1,
    episodes: EpisodePlan | None = None,
    prompts: Sequence[EpisodePrompt] = (),
) -> RolloutBatch:
    """Sample `samples_per_prompt` (G) responses per query, longest queries first to pad less. Row
    g + G*i is sample g of query i, drawn from its own RNG (`keys`); `batch_size` counts rows, and
    each query is encoded once. With `episodes` each row is a multi-turn episode of the plan's environment,
    started from its query's `prompts` entry."""
    if episodes is not None and len(prompts) != len(queries):
        raise ValueError(f"episodes start from each query's prompt: {len(prompts)} prompts for {len(queries)} queries")
    device = model_device(policy)
    group = samples_per_prompt
    padded = left_pad_queries(queries, tokenizer.pad_token_id)
    query_ids, query_mask = padded["input_ids"].to(device), padded["attention_mask"].to(device)
    order = sorted(range(len(queries)), key=lambda i: -len(queries[i]))
    per_chunk = max(1, batch_size // group)
    chunks = []
    with gathered_for_generation(policy):
        for start in tqdm(
            range(0, len(order), per_chunk), desc=desc or "sampling", unit="batch", leave=False, disable=not desc
        ):
            picked = torch.tensor(order[start : start + per_chunk], device=device)
            ids, mask = trim_left_padding(query_ids[picked], query_mask[picked])
            rows = (picked.unsqueeze(1) * group + torch.arange(group, device=device)).reshape(-1)
            out = generate(
                policy,
                ids,
                mask,
                params,
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
                keys.row_seeds(order[start : start + per_chunk], group),
                group,
                None if episodes is None else chunk_episodes(episodes, tokenizer, prompts, rows.tolist(), keys, group),
            )
            chunks.append((rows, out))
    total = len(queries) * group
    width = max(out.responses.size(1) for _, out in chunks)
    responses = torch.full((total, width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    lengths = torch.zeros(total, dtype=torch.long, device=device)
    has_eos = torch.zeros(total, dtype=torch.bool, device=device)
    for rows, out in chunks:
        responses[rows, : out.responses.size(1)] = out.responses
        lengths[rows], has_eos[rows] = out.lengths, out.has_eos
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    prompt_rows = torch.arange(len(queries), device=device).repeat_interleave(group)
    query_ids, query_mask = query_ids.repeat_interleave(group, 0), query_mask.repeat_interleave(group, 0)
    gathered = gathered_episodes(chunks, total, width) if episodes is not None else None
    return RolloutBatch(prompt_rows, query_ids, query_mask, responses, mask, has_eos, episodes=gathered)


def chunk_episodes(plan: EpisodePlan, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[EpisodePrompt],
                   rows: list[int], keys: SampleKeys, group: int) -> ChunkEpisodes:
    """The episodes of a chunk's `rows` (row g + `group` x i: sample g of query i), each environment seeded by
    its row's place in the update, as its sampling RNG is keyed (`SampleKeys`)."""
    picked = [prompts[row // group] for row in rows]
    first = keys.first_prompt * group
    starts = [
        EpisodeStart(p.prompt, p.columns, plan.seed(keys.update, keys.stream, first + row))
        for row, p in zip(rows, picked, strict=True)
    ]
    return ChunkEpisodes(plan, tokenizer, starts, [p.label(row) for row, p in zip(rows, picked, strict=True)])


def gathered_episodes(chunks: list[tuple[torch.Tensor, Rollout]], total: int, width: int) -> Episodes:
    """The chunks' episodes (`Rollout.episodes`) in row order, `width` columns wide."""
    widened = [(rows, out.episodes.widened(width)) for rows, out in chunks]
    gathered = widened[0][1].map(lambda value: value.new_zeros((total, *value.shape[1:])))
    into = gathered.tensors()
    for rows, episodes in widened:
        for name, value in episodes.tensors().items():
            into[name][rows] = value
    return gathered


def sample_held_out(
    policy: torch.nn.Module,
    queries: list[list[int]],
    params: SamplingParams,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    seed: int,
    desc: str,
    samples_per_prompt: int = 1,
    episodes: EpisodePlan | None = None,
    prompts: Sequence[EpisodePrompt] = (),
) -> RolloutBatch:
    """`sample_responses` for an evaluation: the policy in evaluation mode, each row's RNG on the
    evaluation stream, a function of (seed, its prompt, its sample) alone, so held-out answers are the
    same whatever was sampled before them."""
    with evaluation_mode(policy):
        return sample_responses(
            policy,
            queries,
            params,
            tokenizer,
            batch_size,
            SampleKeys(seed, 0, EVALUATION_STREAM),
            desc,
            samples_per_prompt,
            episodes,
            prompts,
        )


def completion_texts(batch: RolloutBatch, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The decoded responses without special tokens: what reward functions and evaluations read."""
    return [
        tokenizer.decode(batch.responses[i][batch.mask[i]].tolist(), skip_special_tokens=True)
        for i in range(batch.size)
    ]


def response_texts(rollout: Rollout | RolloutBatch, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Decoded responses without EOS or PAD (other special tokens kept)."""
    texts = []
    for row, length in zip(rollout.responses, rollout.lengths.tolist(), strict=True):
        ids = row[:length].tolist()
        ends = (tokenizer.eos_token_id, tokenizer.pad_token_id)
        texts.append(tokenizer.decode([t for t in ids if t not in ends]))
    return texts


def generate_texts(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    queries: list[list[int]],
    params: SamplingParams,
    batch_size: int = 8,
    desc: str = "generating",
) -> list[dict]:
    """One response per query, in input order, by `sample_held_out` at `params.seed`: query i's answer
    is the same whatever the batch size (greedy by default, where no RNG is read)."""
    batch = sample_held_out(model, queries, params, tokenizer, batch_size, params.seed, desc)
    rows = zip(
        response_texts(batch, tokenizer), batch.lengths.tolist(), batch.has_eos.tolist(), batch.responses, strict=True
    )
    return [
        {"text": text.strip(), "tokens": length, "has_eos": has_eos, "ids": ids[:length].tolist()}
        for text, length, has_eos, ids in rows
    ]
