"""PPO invariants on tiny random models with the real tokenizer and real TL;DR posts."""

import copy
import json

import numpy as np
import pytest
import torch

from rlhfkit import generation, ops
from rlhfkit.cli import main as cli_main
from rlhfkit.data.collate import left_pad_queries
from rlhfkit.logprobs import response_logprobs
from rlhfkit.onpolicy import evaluation, rollout_stats, trainer
from rlhfkit.onpolicy.advantages import compute_advantages
from rlhfkit.onpolicy.collect import prompt_indices
from rlhfkit.onpolicy.scoring import policy_logprobs, score_rollout
from rlhfkit.reward_models import ScalarModel
from rlhfkit.rollout import RolloutBatch
from rlhfkit.stages import resolve

from ..support.decoding import SamplingLogprobs
from ..support.gradients import collected, run_update
from ..support.tiny import stage_args


def setup(dirs, tmp_path, **extra):
    cfg = resolve("ppo", "tldr-ppo", None, stage_args("ppo", dirs, tmp_path / "run", **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, [e.query.ids for e in train]


def scripted_batch(models, cfg, prompts, eos_at: list[int | None], width: int = 6) -> RolloutBatch:
    """Responses of random tokens with EOS where asked (None: no EOS), PAD after it, then scored."""
    tok = models.tokenizer
    generator = torch.Generator().manual_seed(0)
    padded = left_pad_queries(prompts[: len(eos_at)], tok.pad_token_id)
    responses = torch.randint(100, 1000, (len(eos_at), width), generator=generator)
    for row, at in enumerate(eos_at):
        if at is not None:
            responses[row, at] = tok.eos_token_id
    responses = ops.truncate_after_eos(responses, tok.eos_token_id, tok.pad_token_id)
    lengths = torch.tensor([width if at is None else at + 1 for at in eos_at])
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    has_eos = torch.tensor([at is not None for at in eos_at])
    batch = RolloutBatch(
        torch.arange(len(eos_at)), padded["input_ids"], padded["attention_mask"], responses, mask, has_eos
    )
    return score_rollout(models, batch, trainer.scoring_plan(models, cfg), "no")


def test_kl_is_exactly_zero_and_the_ratio_exactly_one_before_any_update(ppo_dirs, tmp_path):
    # forward batches of 3 rows at sampling time, shuffled micro-batches of 5 with gradients at update time
    cfg, models, prompts = setup(ppo_dirs, tmp_path, forward_batch_size=3, micro_batch_size=5, update_epochs=1)
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    assert torch.equal(batch.logprobs, batch.ref_logprobs)
    assert torch.equal(batch.kl, torch.zeros_like(batch.kl))
    rows = torch.as_tensor(np.random.default_rng(0).permutation(batch.size)[:5])
    micro = batch.select(rows)
    new, _ = policy_logprobs(models.policy, micro, cfg.temperature)
    assert torch.equal(torch.exp(new - micro.logprobs)[micro.mask], torch.ones(int(micro.mask.sum())))
    metrics = run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg).metrics
    assert metrics["val/ratio"] == 1.0 and metrics["policy/clipfrac_avg"] == 0 and metrics["policy/approxkl_avg"] == 0


def test_kl_moves_after_an_update_and_the_reference_stays_frozen(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path, update_epochs=1)
    reference_before = {k: v.clone() for k, v in models.reference.state_dict().items()}
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
    after = collected(models, prompts, cfg, 1, cfg.kl_coef)
    assert after.kl.abs().sum() > 0 and not torch.equal(after.logprobs, after.ref_logprobs)
    assert all(torch.equal(v, reference_before[k]) for k, v in models.reference.state_dict().items())


def test_values_are_read_at_the_position_before_each_response_token(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path)
    batch = scripted_batch(models, cfg, prompts, [4, None, 3])
    context = batch.context_length
    with torch.no_grad():
        for t in (0, 2):  # V(query + response[:t]) is the value model's score of that prefix at its last token
            prefix = RolloutBatch(
                batch.prompts,
                batch.query_ids,
                batch.query_mask,
                batch.responses[:, :t],
                batch.mask[:, :t],
                batch.has_eos,
            )
            last = torch.full((3,), context + t - 1)
            expected = models.value(prefix.input_ids(), prefix.attention_mask(), eos_index=last)
            torch.testing.assert_close(batch.values[:, t], expected, atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_samples_the_same_and_updates_alike(ppo_dirs, tmp_path):
    results = []
    for checkpointing in (False, True):
        cfg, models, prompts = setup(ppo_dirs, tmp_path, update_epochs=1, gradient_checkpointing=checkpointing)
        batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
        run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
        results.append((batch.responses, models.policy.state_dict()))
    assert torch.equal(results[0][0], results[1][0])
    for key in results[0][1]:
        torch.testing.assert_close(results[0][1][key], results[1][1][key], atol=2e-6, rtol=1e-4)


def test_sampling_never_emits_pad(tiny_model):
    model, tok = tiny_model
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.pad_token_id] = 100.0  # PAD would win every step
    padded = left_pad_queries([[1, 2, 3], [4, 5]], tok.pad_token_id)
    for temperature in (0.0, 0.7):
        params = generation.SamplingParams(max_new_tokens=5, temperature=temperature)
        out = generation.generate(
            model, padded["input_ids"], padded["attention_mask"], params, tok.eos_token_id, tok.pad_token_id
        )
        assert not (out.responses == tok.pad_token_id).any()


def test_detail23_score_lands_on_the_eos_index_and_missing_eos_scores_minus_one(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path)
    eos_at = [2, None, 0, 5]
    batch = compute_advantages(scripted_batch(models, cfg, prompts, eos_at), cfg.advantage_options, kl_coef=0.05)
    assert batch.scores.tolist() == [
        batch.raw_scores[0].item(),
        -1.0,
        batch.raw_scores[2].item(),
        batch.raw_scores[3].item(),
    ]
    metrics = rollout_stats.rollout_metrics(batch, 0.05)
    assert metrics["objective/scores_with_eos"] == pytest.approx(float(batch.raw_scores[[0, 2, 3]].mean()))
    assert metrics["response/eos_rate"] == 0.75
    score_part = batch.rewards + cfg.kl_coef * batch.kl
    for row, at in enumerate(eos_at):
        index = 5 if at is None else at
        if at is not None:
            assert batch.responses[row, index] == models.tokenizer.eos_token_id
        expected = torch.zeros(6)
        expected[index] = batch.scores[row]
        torch.testing.assert_close(score_part[row], expected)
    # the reward model read the EOS token itself: the same score as a right-padded query+response row
    eos_row = torch.cat([batch.query_ids[0][batch.query_mask[0].bool()], batch.responses[0, :3]]).unsqueeze(0)
    torch.testing.assert_close(
        models.reward(eos_row, torch.ones_like(eos_row)), batch.raw_scores[:1], atol=1e-5, rtol=1e-4
    )


def test_everything_after_eos_is_masked_in_every_loss_and_metric(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path, update_epochs=1)
    clean = scripted_batch(models, cfg, prompts, [2, None, 0, 4, 1, 3, None, 2])
    dirty = copy.copy(clean)
    after_eos = ~clean.mask
    for key in ("logprobs", "ref_logprobs", "values"):
        setattr(dirty, key, getattr(clean, key).masked_fill(after_eos, 1e3))
    clean, dirty = (compute_advantages(b, cfg.advantage_options, 0.05) for b in (clean, dirty))
    for key in ("rewards", "advantages", "returns", "kl"):
        torch.testing.assert_close(getattr(dirty, key), getattr(clean, key), msg=key)
    assert rollout_stats.rollout_metrics(dirty, 0.05) == rollout_stats.rollout_metrics(clean, 0.05)
    dirty.advantages = dirty.advantages.masked_fill(after_eos, 1e3)
    dirty.returns = dirty.returns.masked_fill(after_eos, -1e3)
    results = []
    for batch in (clean, dirty):
        trained = copy.deepcopy(models)
        metrics = run_update(trained, trainer.build_optimizers(trained, cfg, 2), batch, cfg).metrics
        results.append((metrics, trained.policy.state_dict(), trained.value.state_dict()))
    assert results[0][0] == pytest.approx(results[1][0])
    for a, b in ((results[0][1], results[1][1]), (results[0][2], results[1][2])):
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_one_update_raises_the_logprob_of_positive_advantage_tokens(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path, update_epochs=1, learning_rate=3e-4)
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(batch.size)]).unsqueeze(1)
    batch.advantages = sign * batch.mask
    run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
    with torch.no_grad():
        new, _ = policy_logprobs(models.policy, batch, cfg.temperature)
    change = new - batch.logprobs
    positive, negative = batch.mask & (sign > 0), batch.mask & (sign < 0)
    assert change[positive].mean() > 0 > change[negative].mean()


def test_logprobs_at_sampling_and_at_training_agree_for_the_same_weights(ppo_dirs, tmp_path, monkeypatch):
    cfg, models, prompts = setup(ppo_dirs, tmp_path)
    tok = models.tokenizer
    sampling = SamplingLogprobs(monkeypatch)
    padded = left_pad_queries(prompts[:4], tok.pad_token_id)
    params = generation.SamplingParams(max_new_tokens=8, temperature=0.7, seed=3)
    sampled = generation.generate(
        models.policy, padded["input_ids"], padded["attention_mask"], params, tok.eos_token_id, tok.pad_token_id
    )
    valid = torch.arange(sampled.responses.size(1)).unsqueeze(0) < sampled.lengths.unsqueeze(1)
    ids = torch.cat([padded["input_ids"], sampled.responses], 1)
    mask = torch.cat([padded["attention_mask"], valid.long()], 1)
    with torch.no_grad():
        trained, _ = response_logprobs(models.policy, ids, mask, padded["input_ids"].size(1), 0.7)
    torch.testing.assert_close(trained * valid, sampling.of(sampled), atol=1e-5, rtol=1e-4)


def test_logits_fallback_path_matches_the_chunked_hidden_state_path(ppo_dirs, tmp_path, monkeypatch):
    cfg, models, prompts = setup(ppo_dirs, tmp_path)
    batch = scripted_batch(models, cfg, prompts, [2, None, 4])
    with torch.no_grad():
        chunked = policy_logprobs(models.policy, batch, 0.7)
        monkeypatch.setattr("rlhfkit.logprobs.plain_lm_head", lambda model: None)
        from_logits = policy_logprobs(models.policy, batch, 0.7)
    for a, b in zip(chunked, from_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_detail20_tldr_ppo_preset_mirrors_table_7():
    cfg = resolve("ppo", "tldr-ppo", None, {})
    table7 = {
        "total_episodes": 1_000_000,
        "learning_rate": 3e-6,
        "adam_eps": 1e-5,
        "lr_scheduler": "linear",
        "total_batch_size": 512,
        "kl_coef": 0.05,
        "gamma": 1.0,
        "lam": 0.95,
        "num_minibatches": 1,
        "update_epochs": 4,
        "clip_range": 0.2,
        "value_clip_range": 0.2,
        "vf_coef": 0.1,
        "temperature": 0.7,
        "max_response_length": 53,
        "missing_eos_score": -1.0,
        "whiten_rewards": False,
        "whiten_advantages": True,
    }
    assert {k: getattr(cfg, k) for k in table7} == table7


def test_detail21_prompts_are_reshuffled_each_time_they_are_used_up():
    stream = prompt_indices(5, 15, seed=1, start=0)
    epochs = stream.reshape(3, 5)
    for epoch in epochs:
        assert sorted(epoch.tolist()) == [0, 1, 2, 3, 4]  # without replacement within an epoch
    assert len({tuple(e) for e in epochs.tolist()}) == 3  # a fresh order each epoch
    assert prompt_indices(5, 4, seed=1, start=3).tolist() == stream[3:7].tolist()  # resumable anywhere
    assert prompt_indices(5, 5, seed=2, start=0).tolist() != epochs[0].tolist()


def test_detail22_value_model_starts_as_the_reward_model_and_trains_apart_from_it(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(ppo_dirs, tmp_path, update_epochs=1)
    reward_before = {k: v.clone() for k, v in models.reward.state_dict().items()}
    for key, value in models.value.state_dict().items():
        assert torch.equal(value, reward_before[key]), key
    assert models.value is not models.reward and not any(p.requires_grad for p in models.reward.parameters())
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
    assert all(torch.equal(v, reward_before[k]) for k, v in models.reward.state_dict().items())
    assert not torch.equal(models.value.head.weight, reward_before["head.weight"])


def test_gradient_accumulation_matches_one_large_micro_batch(ppo_dirs, tmp_path):
    weights = []
    for micro in (2, 8):
        cfg, models, prompts = setup(ppo_dirs, tmp_path, micro_batch_size=micro, update_epochs=1)
        batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
        run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
        weights.append(models.policy.state_dict())
    for key in weights[0]:
        torch.testing.assert_close(weights[0][key], weights[1][key], atol=2e-6, rtol=1e-4)


EXPECTED_METRICS = [
    "objective/rlhf_reward",
    "objective/scores",
    "objective/kl",
    "objective/non_score_reward",
    "objective/entropy",
    "policy/entropy_avg",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "val/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/ratio",
    "val/ratio_var",
    "response/length_mean",
    "response/eos_rate",
    "response/length_score_corr",
    "val/explained_variance",
    "perf/generated_tokens_per_s",
    "perf/generation_s",
    "perf/scoring_s",
    "perf/update_s",
    "train/lr",
]


def test_run_directory_metrics_samples_and_report(ppo_dirs, tmp_path):
    out = tmp_path / "run"
    cfg = resolve(
        "ppo",
        "tldr-ppo",
        None,
        stage_args("ppo", ppo_dirs, out, eval_samples=2, sample_every=1, report_to="tensorboard"),
    )
    assert trainer.run(cfg) == 0
    for name in [
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "eval.json",
        "eval_samples.jsonl",
        "report.html",
        "plots/curves.png",
        "model/model.safetensors",
        "value/scalar_head.safetensors",
        "checkpoints/step-000002/value/scalar_head.safetensors",
        "checkpoints/step-000002/state.pt",
    ]:
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert set(EXPECTED_METRICS) <= set(rows[0]), set(EXPECTED_METRICS) - set(rows[0])
    assert rows[0]["objective/kl"] == 0
    assert [r["train/lr"] for r in rows] == pytest.approx([cfg.learning_rate, cfg.learning_rate / 2])  # Table 7: linear
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {(s["step"], s["rank"]) for s in samples} == {(1, "highest"), (1, "lowest"), (2, "highest"), (2, "lowest")}
    evaluation = json.loads((out / "eval.json").read_text())
    assert {
        "eval/sft_rm_score",
        "eval/ppo_rm_score",
        "eval/ppo_rouge_l",
        "eval/ppo_eos_rate",
        "eval/ppo_length",
    } <= set(evaluation)
    state = torch.load(out / "checkpoints" / "step-000002" / "state.pt", weights_only=True)
    assert {"optimizer", "scheduler", "value_optimizer", "value_scheduler"} <= set(state)


def test_bad_model_paths_fail_at_start_in_one_line(ppo_dirs, tmp_path, capsys):
    def fails_with(message, **extra):
        args = stage_args("ppo", ppo_dirs, tmp_path / "run", **extra)
        assert cli_main(["ppo", *[f"{k}={v}" for k, v in args.items()]]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err

    fails_with("reward_model=./nowhere: no such folder", reward_model="./nowhere")
    fails_with("model=./nowhere: no such folder", model="./nowhere")
    fails_with("is not a reward model folder", reward_model=str(ppo_dirs["policy"]))
    fails_with("nothing to optimise: give reward_model=", reward_model="")
    other = tmp_path / "other-tokenizer-rm"
    reward = ScalarModel.from_pretrained(ppo_dirs["rm"])
    reward.save_pretrained(other)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ppo_dirs["rm"])
    tok.add_tokens(["<extra-token>"])
    tok.save_pretrained(other)
    fails_with("different tokenizers", reward_model=str(other))
    fails_with("must be a multiple of num_minibatches", num_minibatches=3)
