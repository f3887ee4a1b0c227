"""GRPO and RLOO on PPO's on-policy core: groups, shared prefill, KL placement, resume."""

import json

import pytest
import torch

from rlhfkit import generation
from rlhfkit.cli import main as cli_main
from rlhfkit.data.collate import left_pad_queries
from rlhfkit.errors import ConfigError
from rlhfkit.generation import SampleKeys, sample_responses
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.onpolicy.advantages import compute_advantages
from rlhfkit.onpolicy.scoring import score_rollout
from rlhfkit.stages import resolve

from ..support.data import data_file
from ..support.decoding import SamplingLogprobs
from ..support.gradients import collected, run_update
from ..support.processes import assert_same_files, assert_same_metrics, straight_and_resumed
from ..support.tiny import PRESETS, stage_args


def setup(stage, dirs, tmp_path, **extra):
    cfg = resolve(stage, PRESETS[stage], None, stage_args(stage, dirs, tmp_path / "run", **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, [e.query.ids for e in train]


def test_group_sampling_encodes_each_prompt_once_and_matches_repeated_prompts(ppo_dirs, tmp_path, monkeypatch):
    cfg, models, prompts = setup("grpo", ppo_dirs, tmp_path)
    sampling = SamplingLogprobs(monkeypatch)
    tok, queries = models.tokenizer, prompts[:3]
    prefill_rows = []
    forward = models.policy.forward

    def recording_forward(*args, **kwargs):
        if (
            kwargs.get("past_key_values", kwargs.get("cache")) is None
        ):  # a prefill passes no cache (transformers < 5.24 names it past_key_values)
            prefill_rows.append(kwargs["input_ids"].size(0))
        return forward(*args, **kwargs)

    models.policy.forward = recording_forward
    params = generation.SamplingParams(max_new_tokens=6, temperature=0.0)
    padded = left_pad_queries(queries, tok.pad_token_id)
    shared = generation.generate(
        models.policy,
        padded["input_ids"],
        padded["attention_mask"],
        params,
        tok.eos_token_id,
        tok.pad_token_id,
        samples_per_prompt=4,
    )
    shared_logprobs = sampling.of(shared)
    assert prefill_rows == [3]  # one prefill row per prompt, not per sample
    repeated = left_pad_queries([q for q in queries for _ in range(4)], tok.pad_token_id)
    plain = generation.generate(
        models.policy, repeated["input_ids"], repeated["attention_mask"], params, tok.eos_token_id, tok.pad_token_id
    )
    assert torch.equal(shared.responses, plain.responses) and torch.equal(shared.queries, plain.queries)
    torch.testing.assert_close(shared_logprobs, sampling.of(plain), atol=1e-5, rtol=1e-4)


def test_rows_come_in_groups_of_the_same_prompt(ppo_dirs, tmp_path):
    cfg, models, prompts = setup("rloo", ppo_dirs, tmp_path, generation_batch_size=4)
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    assert batch.size == 8 and batch.prompts.view(2, 4).unique(dim=1).size(1) == 1
    for group in batch.query_ids.view(2, 4, -1):
        assert all(torch.equal(group[0], row) for row in group)
    assert batch.prompts[0] != batch.prompts[4]


@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_equal_scores_in_a_group_give_zero_advantages_and_no_update(stage, ppo_dirs, tmp_path):
    cfg, models, prompts = setup(stage, ppo_dirs, tmp_path, kl_coef=0.0)
    scoring = trainer.scoring_plan(models, cfg)
    batch = score_rollout(
        models,
        sample_responses(
            models.policy,
            prompts[:2],
            generation.SamplingParams(max_new_tokens=10),
            models.tokenizer,
            8,
            SampleKeys(1),
            samples_per_prompt=4,
        ),
        scoring,
        "no",
    )
    batch.raw_scores = torch.tensor([0.3] * 4 + [-2.0] * 4)
    batch.has_eos = torch.ones(8, dtype=torch.bool)
    batch = compute_advantages(batch, cfg.advantage_options, cfg.kl_coef, scoring.old_logprobs)
    assert batch.advantages.abs().max() == 0
    before = {k: v.clone() for k, v in models.policy.state_dict().items()}
    run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg)
    assert all(torch.equal(v, before[k]) for k, v in models.policy.state_dict().items())


def test_kl_as_a_loss_term_is_zero_at_step_0_and_pulls_towards_the_reference(ppo_dirs, tmp_path):
    # eos_trick off: a tiny random model rarely emits EOS, and equal -1 scores would leave nothing to learn
    cfg, models, prompts = setup("grpo", ppo_dirs, tmp_path, kl_coef=0.1, update_epochs=2, eos_trick=False)
    assert cfg.kl_placement == "loss" and cfg.kl_estimator == "k3"
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    last = batch.mask.sum(-1) - 1
    score_only = torch.zeros_like(batch.rewards)
    score_only[torch.arange(batch.size), last] = batch.scores
    torch.testing.assert_close(batch.rewards, score_only)  # no KL penalty inside the reward
    metrics = run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg).metrics
    assert metrics["loss/kl_avg"] > 0  # the second epoch saw a moved policy
    first_epoch_only = run_update(*reset(models, cfg, prompts, update_epochs=1)).metrics
    assert first_epoch_only["loss/kl_avg"] == 0  # k3 of identical policies


def reset(models, cfg, prompts, **changes):
    import dataclasses

    cfg = dataclasses.replace(cfg, **changes)
    models.policy.load_state_dict(models.reference.state_dict())
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    return models, trainer.build_optimizers(models, cfg, 2), batch, cfg


def test_clipping_can_be_turned_off(ppo_dirs, tmp_path):
    cfg, models, prompts = setup(
        "grpo", ppo_dirs, tmp_path, clip_range=0.0, update_epochs=3, learning_rate=3e-2, eos_trick=False
    )
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    metrics = run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg).metrics
    assert metrics["policy/clipfrac_avg"] == 0 and metrics["val/ratio_var"] > 0


@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_group_stages_refuse_one_sample_per_prompt_and_any_estimator_but_their_own(stage, ppo_dirs, tmp_path):
    with pytest.raises(ConfigError, match="samples_per_prompt"):
        resolve(stage, PRESETS[stage], None, stage_args(stage, ppo_dirs, tmp_path, samples_per_prompt=1))
    other = {"grpo": "rloo", "rloo": "grpo"}[stage]
    for command, estimator, own in ((stage, other, stage), ("ppo", stage, "gae")):
        with pytest.raises(
            ConfigError, match=f"advantage_estimator='{estimator}' is not accepted; choose one of: {own}$"
        ):
            resolve(
                command, None, None, {"advantage_estimator": estimator}
            )  # no stage runs another's algorithm under its name


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short
@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_run_directory_and_resume_after_sigkill_are_identical(stage, ppo_dirs, tmp_path):
    updates = 3
    args = stage_args(
        stage,
        ppo_dirs,
        tmp_path,
        max_steps=updates,
        sample_every=1,
        eval_samples=2,
        report_to="tensorboard",
        eos_trick="false",
    )
    straight, killed = straight_and_resumed(stage, PRESETS[stage], args, tmp_path, kill_at=1)
    for name in [
        "config.yaml",
        "metrics.jsonl",
        "samples.jsonl",
        "eval.json",
        "report.html",
        "plots/curves.png",
        "model/model.safetensors",
    ]:
        assert (straight / name).is_file(), name
    assert not (straight / "value").exists()  # no value model
    assert_same_files(straight, killed, ["model/model.safetensors"])
    rows = assert_same_metrics(straight, killed, updates)
    assert rows[0]["objective/kl"] == 0
    assert "val/explained_variance" not in rows[0] and ("loss/kl_avg" in rows[0]) == (stage == "grpo")
    assert (straight / "samples.jsonl").read_text() == (killed / "samples.jsonl").read_text()
    evaluation = json.loads((straight / "eval.json").read_text())
    assert {f"eval/{stage}_rm_score", "eval/sft_rm_score"} <= set(evaluation)


def test_hh_dialogues_serve_as_prompts(ppo_dirs, tmp_path):
    hh = data_file("hh-rlhf", "helpful-base", "test.jsonl.gz")
    cfg = resolve(
        "grpo",
        "tldr-grpo",
        None,
        stage_args("grpo", ppo_dirs, tmp_path, data=str(hh), prompt_format="hh", validation_posts=10),
    )
    tokenizer = trainer.load_models(cfg, None, torch.device("cpu")).tokenizer
    train, held_out, notes = evaluation.split_posts(cfg.prompt_split, tokenizer)
    assert len(train) > 100 and len(held_out) == 10
    assert {e.record.task for e in train} == {"hh"} and "Human:" in evaluation.prompt_body(train[0].record)
    assert len({e.record.prompt_id for e in train}) == len(train)  # one prompt per distinct dialogue


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        (
            "tldr-grpo",
            {
                "samples_per_prompt": 4,
                "advantage_estimator": "grpo",
                "kl_placement": "loss",
                "kl_estimator": "k3",
                "total_batch_size": 512,
                "learning_rate": 3e-6,
                "kl_coef": 0.05,
                "temperature": 0.7,
            },
        ),
        (
            "tldr-rloo",
            {
                "samples_per_prompt": 4,
                "advantage_estimator": "rloo",
                "kl_placement": "reward",
                "kl_estimator": "k1",
                "total_batch_size": 512,
                "learning_rate": 3e-6,
                "kl_coef": 0.05,
            },
        ),
        (
            "hh-grpo",
            {
                "samples_per_prompt": 4,
                "kl_coef": 0.1,
                "learning_rate": 1e-5,
                "clip_range": 0.0,
                "prompt_format": "hh",
                "model": "openai-community/gpt2",
                "total_episodes": 80_000,
            },
        ),
    ],
)
def test_group_presets(preset, expected):
    cfg = resolve(preset.split("-")[1], preset, None, {})
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_grpo_and_rloo_have_their_commands(capsys):
    for stage in ("grpo", "rloo"):
        assert cli_main([stage, "--help"]) == 0
        assert "samples_per_prompt" in capsys.readouterr().out
