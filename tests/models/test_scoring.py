"""The reward-scoring service (`rlhfkit.scoring`): rollout rows read at the EOS index score like
right-padded rows (Detail 14), in any batch order; longest-first batching returns scores in input
order; the EOS trick replaces exactly the rows without EOS, through `ops.eos_trick` (Detail 23)."""

import pytest
import torch

from rlhfkit import ops, scoring
from rlhfkit.data import load_pairs
from rlhfkit.data.collate import left_pad_queries, pad
from rlhfkit.data.examples import query_limits, tokenize_pairs
from rlhfkit.data.formats import encode_completion, encode_query
from rlhfkit.reward_models import ScalarModel

from ..support.data import data_file

FIELDS = {
    "subreddit": "test",
    "title": "A title",
    "post": "First paragraph.\nSecond paragraph, a little longer than the first.",
}


def reward_model(tiny_model, head: str = "eos-linear") -> tuple[ScalarModel, object]:
    policy, tok = tiny_model
    torch.manual_seed(0)
    return ScalarModel.from_policy(policy, head).eval(), tok


def rows_of(tok) -> tuple[list[list[int]], list[list[int]]]:
    """Queries of three widths; responses of several lengths, the last two cut before their EOS, as
    a rollout that ran out of tokens leaves them."""
    query = encode_query(tok, "tldr", FIELDS, 512).ids
    queries = [query, query[:12], query[:30], query[:7], query]
    texts = ["short one", "a much longer summary of the post than the first", "ok", "no end in sight here", "cut"]
    responses = [encode_completion(tok, t) for t in texts]
    responses[3], responses[4] = responses[3][:-1], responses[4][:-1]
    return queries, responses


def rollout_rows(
    queries: list[list[int]], responses: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(input_ids, attention_mask, Q, response lengths) laid out as generation leaves them: queries
    left padded to Q columns, then the responses right padded."""
    left = left_pad_queries(queries, pad_id)
    response_ids, response_mask = pad(responses, pad_id, "right")
    ids = torch.cat([left["input_ids"], response_ids], 1)
    mask = torch.cat([left["attention_mask"], response_mask], 1)
    return ids, mask, left["input_ids"].size(1), torch.tensor([len(r) for r in responses])


@pytest.mark.parametrize("head", ["eos-linear", "mean-mlp"])
def test_rollout_rows_score_like_right_padded_rows_in_any_batch_order(tiny_model, head):
    model, tok = reward_model(tiny_model, head)
    queries, responses = rows_of(tok)
    right = scoring.score_texts(model, tok.pad_token_id, queries, responses, batch_size=8)
    with torch.no_grad():
        left = scoring.scores_at_eos(model, *rollout_rows(queries, responses, tok.pad_token_id))
    torch.testing.assert_close(left.double(), torch.from_numpy(right), atol=1e-4, rtol=1e-4)
    order = [3, 0, 4, 2, 1]
    with torch.no_grad():
        shuffled = scoring.scores_at_eos(
            model, *rollout_rows([queries[i] for i in order], [responses[i] for i in order], tok.pad_token_id)
        )
    torch.testing.assert_close(shuffled, left[order], atol=1e-4, rtol=1e-4)


def test_rollout_scores_are_read_at_the_last_response_token(tiny_model):
    model, tok = reward_model(tiny_model)
    queries, responses = rows_of(tok)
    ids, mask, width, lengths = rollout_rows(queries, responses, tok.pad_token_id)
    with torch.no_grad():
        scores = scoring.scores_at_eos(model, ids, mask, width, lengths)
        per_token = model.per_token_scores(ids, mask)
    torch.testing.assert_close(scores, per_token[torch.arange(len(queries)), width + lengths - 1])
    assert ids[0, width + lengths[0] - 1] == tok.eos_token_id and ids[3, width + lengths[3] - 1] != tok.eos_token_id


def test_longest_first_batches_cover_every_row_once_widest_first():
    assert list(scoring.longest_first([3, 9, 1, 9, 5], 2, "t")) == [[1, 3], [4, 0], [2]]


def test_longest_first_batching_returns_scores_in_input_order(tiny_model):
    model, tok = reward_model(tiny_model)
    queries, responses = rows_of(tok)
    batched = scoring.score_texts(model, tok.pad_token_id, queries, responses, batch_size=2)
    alone = [
        scoring.score_texts(model, tok.pad_token_id, [q], [r], batch_size=1)[0]
        for q, r in zip(queries, responses, strict=True)
    ]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert scoring.score_texts(model, tok.pad_token_id, [], [], batch_size=2).shape == (0,)


def test_eos_trick_replaces_exactly_the_rows_without_eos_through_ops(tiny_model, monkeypatch):
    model, tok = reward_model(tiny_model)
    queries, responses = rows_of(tok)
    has_eos = [r[-1] == tok.eos_token_id for r in responses]
    assert has_eos == [True, True, True, False, False]
    calls, eos_trick = [], ops.eos_trick

    def spy(*args):
        calls.append(args)
        return eos_trick(*args)

    monkeypatch.setattr(scoring.ops, "eos_trick", spy)
    plain = scoring.score_texts(model, tok.pad_token_id, queries, responses, batch_size=2)
    tricked = scoring.score_texts(
        model, tok.pad_token_id, queries, responses, batch_size=2, has_eos=has_eos, missing_eos_score=-3.5
    )
    assert len(calls) == 1
    assert tricked.tolist() == [s if e else -3.5 for s, e in zip(plain.tolist(), has_eos, strict=True)]
    assert -3.5 not in plain.tolist()
    assert (
        scoring.score_texts(model, tok.pad_token_id, queries, responses, 2, has_eos=has_eos)[3]
        == scoring.MISSING_EOS_SCORE
    )


def test_pair_scores_equal_the_scores_of_each_response_in_its_own_row(tiny_model):
    model, tok = reward_model(tiny_model)
    records, _ = load_pairs(
        "tldr-comparisons", [str(data_file("summarize-from-feedback-comparisons", "batch18.jsonl.gz"))]
    )
    pairs, _ = tokenize_pairs(records[:5], tok, query_limits(96, 96), 64)
    chosen, rejected = scoring.score_pairs(model, tok.pad_token_id, pairs, batch_size=2)
    queries = [p.query.ids for p in pairs]
    rows = scoring.score_texts(
        model, tok.pad_token_id, queries * 2, [p.chosen for p in pairs] + [p.rejected for p in pairs], 3
    )
    assert chosen == pytest.approx(rows[: len(pairs)], abs=1e-4)
    assert rejected == pytest.approx(rows[len(pairs) :], abs=1e-4)
