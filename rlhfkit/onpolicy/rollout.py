"""The rollout: one update's prompts, sampled responses and everything computed on them.

Prompts come from an endless stream over a fresh permutation per pass (Detail 21); an update takes
the next total_batch_size / samples_per_prompt of them, and under N processes each process samples a
contiguous share of that list (whole groups: a GRPO/RLOO group never spans processes). Every
generation chunk draws from its own RNG, derived from (seed, update, the position of its first prompt
in the update), so a resumed run needs no RNG state and a prompt sampled alone in its chunk gets the
same responses however the update is split across processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from ..data.collate import left_pad_queries
from ..devices import model_device
from ..generation import SamplingParams, generate
from ..sharding import gathered_for_generation


@dataclass
class RolloutBatch:
    """One update's episodes. B rows; queries left padded to Q columns, responses R columns."""

    prompts: torch.Tensor  # (B,) index of each row's prompt
    query_ids: torch.Tensor  # (B, Q)
    query_mask: torch.Tensor  # (B, Q)
    responses: torch.Tensor  # (B, R) cut after the first EOS, PAD after it
    mask: torch.Tensor  # (B, R) bool: tokens up to and including EOS
    has_eos: torch.Tensor  # (B,)
    logprobs: torch.Tensor | None = None  # (B, R) policy at sampling time (the "old" policy)
    ref_logprobs: torch.Tensor | None = None  # (B, R) frozen reference policy
    values: torch.Tensor | None = None  # (B, R) value model at sampling time
    reward_components: torch.Tensor | None = None  # (B, C) each reward function's score, then the reward model's
    reward_failures: torch.Tensor | None = None  # (B, F) bool: the row a reward function failed on (scored reward_error_score)
    raw_scores: torch.Tensor | None = None  # (B,) the components' weighted sum
    scores: torch.Tensor | None = None  # (B,) after the EOS trick
    kl: torch.Tensor | None = None  # (B, R) per-token KL estimate
    rewards: torch.Tensor | None = None  # (B, R) equation 3
    advantages: torch.Tensor | None = None  # (B, R)
    returns: torch.Tensor | None = None  # (B, R)
    baseline_scores: torch.Tensor | None = None  # (B,) ReMax: the shaped score of the row's prompt's greedy response

    @property
    def size(self) -> int:
        return self.responses.size(0)

    @property
    def context_length(self) -> int:
        return self.query_ids.size(1)

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.responses], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask, self.mask.to(self.query_mask.dtype)], dim=1)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def map_tensors(self, fn) -> RolloutBatch:
        return dataclasses.replace(self, **{k: fn(v) for k, v in self.tensors().items()})

    def select(self, rows: torch.Tensor | np.ndarray | slice) -> RolloutBatch:
        """The same fields for a subset of rows (columns unchanged, so every row is computed alike)."""
        return self.map_tensors(lambda v: v[rows])

    def to(self, device: torch.device) -> RolloutBatch:
        return self.map_tensors(lambda v: v.to(device))


def prompt_indices(num_prompts: int, count: int, seed: int, start: int) -> np.ndarray:
    """Detail 21: prompts `start .. start+count` of an endless stream that walks through a fresh
    permutation of the prompts each time the previous one is used up (sampling without replacement).
    A function of (seed, position) only, so a resumed run draws exactly the prompts it would have."""
    positions = np.arange(start, start + count)
    epochs, offsets = np.divmod(positions, num_prompts)
    perms = {int(e): np.random.default_rng([seed, int(e)]).permutation(num_prompts) for e in np.unique(epochs)}
    return np.array([perms[int(e)][o] for e, o in zip(epochs, offsets, strict=True)], dtype=np.int64)


def process_share(count: int, rank: int, processes: int) -> slice:
    """The contiguous part of `count` items (an update's prompts or rows) that process `rank` handles."""
    per_process = count // processes
    return slice(rank * per_process, (rank + 1) * per_process)


TRAINING_STREAM, EVALUATION_STREAM = 7, 13


def chunk_generator(seed: int, update: int, position: int, device: torch.device, stream: int = TRAINING_STREAM) -> torch.Generator:
    """The sampling RNG of the generation chunk whose first prompt is prompt `position` of the update,
    derived from (seed, update, stream, position) alone."""
    key = np.random.default_rng([seed, update, stream, position]).integers(2**62)
    return torch.Generator(device=device).manual_seed(int(key))


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
    generator_for: Callable[[int], torch.Generator],
    desc: str = "",
    samples_per_prompt: int = 1,
) -> RolloutBatch:
    """Sample `samples_per_prompt` (G) responses per query, longest queries first to pad less. Row
    g + G*i is sample g of query i; `batch_size` counts rows, and each query is encoded once.
    `generator_for(i)` is the RNG of the chunk whose first query is query i."""
    device = model_device(policy)
    group = samples_per_prompt
    padded = left_pad_queries(queries, tokenizer.pad_token_id)
    query_ids, query_mask = padded["input_ids"].to(device), padded["attention_mask"].to(device)
    order = sorted(range(len(queries)), key=lambda i: -len(queries[i]))
    per_chunk = max(1, batch_size // group)
    chunks = []
    with gathered_for_generation(policy):
        for start in tqdm(range(0, len(order), per_chunk), desc=desc or "sampling", unit="batch", leave=False, disable=not desc):
            picked = torch.tensor(order[start : start + per_chunk], device=device)
            ids, mask = trim_left_padding(query_ids[picked], query_mask[picked])
            out = generate(policy, ids, mask, params, tokenizer.eos_token_id, tokenizer.pad_token_id, generator_for(order[start]), group)
            rows = (picked.unsqueeze(1) * group + torch.arange(group, device=device)).reshape(-1)
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
    prompts = torch.arange(len(queries), device=device).repeat_interleave(group)
    return RolloutBatch(prompts, query_ids.repeat_interleave(group, 0), query_mask.repeat_interleave(group, 0), responses, mask, has_eos)


QUERY_COLUMNS = ("query_ids", "query_mask")  # left padded: widened on the left


def widen(batch: RolloutBatch, query_width: int, response_width: int, pad_id: int) -> RolloutBatch:
    """The same rollout with queries left padded to `query_width` and responses right padded to
    `response_width` columns: masked columns, which change no masked sum."""
    def pad(name: str, value: torch.Tensor) -> torch.Tensor:
        if value.dim() == 1:
            return value
        target = query_width if name in QUERY_COLUMNS else response_width
        missing = target - value.size(1)
        filler = pad_id if name in ("query_ids", "responses") else 0
        side = (missing, 0) if name in QUERY_COLUMNS else (0, missing)
        return torch.nn.functional.pad(value, side, value=filler) if missing else value

    return dataclasses.replace(batch, **{k: pad(k, v) for k, v in batch.tensors().items()})


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
    return dataclasses.replace(batch, **{k: gather_rows(v, accelerator) for k, v in batch.tensors().items()})


def gather_rows(value: torch.Tensor, accelerator) -> torch.Tensor:
    """Every process's rows of `value`, in process order (booleans travel as bytes: gloo has no bool)."""
    if value.dtype == torch.bool:
        return accelerator.gather(value.to(torch.uint8)).bool()
    return accelerator.gather(value)
