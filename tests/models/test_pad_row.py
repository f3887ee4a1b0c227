"""A model whose [PAD] is its EOS gains a [PAD] row of its own: zero, the same on every load, changing no
other token's probability and leaving the random stream and the first update's KL as they were. The SIGKILL
resume from such a model is in runs/test_fault_injection.py (faults suite)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlhfkit.cli import main as cli_main
from rlhfkit.logprobs import response_logprobs
from rlhfkit.models import load_policy

from ..support.tiny import command


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]



def test_the_added_pad_row_is_zero_and_the_same_on_every_load(pad_is_eos_policy):
    (first, tokenizer), (second, _) = load_policy(str(pad_is_eos_policy)), load_policy(str(pad_is_eos_policy))
    rows = first.get_input_embeddings().weight
    assert rows.size(0) == len(tokenizer) and tokenizer.pad_token_id == len(tokenizer) - 1
    assert torch.equal(rows[tokenizer.pad_token_id], torch.zeros_like(rows[0]))
    assert all(
        torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )


def test_loading_a_model_leaves_the_random_stream_as_it_was(pad_is_eos_policy):
    torch.manual_seed(3)
    load_policy(str(pad_is_eos_policy))
    after_load = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(4), after_load)


def test_the_pad_row_changes_no_other_tokens_probability(pad_is_eos_policy):
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(pad_is_eos_policy)  # no [PAD] row
    policy, tokenizer = load_policy(str(pad_is_eos_policy))
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logprobs, entropies = response_logprobs(policy, ids, mask, 2, 0.7)
        expected = (original(ids).logits[:, 1:-1].float() / 0.7).log_softmax(-1)
    torch.testing.assert_close(logprobs, expected.gather(-1, ids[:, 2:, None]).squeeze(-1), rtol=0, atol=1e-6)
    # the same entropy as without the row: PAD has probability 0 and every other token its old one
    torch.testing.assert_close(entropies, -(expected.exp() * expected).sum(-1), rtol=0, atol=1e-5)
    padded = ids.clone()
    padded[0, -2:] = (
        tokenizer.pad_token_id
    )  # a response's padding after its EOS: finite, so masked products stay finite
    assert torch.equal(response_logprobs(policy, padded, mask, 2, 0.7)[0][0, -2:], torch.zeros(2))


def test_kl_is_exactly_zero_at_the_first_update_from_a_model_whose_pad_is_its_eos(
    ppo_dirs, pad_is_eos_policy, tmp_path
):
    out = tmp_path / "run"
    assert cli_main(command("grpo", ppo_dirs | {"policy": pad_is_eos_policy}, out, eos_trick="false")) == 0
    assert [r["objective/kl"] for r in metrics(out) if "objective/kl" in r] == [0.0]
