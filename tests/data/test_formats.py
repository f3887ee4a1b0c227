"""Query and completion formats (Details 2-3) and padding (Detail 5), with the real SmolLM2 tokenizer."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest
import torch

from rlhfkit.data.collate import IGNORE_INDEX, left_pad_queries, pad, right_pad_query_response
from rlhfkit.data.examples import query_limits, tokenize_pairs, tokenize_sft
from rlhfkit.data.formats import (
    HH_ASSISTANT,
    HH_TURN,
    completion_text,
    encode_completion,
    encode_query,
    encode_text,
    format_query,
)
from rlhfkit.data.hh import load_hh, split_dialogue
from rlhfkit.data.tldr import Comparison, SFTRecord, load_sft

from ..support.data import data_file


def n_tokens(tokenizer, text: str) -> int:
    return len(encode_text(tokenizer, text))


def tldr_fields(post: str, title: str = "My question", subreddit: str = "relationships") -> dict[str, str]:
    return {"subreddit": subreddit, "title": title, "post": post}


def read_lines(path, n: int) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def real_posts():
    records, _ = load_sft([str(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"))])
    return records[:300]


# ---------------------------------------------------------------- Detail 2: query template


def test_detail2_query_template_exact_string():
    text = format_query("tldr", tldr_fields("Line one.\nLine two.", title="Help me", subreddit="AskReddit"))
    assert text == "SUBREDDIT: r/AskReddit\n\nTITLE: Help me\n\nPOST: Line one.\nLine two.\n\nTL;DR:"


def test_detail2_no_trailing_space_after_tldr(tokenizer):
    q = encode_query(tokenizer, "tldr", tldr_fields("A short post."), 512)
    assert q.text.endswith("\n\nTL;DR:")
    assert tokenizer.decode(q.ids).endswith("TL;DR:")
    assert q.ids == encode_text(tokenizer, q.text)
    assert not q.truncated and q.paragraphs_dropped == 0 and q.original_length == len(q.ids)


def test_detail2_template_braces_in_user_text_are_kept_verbatim():
    text = format_query("tldr", tldr_fields("I wrote {post} and {title} literally", title="{x}"))
    assert "POST: I wrote {post} and {title} literally" in text
    assert "TITLE: {x}" in text


# ---------------------------------------------------------------- Detail 2: paragraph truncation


def test_detail2_truncation_drops_last_paragraphs_until_query_fits(tokenizer):
    paragraphs = [f"Paragraph {i} says something about the week, the job and the roommate." for i in range(6)]
    post = "\n\n".join(paragraphs)

    def length_with(k: int) -> int:
        return n_tokens(tokenizer, format_query("tldr", tldr_fields("\n\n".join(paragraphs[:k]))))

    limit = length_with(3) + 2  # the first three paragraphs fit, the fourth does not
    assert length_with(4) > limit
    q = encode_query(tokenizer, "tldr", tldr_fields(post), limit)
    assert q.text == format_query("tldr", tldr_fields("\n\n".join(paragraphs[:3])))
    assert q.paragraphs_dropped == 3
    assert q.token_cut is False and q.truncated
    assert q.original_length == length_with(6)
    assert len(q.ids) == length_with(3) <= limit


def test_detail2_truncation_never_cuts_mid_paragraph_on_real_posts(tokenizer, real_posts):
    """On real TL;DR posts and a 200-token budget: the kept post is a prefix ending at a `\\n`,
    and keeping one more paragraph would not fit (the truncation drops no more than needed)."""
    limit = 200
    dropped = 0
    for record in real_posts:
        post = record.fields["post"]
        q = encode_query(tokenizer, "tldr", record.fields, limit)
        assert len(q.ids) <= limit
        if not q.truncated:
            assert q.text == format_query("tldr", record.fields)
            continue
        if q.token_cut:
            continue
        dropped += 1
        prefix = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: ".format(**record.fields)
        kept = q.text[len(prefix) : -len("\n\nTL;DR:")]
        assert post.startswith(kept), record.where
        rest = post[len(kept) :]
        assert rest.lstrip(" \t\r").startswith("\n"), f"cut mid-paragraph: {kept[-40:]!r} | {rest[:40]!r}"
        # one more paragraph (up to the next line break after some text) must not fit
        body = len(kept) + len(rest) - len(rest.lstrip())
        next_break = post.find("\n", body)
        longer = (post if next_break < 0 else post[:next_break]).rstrip()
        assert n_tokens(tokenizer, format_query("tldr", {**record.fields, "post": longer})) > limit, record.where
    assert dropped > 100  # the budget is small enough that most posts lose paragraphs


def test_detail2_single_long_paragraph_falls_back_to_flagged_token_cut(tokenizer):
    post = " ".join(f"word{i}" for i in range(600))  # one paragraph, far over the budget
    q = encode_query(tokenizer, "tldr", tldr_fields(post), 64)
    assert q.token_cut is True and q.truncated
    assert q.paragraphs_dropped == 0
    assert len(q.ids) <= 64
    assert len(q.ids) >= 60  # cut by tokens, not emptied
    assert q.text.startswith("SUBREDDIT: r/relationships\n\nTITLE: My question\n\nPOST: word0 word1")
    assert q.text.endswith("\n\nTL;DR:")


def test_detail2_paragraphs_dropped_before_token_cut(tokenizer):
    long_first = " ".join(f"word{i}" for i in range(600))
    q = encode_query(tokenizer, "tldr", tldr_fields(long_first + "\nshort ending\nanother ending"), 64)
    assert q.paragraphs_dropped == 2
    assert q.token_cut is True
    assert "ending" not in q.text and len(q.ids) <= 64


def test_detail2_short_paragraph_then_long_one_needs_no_token_cut(tokenizer):
    long_last = " ".join(f"word{i}" for i in range(600))
    q = encode_query(tokenizer, "tldr", tldr_fields("I need advice.\n" + long_last), 64)
    assert q.token_cut is False and q.paragraphs_dropped == 1
    assert q.text == format_query("tldr", tldr_fields("I need advice."))


def test_detail2_template_alone_too_long_fails(tokenizer):
    with pytest.raises(ValueError, match="longer than max_query_length=8"):
        encode_query(tokenizer, "tldr", tldr_fields("post", title="a very long title " * 5), 8)


def test_hh_truncation_drops_oldest_turns(tokenizer):
    turns = [(f"Question number {i} about cooking rice and beans?", f"Answer number {i} with some detail.")
             for i in range(5)]
    dialogue = (
        "".join(f"{HH_TURN} {h}{HH_ASSISTANT} {a}" for h, a in turns[:-1]) + f"{HH_TURN} {turns[-1][0]}{HH_ASSISTANT}"
    )

    def suffix_from(i: int) -> str:
        return (
            "".join(f"{HH_TURN} {h}{HH_ASSISTANT} {a}" for h, a in turns[i:-1])
            + f"{HH_TURN} {turns[-1][0]}{HH_ASSISTANT}"
        )

    limit = n_tokens(tokenizer, suffix_from(2)) + 1
    assert n_tokens(tokenizer, suffix_from(1)) > limit
    q = encode_query(tokenizer, "hh", {"dialogue": dialogue}, limit)
    assert q.text == suffix_from(2)
    assert q.paragraphs_dropped == 2 and not q.token_cut
    assert q.text.startswith(HH_TURN + " Question number 2") and q.text.endswith(HH_ASSISTANT)


def test_hh_truncation_on_real_dialogues_keeps_whole_recent_turns(tokenizer):
    rows = read_lines(data_file("hh-rlhf", "helpful-base", "test.jsonl.gz"), 60)
    limit, checked = 96, 0
    for row in rows:
        prompt = split_dialogue(row["chosen"])[0]
        q = encode_query(tokenizer, "hh", {"dialogue": prompt}, limit)
        assert len(q.ids) <= limit
        if not q.truncated or q.token_cut:
            continue
        checked += 1
        assert prompt.endswith(q.text) and q.text.startswith(HH_TURN) and q.text.endswith(HH_ASSISTANT)
        # one more (older) turn would not fit
        start = prompt.rfind(HH_TURN, 0, len(prompt) - len(q.text))
        assert start >= 0 and n_tokens(tokenizer, prompt[start:]) > limit
    assert checked >= 5


# ---------------------------------------------------------------- Detail 3: completions, PAD and EOS


@pytest.mark.parametrize(
    "summary", ["my summary here", " my summary here", "  my summary here\n", "\nmy summary here "]
)
def test_detail3_completion_has_exactly_one_leading_space_and_eos(tokenizer, summary):
    assert completion_text(summary) == " my summary here"
    ids = encode_completion(tokenizer, summary)
    assert ids == encode_text(tokenizer, " my summary here") + [tokenizer.eos_token_id]
    assert ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(ids) == " my summary here" + tokenizer.eos_token


def test_detail3_real_reference_summary_format(tokenizer, real_posts):
    summary = real_posts[0].summary
    assert summary.startswith(" ") and not summary.startswith("  ")  # upstream: one leading space
    ids = encode_completion(tokenizer, summary)
    assert tokenizer.decode(ids[:-1]) == summary.rstrip()
    assert ids[-1] == tokenizer.eos_token_id


def test_detail3_pad_is_a_special_token_distinct_from_eos(tokenizer):
    assert tokenizer.pad_token == "[PAD]"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.convert_ids_to_tokens(tokenizer.pad_token_id) == "[PAD]"


def test_detail3_special_token_strings_in_user_text_stay_text(tokenizer):
    text = "I literally typed [PAD] and <|im_end|> and <|im_start|> in my post"
    ids = encode_text(tokenizer, text)
    special = set(tokenizer.all_special_ids)
    assert not special & set(ids)
    assert tokenizer.decode(ids) == text
    completion = encode_completion(tokenizer, text)
    assert completion.count(tokenizer.eos_token_id) == 1 and completion[-1] == tokenizer.eos_token_id
    assert tokenizer.pad_token_id not in completion
    q = encode_query(tokenizer, "tldr", tldr_fields(text, title="[PAD] <|im_end|>"), 512)
    assert not special & set(q.ids)


# ---------------------------------------------------------------- Detail 5: padding


def test_detail5_right_pad_query_response_hand_built():
    out = right_pad_query_response([[11, 12, 13], [14]], [[21, 22], [23, 24, 25]], pad_id=99)
    assert torch.equal(out["input_ids"], torch.tensor([[11, 12, 13, 21, 22], [14, 23, 24, 25, 99]]))
    assert torch.equal(out["attention_mask"], torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]))
    assert torch.equal(
        out["response_mask"], torch.tensor([[False, False, False, True, True], [False, True, True, True, False]])
    )
    m = IGNORE_INDEX
    assert torch.equal(out["labels"], torch.tensor([[m, m, m, 21, 22], [m, 23, 24, 25, m]]))


def test_detail5_right_pad_loss_on_query_masks_only_pad():
    out = right_pad_query_response([[11, 12, 13], [14]], [[21, 22], [23, 24, 25]], pad_id=99, loss_on_query=True)
    m = IGNORE_INDEX
    assert torch.equal(out["labels"], torch.tensor([[11, 12, 13, 21, 22], [14, 23, 24, 25, m]]))
    assert out["response_mask"].sum().item() == 5  # response_mask does not change with loss_on_query


def test_detail5_left_pad_queries_hand_built():
    out = left_pad_queries([[11, 12, 13], [14], [15, 16]], pad_id=99)
    assert torch.equal(out["input_ids"], torch.tensor([[11, 12, 13], [99, 99, 14], [99, 15, 16]]))
    assert torch.equal(out["attention_mask"], torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))


def test_pad_rejects_bad_side_and_overlong_rows():
    with pytest.raises(ValueError, match="side must be"):
        pad([[1]], 0, "middle")
    with pytest.raises(ValueError, match="row 1 has 3 tokens, more than the width 2"):
        pad([[1], [1, 2, 3]], 0, "right", width=2)
    ids, mask = pad([[1]], 0, "right", width=4)
    assert ids.tolist() == [[1, 0, 0, 0]] and mask.tolist() == [[1, 0, 0, 0]]


def test_detail3_detail5_eos_is_a_label_and_first_pad_follows_it(tokenizer):
    """With PAD != EOS the EOS stays in the labels, and the first PAD sits right after it."""
    queries = [
        encode_query(tokenizer, "tldr", tldr_fields(p), 512).ids
        for p in ("Short post.", "A longer post here.\nTwo lines.")
    ]
    responses = [encode_completion(tokenizer, s) for s in (" a much longer summary of everything", " short")]
    out = right_pad_query_response(queries, responses, tokenizer.pad_token_id)
    for row, (q, r) in enumerate(zip(queries, responses, strict=True)):
        end = len(q) + len(r)
        assert out["labels"][row, end - 1].item() == tokenizer.eos_token_id
        assert out["labels"][row, len(q) : end].tolist() == r
        assert (out["labels"][row, : len(q)] == IGNORE_INDEX).all()
        if end < out["input_ids"].shape[1]:
            assert out["input_ids"][row, end].item() == tokenizer.pad_token_id
            assert (out["labels"][row, end:] == IGNORE_INDEX).all()
    assert (out["input_ids"] == tokenizer.pad_token_id).sum() == (out["attention_mask"] == 0).sum() > 0


# ---------------------------------------------------------------- records to token ids (Detail 4)


def test_detail4_tokenize_sft_skips_and_counts_responses_over_the_limit(tokenizer):
    records = [
        SFTRecord("a", tldr_fields("Post one."), " short", "f:1"),
        SFTRecord("b", tldr_fields("Post two."), " " + "very long summary " * 20, "f:2"),
    ]
    examples, log = tokenize_sft(records, tokenizer, 512, 16)
    assert [e.record.prompt_id for e in examples] == ["a"]
    assert log.kept == 1 and dict(log.counts) == {"response_too_long": 1}
    assert examples[0].response == encode_completion(tokenizer, " short")


def test_detail4_tokenize_pairs_uses_the_task_budget(tokenizer):
    article = "\n".join(f"Sentence number {i} of a news article about the weather." for i in range(40))
    records = [
        Comparison("c", "cnndm", {"article": article}, " chosen", " rejected", "f:1"),
        Comparison("t", "tldr", tldr_fields(article), " chosen", " rejected", "f:2"),
        Comparison("x", "tldr", tldr_fields("p"), " chosen", " word " * 100, "f:3"),
    ]
    examples, log = tokenize_pairs(records, tokenizer, query_limits(64, 2047), 32)
    assert dict(log.counts) == {"response_too_long": 1}
    by_id = {e.record.prompt_id: e for e in examples}
    assert not by_id["c"].query.truncated  # CNN/DM articles get the longer budget (2047)
    assert by_id["t"].query.truncated and len(by_id["t"].query.ids) <= 64


def test_real_hh_pair_tokenizes_with_eos_and_shared_prompt(tokenizer):
    pairs, _ = load_hh([str(data_file("hh-rlhf", "harmless-base", "test.jsonl.gz"))])
    examples, _ = tokenize_pairs(pairs[:5], tokenizer, query_limits(512, 2047), 10**6)
    assert len(examples) == 5
    for e in examples:
        assert e.chosen[-1] == e.rejected[-1] == tokenizer.eos_token_id
        assert e.query.text.endswith(HH_ASSISTANT)
