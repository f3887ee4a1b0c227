"""Records to token ids: queries (Detail 2) and completions (Detail 3), with every skip counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from ..config.sections import PairLengths
from ..errors import ConfigError, warn
from .formats import CHAT, QueryTokens, QueryTooLong, encode_completion, encode_query
from .records import SkipLog
from .tldr import Comparison, SFTRecord

T = TypeVar("T", "SFTExample", "PairExample")
# the option that lets in the records skipped for each reason a tokenizer skips one
LENGTH_OPTIONS = {"query_too_long": "max_query_length", "response_too_long": "max_response_length"}


@dataclass
class SFTExample:
    record: SFTRecord
    query: QueryTokens
    response: list[int]  # the completion + EOS (Detail 3: after a seed's prompt, a leading space first)

    def width(self) -> int:
        """Tokens in the row the collator pads."""
        return len(self.query.ids) + len(self.response)


def reward_prompt(example: SFTExample) -> list[dict] | str:
    """The prompt as TRL gives it to reward functions (and environments read it): a conversation's messages as
    the dataset holds them (before any turn is dropped to fit max_query_length), else the query's text as the
    policy read it."""
    if example.record.task == CHAT:
        return json.loads(example.record.fields["messages"])
    return example.query.text


@dataclass
class PairExample:
    record: Comparison
    query: QueryTokens
    chosen: list[int]
    rejected: list[int]

    def width(self) -> int:
        """Tokens in the longer of the pair's two rows, which sets its padded width."""
        return len(self.query.ids) + max(len(self.chosen), len(self.rejected))

    def packed_width(self) -> int:
        """Tokens in the pair's one packed row, query + chosen + rejected (`collate.pack_pairs`)."""
        return len(self.query.ids) + len(self.chosen) + len(self.rejected)

    def response_lengths(self) -> tuple[int, int]:
        """(chosen, rejected) response tokens before EOS: the length unit of ODIN's correlations and of
        the length baseline."""
        return len(self.chosen) - 1, len(self.rejected) - 1


def response_length_columns(examples: list[PairExample]) -> tuple[list[int], list[int]]:
    """The `PairExample.response_lengths` of many pairs as two columns: (chosen lengths, rejected lengths)."""
    pairs = [e.response_lengths() for e in examples]
    return [chosen for chosen, _ in pairs], [rejected for _, rejected in pairs]


def tokenize_sft(
    records: list[SFTRecord], tokenizer: PreTrainedTokenizerBase, max_query_length: int, max_response_length: int
) -> tuple[list[SFTExample], SkipLog]:
    log = SkipLog()
    out = []
    for r in records:
        response = encode_completion(tokenizer, r.summary, r.task)
        try:
            query = encode_query(tokenizer, r.task, r.fields, max_query_length)
        except QueryTooLong:
            log.skip("query_too_long", r.where)
            continue
        # a text without a prompt (language modelling) may use the query's budget too: its row is no wider than others
        budget = max_response_length if query.ids else max_query_length + max_response_length
        if len(response) > budget:
            log.skip("response_too_long", r.where)
            continue
        out.append(SFTExample(r, query, response))
    log.kept = len(out)
    return out, log


def training_examples(tokenized: tuple[list[T], SkipLog], max_query_length: int, what: str) -> tuple[list[T], SkipLog]:
    """`tokenized` (a stage's training examples and their skip log) as it trains on them: when none is left,
    an error naming why they were skipped and the option to raise; when most queries were cut to fit, a
    warning naming `max_query_length`."""
    examples, log = tokenized
    if not examples and log.skipped:
        options = " or ".join(LENGTH_OPTIONS[reason] for reason in log.counts)
        raise ConfigError(f"no {what} left to train on ({log.summary(what)}); raise {options}")
    cut = sum(e.query.truncated for e in examples)
    if cut * 2 > len(examples):
        warn(
            f"{cut} of {len(examples)} {what} were cut to fit max_query_length={max_query_length} tokens and lost part "
            "of "
            "their prompt; raise max_query_length to keep more of it"
        )
    return tokenized


def query_limits(max_query_length: int, max_article_query_length: int) -> dict[str, int]:
    """Query token budget per task: CNN/DM articles get their own, longer budget (Detail 5)."""
    return {
        "tldr": max_query_length,
        "hh": max_query_length,
        "text": max_query_length,
        "chat": max_query_length,
        "cnndm": max_article_query_length,
    }


def tokenize_pairs(
    records: list[Comparison], tokenizer: PreTrainedTokenizerBase, limits: dict[str, int], max_response_length: int
) -> tuple[list[PairExample], SkipLog]:
    log = SkipLog()
    out = []
    for r in records:
        chosen, rejected = (
            encode_completion(tokenizer, r.chosen, r.task),
            encode_completion(tokenizer, r.rejected, r.task),
        )
        if max(len(chosen), len(rejected)) > max_response_length:
            log.skip("response_too_long", r.where)
            continue
        try:
            query = encode_query(tokenizer, r.task, r.fields, limits[r.task])
        except QueryTooLong:
            log.skip("query_too_long", r.where)
            continue
        out.append(PairExample(r, query, chosen, rejected))
    log.kept = len(out)
    return out, log


def tokenize_stage_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison]
) -> tuple[list[PairExample], SkipLog]:
    """`tokenize_pairs` under a pair stage's length limits."""
    limits = query_limits(lengths.max_query_length, lengths.max_article_query_length)
    return tokenize_pairs(records, tokenizer, limits, lengths.max_response_length)


def prepare_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison]
) -> tuple[list[PairExample], str]:
    """(`tokenize_stage_pairs`' examples, a note of what was skipped)."""
    examples, log = tokenize_stage_pairs(lengths, tokenizer, records)
    return examples, log.summary("pairs")


def prepare_training_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison]
) -> tuple[list[PairExample], str]:
    """`prepare_pairs` for the pairs a stage trains on, checked as `training_examples` checks them."""
    pairs = tokenize_stage_pairs(lengths, tokenizer, records)
    examples, log = training_examples(pairs, lengths.max_query_length, "training pairs")
    return examples, log.summary("pairs")


def length_balanced_indices(examples: list[PairExample], seed: int) -> tuple[list[int], str]:
    """(indices, note): equal numbers of pairs whose chosen response is the longer and the shorter one (in
    tokens), in data order. The majority side is subsampled (seeded) and pairs of equal length are all
    kept. A reward model trained on these cannot lower its loss by preferring length alone."""
    import numpy as np

    longer = [i for i, e in enumerate(examples) if len(e.chosen) > len(e.rejected)]
    shorter = [i for i, e in enumerate(examples) if len(e.chosen) < len(e.rejected)]
    equal = [i for i, e in enumerate(examples) if len(e.chosen) == len(e.rejected)]
    n = min(len(longer), len(shorter))
    rng = np.random.default_rng(seed)
    kept = (
        set(rng.choice(longer, n, replace=False).tolist())
        | set(rng.choice(shorter, n, replace=False).tolist())
        | set(equal)
    )
    note = (
        f"length_balance: {n} chosen-longer + {n} chosen-shorter + {len(equal)} equal-length pairs kept "
        f"(of {len(longer)} / {len(shorter)} / {len(equal)}; {len(examples) - len(kept)} dropped)"
    )
    return sorted(kept), note
