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
LENGTH_OPTIONS = {
    "query_too_long": "max_query_length",
    "response_too_long": "max_response_length",
    "tie_after_cut": "max_response_length",
}


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
    ended: tuple[bool, bool] = (True, True)  # whether chosen and rejected end with their EOS (a cut one does not)

    def width(self) -> int:
        """Tokens in the longer of the pair's two rows, which sets its padded width."""
        return len(self.query.ids) + max(len(self.chosen), len(self.rejected))

    def packed_width(self) -> int:
        """Tokens in the pair's one packed row, query + chosen + rejected (`collate.pack_pairs`)."""
        return len(self.query.ids) + len(self.chosen) + len(self.rejected)

    def response_lengths(self) -> tuple[int, int]:
        """(chosen, rejected) response tokens before EOS: the length unit of ODIN's correlations and of
        the length baseline."""
        return len(self.chosen) - self.ended[0], len(self.rejected) - self.ended[1]


def response_length_columns(examples: list[PairExample]) -> tuple[list[int], list[int]]:
    """The `PairExample.response_lengths` of many pairs as two columns: (chosen lengths, rejected lengths)."""
    pairs = [e.response_lengths() for e in examples]
    return [chosen for chosen, _ in pairs], [rejected for _, rejected in pairs]


def fitted_completion(completion: list[int], budget: int, cut: bool) -> list[int] | None:
    """A completion (text + EOS) within `budget` tokens: itself when it fits; else, when `cut`, its first `budget`
    tokens, as TRL's SFT and DPO trainers keep them (`truncation_mode="keep_start"`): the EOS goes with the cut,
    since EOS says the text ended there (Detail 3) and this one goes on; else None (skipped)."""
    if len(completion) <= budget:
        return completion
    return completion[:budget] if cut else None


def tokenize_sft(
    records: list[SFTRecord],
    tokenizer: PreTrainedTokenizerBase,
    max_query_length: int,
    max_response_length: int,
    cut_long: bool = False,
) -> tuple[list[SFTExample], SkipLog]:
    """SFT examples of `records`; a completion longer than its budget is skipped, or with `cut_long` (a stage
    that trains on the tokens themselves: SFT) cut when its format allows (`SFTRecord.cut_when_long`)."""
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
        fitted = fitted_completion(response, budget, cut_long and r.cut_when_long)
        if fitted is None:
            log.skip("response_too_long", r.where)
            continue
        log.cut += len(fitted) < len(response)
        out.append(SFTExample(r, query, fitted))
    log.kept = len(out)
    return out, log


def training_examples(tokenized: tuple[list[T], SkipLog], max_query_length: int, what: str) -> tuple[list[T], SkipLog]:
    """`tokenized` (a stage's training examples and their skip log) as it trains on them: when none is left,
    an error naming why they were skipped and the option to raise; when most queries were cut to fit, a
    warning naming `max_query_length`."""
    examples, log = tokenized
    if not examples and log.skipped:
        options = " or ".join(dict.fromkeys(LENGTH_OPTIONS[reason] for reason in log.counts))
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
    records: list[Comparison],
    tokenizer: PreTrainedTokenizerBase,
    limits: dict[str, int],
    max_response_length: int,
    cut_long: bool = False,
) -> tuple[list[PairExample], SkipLog]:
    """Pair examples of `records`; a pair with a response longer than max_response_length is skipped, or with
    `cut_long` (DPO, whose implicit reward is a sum over the tokens: a reward model reads its reward at the EOS,
    Detail 12, and keeps skipping) its long responses are cut when its format allows (`Comparison.cut_when_long`).
    A pair that cutting leaves with two equal responses teaches nothing and is skipped as `tie_after_cut`."""
    log = SkipLog()
    out = []
    for r in records:
        whole = encode_completion(tokenizer, r.chosen, r.task), encode_completion(tokenizer, r.rejected, r.task)
        chosen, rejected = (fitted_completion(ids, max_response_length, cut_long and r.cut_when_long) for ids in whole)
        if chosen is None or rejected is None:
            log.skip("response_too_long", r.where)
            continue
        cut = (chosen, rejected) != whole
        if cut and chosen == rejected:
            log.skip("tie_after_cut", r.where)
            continue
        try:
            query = encode_query(tokenizer, r.task, r.fields, limits[r.task])
        except QueryTooLong:
            log.skip("query_too_long", r.where)
            continue
        log.cut += cut
        out.append(PairExample(r, query, chosen, rejected, (chosen == whole[0], rejected == whole[1])))
    log.kept = len(out)
    return out, log


def tokenize_stage_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison], cut_long: bool = False
) -> tuple[list[PairExample], SkipLog]:
    """`tokenize_pairs` under a pair stage's length limits."""
    limits = query_limits(lengths.max_query_length, lengths.max_article_query_length)
    return tokenize_pairs(records, tokenizer, limits, lengths.max_response_length, cut_long)


def prepare_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison], cut_long: bool = False
) -> tuple[list[PairExample], str]:
    """(`tokenize_stage_pairs`' examples, a note of what was skipped)."""
    examples, log = tokenize_stage_pairs(lengths, tokenizer, records, cut_long)
    return examples, log.summary("pairs")


def prepare_training_pairs(
    lengths: PairLengths, tokenizer: PreTrainedTokenizerBase, records: list[Comparison], cut_long: bool = False
) -> tuple[list[PairExample], str]:
    """`prepare_pairs` for the pairs a stage trains on, checked as `training_examples` checks them."""
    pairs = tokenize_stage_pairs(lengths, tokenizer, records, cut_long)
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
