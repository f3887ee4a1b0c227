"""Packed pairs, length-debiased reward models (ODIN, length balance, length penalty), the
split-disjoint protocol, frozen-backbone training on cached features."""

import json

import numpy as np
import pytest
import torch

from rlhfkit import ops
from rlhfkit.cli import main as cli_main
from rlhfkit.config import PPOConfig, RMConfig
from rlhfkit.data import load_pairs
from rlhfkit.data.examples import length_balanced_indices, query_limits, tokenize_pairs
from rlhfkit.data.split import split_by_upstream_split
from rlhfkit.data.tldr import Comparison
from rlhfkit.onpolicy.advantages import compute_advantages
from rlhfkit.reward_features import FeatureCache
from rlhfkit.reward_models import ScalarModel, freeze_below_top_layers, load_reward_model
from rlhfkit.rollout import RolloutBatch
from rlhfkit.scoring import collate_packed_pairs, collate_pairs, pair_scores, score_pairs
from rlhfkit.tiny_models import tiny_policy
from rlhfkit.trainers import reward

from ..support.data import data_file
from ..support.tiny import cli_args, stage_args

COMPARISONS = ("summarize-from-feedback-comparisons", "batch18.jsonl.gz")


@pytest.fixture
def real_pairs(tiny_model):
    _, tok = tiny_model
    records, _ = load_pairs("tldr-comparisons", [str(data_file(*COMPARISONS))])
    examples, _ = tokenize_pairs(records[:6], tok, query_limits(96, 96), 64)
    return examples


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("head", ["eos-linear", "mean-mlp"])
def test_packed_pairs_score_exactly_as_separate_rows(tiny_model, real_pairs, head, attention):
    policy, tok = tiny_model
    torch.manual_seed(0)
    model = ScalarModel.from_policy(policy, head).eval()
    model.backbone.config._attn_implementation = attention  # eager adds the mask to the scores: it must be 0 / -inf
    packed = pair_scores(model, collate_packed_pairs(real_pairs, tok.pad_token_id))
    separate = collate_pairs(real_pairs, tok.pad_token_id)
    with torch.no_grad():
        rows = model(separate["input_ids"], separate["attention_mask"], separate["response_mask"])
    chosen, rejected = rows.chunk(2)
    torch.testing.assert_close(packed["chosen"], chosen, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed["rejected"], rejected, atol=1e-5, rtol=1e-5)
    widths = collate_packed_pairs(real_pairs, tok.pad_token_id)["attention_mask"].sum()
    assert widths < separate["attention_mask"].sum()  # the shared query is read once


def test_packed_rows_hide_the_chosen_response_from_the_rejected_one(tiny_model, real_pairs):
    _, tok = tiny_model
    batch = collate_packed_pairs(real_pairs[:1], tok.pad_token_id)
    e = real_pairs[0]
    q, c = len(e.query.ids), len(e.chosen)
    sees = batch["pair_mask"][0, 0]
    assert not sees[q + c :, q : q + c].any() and sees[q + c :, :q].all()
    assert batch["position_ids"][0, q + c].item() == q  # the rejected response starts where the chosen one did


def synthetic_features(n: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    """Responses whose hidden state mixes their length, a hidden quality feature and noise; humans
    prefer by both length and quality. Length and quality are independent."""
    mixing = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(100)))[
        0
    ]  # the heads must find the directions
    g = torch.Generator().manual_seed(seed)

    def responses():
        length = torch.randint(5, 60, (n,), generator=g).float()
        quality = torch.randn(n, generator=g)
        latent = torch.cat(
            [((length - 32) / 16).unsqueeze(1), quality.unsqueeze(1), 0.3 * torch.randn(n, dim - 2, generator=g)], 1
        )
        return latent @ mixing, length, quality

    a, len_a, q_a = responses()
    b, len_b, q_b = responses()
    a_wins = torch.rand(n, generator=g) < torch.sigmoid(1.5 * (len_a - len_b) / 16 + 1.5 * (q_a - q_b))
    pick = lambda x, y: torch.where(a_wins.unsqueeze(-1) if x.dim() == 2 else a_wins, x, y)  # noqa: E731
    return {
        "chosen_features": pick(a, b),
        "rejected_features": pick(b, a),
        "chosen_lengths": pick(len_a, len_b),
        "rejected_lengths": pick(len_b, len_a),
        "chosen_quality": pick(q_a, q_b),
        "rejected_quality": pick(q_b, q_a),
    }


def train_heads(length_head: bool, data: dict[str, torch.Tensor], dim: int) -> ScalarModel:
    policy, _ = tiny_policy(hidden_size=dim)
    torch.manual_seed(0)
    model = ScalarModel.from_policy(policy, length_head=length_head)
    freeze_below_top_layers(model, 0)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.02)
    loss_fn = reward.make_pair_loss()
    n = data["chosen_features"].size(0)
    for step in range(300):
        rows = torch.arange(step * 64, step * 64 + 64) % n
        loss, _ = loss_fn(model, {k: v[rows] for k, v in data.items() if "quality" not in k})
        optimizer.zero_grad()
        (loss / 64).backward()
        optimizer.step()
    return model


def correlations(model: ScalarModel, data: dict[str, torch.Tensor]) -> dict[str, float]:
    with torch.no_grad():
        scores = model(**{k: v for k, v in data.items() if k.endswith("features")})
    quality = torch.cat([scores["chosen"], scores["rejected"]])
    lengths = torch.cat([data["chosen_lengths"], data["rejected_lengths"]])
    hidden_quality = torch.cat([data["chosen_quality"], data["rejected_quality"]])
    out = {
        "reward_vs_length": float(ops.pearson(quality, lengths)),
        "reward_vs_quality": float(ops.pearson(quality, hidden_quality)),
    }
    if "chosen_length" in scores:
        out["length_head_vs_length"] = float(
            ops.pearson(torch.cat([scores["chosen_length"], scores["rejected_length"]]), lengths)
        )
    return out


def test_odin_quality_head_recovers_the_hidden_quality_and_ignores_length():
    train, held_out = synthetic_features(4096, 16, seed=0), synthetic_features(2048, 16, seed=1)
    plain, odin = (
        correlations(train_heads(False, train, 16), held_out),
        correlations(train_heads(True, train, 16), held_out),
    )
    assert plain["reward_vs_length"] > 0.5  # without ODIN the reward is largely length
    assert abs(odin["reward_vs_length"]) < 0.1
    assert odin["reward_vs_quality"] > 0.9
    assert odin["length_head_vs_length"] > 0.9


def test_odin_length_head_is_saved_and_reloaded_but_only_the_quality_head_is_the_reward(
    tiny_model, real_pairs, tmp_path
):
    policy, tok = tiny_model
    torch.manual_seed(0)
    model = ScalarModel.from_policy(policy, length_head=True).eval()
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    loaded, _ = load_reward_model(tmp_path / "rm")
    torch.testing.assert_close(loaded.length_head.weight, model.length_head.weight)
    batch = collate_packed_pairs(real_pairs, tok.pad_token_id)
    scores = pair_scores(loaded, batch)
    separate = collate_pairs(real_pairs, tok.pad_token_id)
    with torch.no_grad():
        as_ppo_reads_it = loaded(separate["input_ids"], separate["attention_mask"]).chunk(2)[0]
    torch.testing.assert_close(scores["chosen"], as_ppo_reads_it, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scores["chosen"], scores["chosen"] + scores["chosen_length"])


def test_length_head_needs_the_linear_head(tiny_model):
    policy, _ = tiny_model
    with pytest.raises(Exception, match="eos-linear"):
        ScalarModel.from_policy(policy, "mean-mlp", length_head=True)


def test_length_balance_gives_equal_shares_and_keeps_equal_length_pairs(real_pairs):
    records, _ = load_pairs("tldr-comparisons", [str(data_file(*COMPARISONS))])
    from rlhfkit.models import load_tokenizer

    examples, _ = tokenize_pairs(records, load_tokenizer("smollm2-135m"), query_limits(128, 128), 169)
    indices, note = length_balanced_indices(examples, seed=3)
    assert indices == sorted(set(indices))  # data order kept, no pair twice
    kept = [examples[i] for i in indices]
    longer = sum(len(e.chosen) > len(e.rejected) for e in kept)
    shorter = sum(len(e.chosen) < len(e.rejected) for e in kept)
    equal_before = sum(len(e.chosen) == len(e.rejected) for e in examples)
    assert (
        longer
        == shorter
        == min(
            sum(len(e.chosen) > len(e.rejected) for e in examples),
            sum(len(e.chosen) < len(e.rejected) for e in examples),
        )
    )
    assert sum(len(e.chosen) == len(e.rejected) for e in kept) == equal_before
    assert longer > 100 and f"{longer} chosen-longer + {shorter} chosen-shorter" in note
    assert length_balanced_indices(examples, seed=3)[0] == indices  # seeded


def test_length_penalised_score_is_exact():
    scores = torch.tensor([1.0, -0.5, 2.0])
    lengths = torch.tensor([10, 0, 40])
    torch.testing.assert_close(ops.length_penalised_scores(scores, lengths, 0.05), torch.tensor([0.5, -0.5, 0.0]))


def test_ppo_scores_carry_the_length_penalty_before_the_eos_trick():
    cfg = PPOConfig(reward_length_penalty=0.1, kl_coef=0.0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    batch = RolloutBatch(
        torch.arange(2),
        torch.ones(2, 1, dtype=torch.long),
        torch.ones(2, 1, dtype=torch.long),
        torch.ones(2, 4, dtype=torch.long),
        mask,
        torch.tensor([True, False]),
        logprobs=torch.zeros(2, 4),
        ref_logprobs=torch.zeros(2, 4),
        values=torch.zeros(2, 4),
        raw_scores=torch.tensor([1.0, 3.0]),
    )
    out = compute_advantages(batch, cfg.advantage_options, 0.0)
    torch.testing.assert_close(out.scores, torch.tensor([1.0 - 0.1 * 3, cfg.missing_eos_score]))


def comparison(prompt: str, split: str) -> Comparison:
    return Comparison(prompt, "tldr", {"subreddit": "", "title": "", "post": prompt}, "a", "b", "x", split=split)


def test_split_disjoint_protocol_trains_and_validates_on_different_splits_and_prompts():
    records = [
        comparison("p1", "valid2"),
        comparison("p2", "valid2"),
        comparison("p3", "valid1"),
        comparison("p1", "valid1"),
        comparison("p4", "train"),
    ]
    cfg = RMConfig(validation_splits=["valid1"], splits=["valid2"])
    train, validation, notes = split_by_upstream_split(cfg.pair_selection, records)
    assert [r.prompt_id for r in train] == ["p1", "p2"] and [r.prompt_id for r in validation] == ["p3"]
    assert "1 validation pairs dropped" in notes[0]
    train, _, _ = split_by_upstream_split(RMConfig(validation_splits=["valid1"]).pair_selection, records)
    assert [r.split for r in train] == ["valid2", "valid2", "train"]
    with pytest.raises(Exception, match="the data has splits"):
        split_by_upstream_split(RMConfig(validation_splits=["test"]).pair_selection, records)


def test_trainable_layers_freezes_everything_below_the_top_blocks(tiny_model_dir):
    from rlhfkit.models import load_policy

    model = ScalarModel.from_policy(load_policy(str(tiny_model_dir))[0])
    freeze_below_top_layers(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("backbone.layers.1.", "backbone.norm.", "head.")) for n in trainable)
    assert any(n.startswith("backbone.layers.1.") for n in trainable)
    freeze_below_top_layers(model, 0)
    assert {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad} == {"head"}
    with pytest.raises(Exception, match="has 2 blocks"):
        freeze_below_top_layers(model, 3)


def test_cached_features_score_as_the_full_model_and_are_reused(tiny_model, real_pairs, tmp_path):
    policy, tok = tiny_model
    torch.manual_seed(0)
    model = ScalarModel.from_policy(policy).eval()
    cache = FeatureCache(model, "no", tmp_path / "features.pt")
    cached = score_pairs(model, tok.pad_token_id, real_pairs, 4, features=cache)
    direct = score_pairs(model, tok.pad_token_id, real_pairs, 4)
    np.testing.assert_allclose(cached, direct, atol=1e-5)
    again = FeatureCache(model, "no", tmp_path / "features.pt")
    assert len(again.entries) == len(real_pairs)
    again.compute = None  # a second read must not run the backbone
    np.testing.assert_allclose(score_pairs(model, tok.pad_token_id, real_pairs, 4, features=again), cached)
    with torch.no_grad():
        model.backbone.norm.weight.add_(1.0)
    assert FeatureCache(model, "no", tmp_path / "features.pt").prefix != again.prefix  # changed weights, new keys


def test_rm_cli_with_odin_balance_split_disjoint_and_frozen_backbone(tiny_model_dir, tmp_path):
    data = data_file(*COMPARISONS)
    out = tmp_path / "rm"
    args = stage_args(
        "rm",
        {"policy": tiny_model_dir, "pairs": data},
        out,
        total_batch_size=16,
        micro_batch_size=8,
        max_steps=2,
        validation_splits="valid1",
        splits="valid2",
        length_head="true",
        length_balance="true",
        trainable_layers=0,
        eval_pairs=16,
    )
    assert cli_main(["rm", "--preset", "tldr-rm", *cli_args(args)]) == 0
    evaluation = json.loads((out / "rm_eval" / "rm_eval.json").read_text())
    assert set(evaluation["breakdown"]["split"]) == {"valid1"}
    overall = evaluation["breakdown"]["overall"]
    assert {"length_rule", "low", "high", "chosen_shorter_accuracy"} <= set(overall)
    assert 0 <= evaluation["odin_reward_plus_length_head"]["accuracy"] <= 1
    assert (out / "features.pt").is_file() and (out / "model" / "length_head.safetensors").is_file()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/quality_length_corr" in m for m in metrics)
    eval_out = tmp_path / "eval"
    assert (
        cli_main(
            [
                "rm-eval",
                f"model={out / 'model'}",
                f"data={data}",
                "splits=valid1",
                "max_query_length=128",
                "max_pairs=24",
                "length_penalty=0.5",
                f"out={eval_out}",
                "probes=",
            ]
        )
        == 0
    )
    penalised = json.loads((eval_out / "rm_eval.json").read_text())
    assert penalised["length_penalty"] == 0.5 and penalised["pairs"] == 24
