"""The GSM8K evaluation's sequence log-probabilities, and so its KL, count the policy's own tokens only:
the tokens an environment inserted (a calculator's results, a user's turn) are not the policy's."""

import torch

from rlhfkit.eval.gsm8k import sequence_logprobs_of
from rlhfkit.logprobs import response_logprobs

from ..support.episodes import eos_prone_policy, sample_fixed_episodes


def test_inserted_tokens_do_not_count_in_an_answers_log_probability():
    model, tokenizer = eos_prone_policy()
    batch = sample_fixed_episodes(model, tokenizer, budget=40, user_turns=1, pause_every=4)
    inserted = batch.mask & ~batch.episodes.policy_mask
    assert int(inserted.sum()) > 0 and int(batch.trained_mask.sum()) > 0
    with torch.no_grad():
        logprobs, _ = response_logprobs(
            model, batch.input_ids(), batch.attention_mask(), batch.context_length, 0.7
        )
    got = sequence_logprobs_of(model, batch, 0.7, rows=3)
    torch.testing.assert_close(got, (logprobs * batch.trained_mask).sum(-1), rtol=1e-5, atol=1e-4)
    # the whole episode's sum differs by the inserted tokens' log-probabilities, which are far from 0
    assert float(((logprobs * inserted).sum(-1)).abs().min()) > 1.0

