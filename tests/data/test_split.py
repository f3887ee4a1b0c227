"""Train/validation split by prompt identity on the real comparisons (several pairs per post)."""

from __future__ import annotations

import random
import re

import pytest

from rlhfkit.data.split import split_by_prompt
from rlhfkit.data.tldr import load_comparisons

from ..support.data import data_file


@pytest.fixture(scope="module")
def pairs():
    records, _ = load_comparisons([str(data_file("summarize-from-feedback-comparisons", "batch18.jsonl.gz"))])
    return records


def key(record) -> str:
    return record.prompt_id


def test_real_data_has_prompts_with_several_pairs(pairs):
    assert len({key(r) for r in pairs}) < len(pairs)  # otherwise the tests below prove little


def test_split_is_deterministic(pairs):
    first = split_by_prompt(pairs, key, validation_size=50, seed=3)
    second = split_by_prompt(pairs, key, validation_size=50, seed=3)
    assert [r.where for r in first[0]] == [r.where for r in second[0]]
    assert [r.where for r in first[1]] == [r.where for r in second[1]]
    other_seed = split_by_prompt(pairs, key, validation_size=50, seed=4)
    assert {key(r) for r in other_seed[1]} != {key(r) for r in first[1]}


def test_split_is_independent_of_record_order(pairs):
    shuffled = list(pairs)
    random.Random(0).shuffle(shuffled)
    train, val = split_by_prompt(pairs, key, validation_size=40, seed=1)
    train_s, val_s = split_by_prompt(shuffled, key, validation_size=40, seed=1)
    assert {r.where for r in val} == {r.where for r in val_s}
    assert {r.where for r in train} == {r.where for r in train_s}
    # and each side keeps the input order
    position = {r.where: i for i, r in enumerate(shuffled)}
    assert [position[r.where] for r in val_s] == sorted(position[r.where] for r in val_s)


def test_no_prompt_on_both_sides_and_nothing_lost(pairs):
    train, val = split_by_prompt(pairs, key, validation_fraction=0.25, seed=0)
    assert not {key(r) for r in train} & {key(r) for r in val}
    assert sorted(r.where for r in train + val) == sorted(r.where for r in pairs)


def test_exact_number_of_distinct_validation_prompts(pairs):
    distinct = len({key(r) for r in pairs})
    for size in (0, 1, 37, distinct):
        train, val = split_by_prompt(pairs, key, validation_size=size, seed=0)
        assert len({key(r) for r in val}) == size
        assert len({key(r) for r in train}) == distinct - size
    _, val = split_by_prompt(pairs, key, validation_fraction=0.1, seed=0)
    assert len({key(r) for r in val}) == round(distinct * 0.1)


def test_more_validation_prompts_than_the_data_has_hold_out_a_tenth_and_say_so(pairs, capsys):
    distinct = len({key(r) for r in pairs})
    train, val = split_by_prompt(pairs, key, validation_size=distinct + 1)
    assert len({key(r) for r in val}) == max(1, round(distinct / 10)) and train
    said = capsys.readouterr().out
    assert f"validation_posts={distinct + 1} is more than the data's {distinct} distinct prompts" in said
    with pytest.raises(ValueError, match="only"):
        split_by_prompt(pairs, key, validation_fraction=1.5)


def test_negative_sizes_fail(pairs):
    with pytest.raises(ValueError, match="must not be negative"):
        split_by_prompt(pairs, key, validation_size=-1)
    with pytest.raises(ValueError, match="must not be negative"):
        split_by_prompt(pairs, key, validation_fraction=-0.2)


def test_exactly_one_of_size_and_fraction(pairs):
    with pytest.raises(ValueError, match="exactly one"):
        split_by_prompt(pairs, key)
    with pytest.raises(ValueError, match="exactly one"):
        split_by_prompt(pairs, key, validation_size=1, validation_fraction=0.1)



def test_the_split_line_counts_the_prompts_the_tokenization_line_then_keeps_or_skips(ppo_dirs, tokenizer):
    """Cosmetic: with queries too long for max_query_length, the split's training count is the tokenization's kept
    plus skipped, not already the kept count."""
    from rlhfkit.config import GRPOConfig
    from rlhfkit.onpolicy.evaluation import split_posts

    cfg = GRPOConfig(data=[str(ppo_dirs["posts"])], validation_posts=2, max_query_length=64)
    train, held_out, notes = split_posts(cfg.prompt_split, tokenizer)
    split = re.search(r"split by prompt \(seed \d+\): (\d+) training prompts, (\d+) held-out prompts", "\n".join(notes))
    kept, skipped = map(int, re.search(r"training kept (\d+) prompts, skipped (\d+)", "\n".join(notes)).groups())
    assert skipped > 0 and kept == len(train)
    assert (int(split[1]), int(split[2])) == (kept + skipped, 2)
