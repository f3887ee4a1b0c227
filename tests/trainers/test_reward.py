import json
import math

import numpy as np
import pytest
import torch

from rlhfkit import scoring
from rlhfkit.cli import main as cli_main
from rlhfkit.data.collate import pad
from rlhfkit.data.formats import encode_completion, encode_query
from rlhfkit.reward_eval import evaluate as reward_evaluation
from rlhfkit.reward_models import ScalarModel, linear_head, load_reward_model
from rlhfkit.stages import resolve
from rlhfkit.trainers import reward

from ..support.data import first_lines
from ..support.tiny import cli_args, stage_args


@pytest.fixture
def reward_model(tiny_model):
    policy, tok = tiny_model
    torch.manual_seed(0)
    return ScalarModel.from_policy(policy).eval(), tok


def pairs_of(tok):
    fields = {"subreddit": "test", "title": "A title", "post": "First paragraph.\nSecond paragraph here."}
    query = encode_query(tok, "tldr", fields, 512).ids
    return [
        (query, encode_completion(tok, "short one")),
        (query[:10], encode_completion(tok, "a much longer summary of the post")),
    ]


def test_detail11_head_init_std_is_one_over_sqrt_d_model_plus_one():
    torch.manual_seed(0)
    head = linear_head(4095)
    assert head.weight.std().item() == pytest.approx(1 / math.sqrt(4096), rel=0.05)
    assert torch.all(head.bias == 0)


def test_detail12_reward_is_read_at_the_eos_index_including_full_width_rows(reward_model):
    model, tok = reward_model
    rows = [q + r for q, r in pairs_of(tok)]
    ids, mask = pad(rows, tok.pad_token_id, "right")
    full_width = ids.size(1)
    assert model.reward_index(ids).tolist() == [len(rows[0]) - 1, len(rows[1]) - 1]
    assert ids[0, len(rows[0]) - 1] == tok.eos_token_id
    per_token = model.per_token_scores(ids, mask)
    rewards = model(ids, mask)
    expected = per_token[torch.arange(2), torch.tensor([len(r) - 1 for r in rows])]
    torch.testing.assert_close(rewards, expected)
    assert len(rows[0]) == full_width or len(rows[1]) == full_width  # one row has no PAD at all
    assert not torch.allclose(rewards, per_token[:, 0])  # reading any other position would differ


def test_detail14_left_and_right_padding_give_the_same_rewards(reward_model):
    model, tok = reward_model
    pairs = pairs_of(tok)
    right = scoring.collate_scored([q for q, _ in pairs], [r for _, r in pairs], tok.pad_token_id)
    right_rewards = model(right["input_ids"], right["attention_mask"])
    queries, qmask = pad([q for q, _ in pairs], tok.pad_token_id, "left")
    responses, rmask = pad([r for _, r in pairs], tok.pad_token_id, "right")
    ids = torch.cat([queries, responses], 1)
    left_rewards = model(ids, torch.cat([qmask, rmask], 1), context_length=queries.size(1))
    torch.testing.assert_close(left_rewards, right_rewards, atol=1e-4, rtol=1e-4)


class FixedRewards(torch.nn.Module):
    def __init__(self, chosen, rejected):
        super().__init__()
        self.scores = {"chosen": torch.tensor(chosen), "rejected": torch.tensor(rejected)}

    def forward(self, **_):
        return self.scores


def test_pairwise_loss_and_accuracy_against_hand_values():
    model = FixedRewards([2.0, -1.0, 0.5], [0.0, 1.0, 0.5])
    batch = {"input_ids": torch.zeros(3, 1), "attention_mask": torch.ones(3, 1)}
    loss, extras = reward.make_pair_loss()(model, batch)
    expected = sum(math.log(1 + math.exp(-m)) for m in (2.0, -2.0, 0.0))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert extras["train/accuracy"].item() == 1.0  # only the first pair; a tie is not correct
    assert extras["train/margin"].item() == pytest.approx(0.0)
    assert extras["train/chosen_reward"].item() == pytest.approx(1.5)


def test_saved_reward_model_reloads_with_one_call_and_scores_identically(reward_model, tmp_path):
    model, tok = reward_model
    model.output_bias.data += 0.25
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    loaded, loaded_tok = load_reward_model(tmp_path / "rm")
    batch = scoring.collate_scored(*zip(*pairs_of(tok), strict=True), tok.pad_token_id)
    torch.testing.assert_close(
        loaded(batch["input_ids"], batch["attention_mask"]), model(batch["input_ids"], batch["attention_mask"])
    )
    assert loaded_tok.pad_token_id == tok.pad_token_id != tok.eos_token_id


def test_saved_reward_model_loads_in_plain_transformers_with_its_trained_head(reward_model, tmp_path):
    """A TRL user's `AutoModelForSequenceClassification.from_pretrained(model_dir)` gets the trained score
    layer (no MISSING key, no random head); its logits are rlhfkit's rewards minus the recorded bias."""
    from transformers import AutoModelForSequenceClassification

    model, tok = reward_model
    model.output_bias.data += 0.25
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    classifier, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(classifier.score.weight, model.head.weight)
    batch = scoring.collate_scored(*zip(*pairs_of(tok), strict=True), tok.pad_token_id)
    with torch.no_grad():
        logits = classifier.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        rewards = model(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(logits.squeeze(-1) + classifier.config.rlhfkit_score_bias, rewards)


def test_reward_model_saved_as_a_bare_backbone_still_loads(reward_model, tmp_path):
    """Folders written before the classifier layout (and by mean-mlp heads) hold the backbone alone."""
    from safetensors.torch import save_file

    from rlhfkit.models import SCALAR_CONFIG
    from rlhfkit.reward_models import SCALAR_HEAD, head_weights

    model, tok = reward_model
    model.backbone.save_pretrained(tmp_path / "old")
    tok.save_pretrained(tmp_path / "old")
    save_file(head_weights(model.head), str(tmp_path / "old" / SCALAR_HEAD))
    meta = {"head": "eos-linear", "pad_token_id": tok.pad_token_id, "hidden_size": 64, "length_head": False}
    (tmp_path / "old" / SCALAR_CONFIG).write_text(json.dumps(meta))
    loaded, _ = load_reward_model(tmp_path / "old")
    batch = scoring.collate_scored(*zip(*pairs_of(tok), strict=True), tok.pad_token_id)
    torch.testing.assert_close(
        loaded(batch["input_ids"], batch["attention_mask"]), model(batch["input_ids"], batch["attention_mask"])
    )


def test_mean_mlp_reward_model_saves_its_backbone_and_reloads(tiny_model, tmp_path):
    """No transformers classifier pools a mean through an MLP: the folder keeps the bare backbone."""
    policy, tok = tiny_model
    model = ScalarModel.from_policy(policy, head="mean-mlp").eval()
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    assert json.loads((tmp_path / "rm" / "config.json").read_text())["architectures"] == ["LlamaModel"]
    loaded, _ = load_reward_model(tmp_path / "rm")
    batch = scoring.collate_scored(*zip(*pairs_of(tok), strict=True), tok.pad_token_id)
    torch.testing.assert_close(loaded(batch["input_ids"], batch["attention_mask"], context_length=10),
                               model(batch["input_ids"], batch["attention_mask"], context_length=10))


def test_detail15_normalisation_gives_reference_mean_zero(reward_model, tmp_path):
    model, tok = reward_model
    refs = first_lines(tmp_path / "refs.jsonl", 12, "tldr-sft-sample", "tldr_sft_sample.jsonl.gz")
    cfg = resolve("rm", None, None, {"max_query_length": 128, "normalization_samples": 12, "micro_batch_size": 2})
    info = reward.normalize_to_references(model, tok, [str(refs)], cfg)
    assert abs(info["reference_mean_before"]) > 1e-4
    from rlhfkit.data.examples import tokenize_sft
    from rlhfkit.data.tldr import load_sft

    examples, _ = tokenize_sft(load_sft([str(refs)])[0], tok, 128, 53)
    after = scoring.score_texts(
        model, tok.pad_token_id, [e.query.ids for e in examples], [e.response for e in examples], 4, "t"
    )
    assert abs(after.mean()) < 1e-4


def test_rm_stage_and_rm_eval_end_to_end(tiny_model_dir, tmp_path):
    pairs = first_lines(tmp_path / "pairs.jsonl", 48, "summarize-from-feedback-comparisons", "batch13.jsonl.gz")
    out = tmp_path / "rm"
    args = stage_args(
        "rm",
        {"policy": tiny_model_dir, "pairs": pairs},
        out,
        total_batch_size=4,
        micro_batch_size=2,
        max_steps=2,
        validation_fraction=0.25,
        eval_every=1,
    )
    assert cli_main(["rm", "--preset", "tldr-rm", *cli_args(args)]) == 0
    evaluation = json.loads((out / "rm_eval" / "rm_eval.json").read_text())
    assert evaluation["pairs"] > 0 and 0 <= evaluation["accuracy"] <= 1
    assert {"split", "batch", "confidence", "policy_pair"} <= set(evaluation["breakdown"])
    for name in ["calibration.png", "margin_histogram.png", "reward_logits.png", "probes.md", "confident_errors.jsonl"]:
        assert (out / "rm_eval" / name).exists(), name
    assert (out / "plots" / "rm_training.png").exists() and (out / "report.html").exists()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("val/accuracy" in m for m in metrics) and any("train/chosen_reward" in m for m in metrics)

    eval_out = tmp_path / "eval"
    assert (
        cli_main(
            [
                "rm-eval",
                f"model={out / 'model'}",
                f"data={pairs}",
                "side=validation",
                "validation_fraction=0.25",
                "max_query_length=128",
                f"out={eval_out}",
            ]
        )
        == 0
    )
    again = json.loads((eval_out / "rm_eval.json").read_text())
    assert again["pairs"] == evaluation["pairs"]
    assert np.isclose(again["accuracy"], evaluation["accuracy"])


def test_detail13_reward_logits_dump_covers_every_response_token_and_marks_eos(reward_model, tmp_path):
    from rlhfkit.data.examples import PairExample, QueryTokens
    from rlhfkit.data.tldr import Comparison

    model, tok = reward_model
    (q, r), (_, r2) = pairs_of(tok)
    record = Comparison("p", "tldr", {}, "a", "b", "here")
    example = PairExample(record, QueryTokens(q, "", len(q), 0, False), r, r2)
    dump = reward_evaluation.dump_reward_logits(model, tok, [example], tmp_path)[0]
    assert len(dump["scores"]) == len(r) and dump["eos_index"] == len(r) - 1
    batch = scoring.collate_scored([q], [r], tok.pad_token_id)
    assert dump["scores"][-1] == pytest.approx(model(batch["input_ids"], batch["attention_mask"]).item(), abs=1e-5)
    assert (tmp_path / "reward_logits.png").is_file()


def test_seed_governs_the_reward_head_initialisation(tmp_path):
    from rlhfkit.trainers.run import start_run

    heads = []
    for i, seed in enumerate((1, 1, 2)):
        start_run(resolve("rm", None, None, {"seed": seed, "output_dir": str(tmp_path / f"r{i}")}), "rm")
        heads.append(linear_head(16).weight.detach().clone())
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])


def test_mean_mlp_head_pools_exactly_the_response_and_ignores_query_padding(tiny_model):
    policy, tok = tiny_model
    model = ScalarModel.from_policy(policy, head="mean-mlp").eval()
    pairs = pairs_of(tok)
    right = scoring.collate_scored([q for q, _ in pairs], [r for _, r in pairs], tok.pad_token_id)
    rewards = model(right["input_ids"], right["attention_mask"], right["response_mask"])
    hidden = model.hidden_states(right["input_ids"], right["attention_mask"])
    for row, (q, r) in enumerate(pairs):
        expected = model.head(hidden[row, len(q) : len(q) + len(r)].mean(0))
        assert rewards[row].item() == pytest.approx(expected.item(), abs=1e-5)
    queries, qmask = pad([q for q, _ in pairs], tok.pad_token_id, "left")
    responses, rmask = pad([r for _, r in pairs], tok.pad_token_id, "right")
    left = model(torch.cat([queries, responses], 1), torch.cat([qmask, rmask], 1), context_length=queries.size(1))
    torch.testing.assert_close(left, rewards, atol=1e-4, rtol=1e-4)


def test_missing_model_or_probe_file_is_a_user_error(tmp_path):
    from rlhfkit.models import ModelError, load_policy

    with pytest.raises(ModelError, match="no-such-model: no such folder"):
        load_policy(str(tmp_path / "no-such-model"))
    from rlhfkit.errors import UserError
    from rlhfkit.reward_eval.probes import load_probes

    with pytest.raises(UserError):
        load_probes(tmp_path / "missing.yaml")
