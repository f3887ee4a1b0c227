"""The published methods through their commands: each preset runs end to end; DAPO's
dynamic sampling drops and refills groups whose scores tie and its overlong shaping reaches the
scores; ReMax's baseline is the greedy answer's score; the prompt stream resumes where it stopped."""

import dataclasses
import json

import pytest
import torch

from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.onpolicy.collect import PromptStream, prompt_indices
from rlhfkit.stages import resolve

from ..support.gradients import collected
from ..support.processes import straight_and_resumed
from ..support.tiny import cli_args, stage_args

# a reward that ties within the groups of prompts of even length (every answer scores 0.5) and
# varies with the answer's length for the others: dynamic sampling must drop exactly the former
TIES = '''
def half_tied(prompts, completions, **columns):
    return [0.5 if len(p) % 2 == 0 else float(len(c)) for p, c in zip(prompts, completions)]
'''


def setup(stage, preset, dirs, tmp_path, **extra):
    cfg = resolve(stage, preset, None, stage_args(stage, dirs, tmp_path / "run", **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, train


@pytest.mark.parametrize(("stage", "preset", "extra"), [
    ("grpo", "tldr-dr-grpo", {}), ("grpo", "tldr-dapo", {"overlong_buffer": 4}), ("grpo", "tldr-gspo", {}),
    ("grpo", "tldr-grpo", {"policy_loss": "cispo", "clip_range_high": 0.28}), ("reinforce", "tldr-reinforce-pp", {}),
    ("reinforce", "tldr-reinforce-pp", {"advantage_estimator": "reinforce-pp-baseline", "samples_per_prompt": 4}),
    ("reinforce", "tldr-reinforce-pp", {"advantage_estimator": "remax"}),
], ids=["dr-grpo", "dapo", "gspo", "cispo", "reinforce-pp", "reinforce-pp-baseline", "remax"])
def test_each_method_runs_end_to_end_through_its_command(stage, preset, extra, ppo_dirs, tmp_path):
    out = tmp_path / "run"
    options = stage_args(stage, ppo_dirs, out, **({"samples_per_prompt": 4} if stage == "grpo" else {}), **extra)
    assert cli_main([stage, "--preset", preset, *cli_args(options)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # DAPO's overlong filtering leaves no loss when every response was cut (the tiny model rarely ends)
    for row in rows:
        assert ("loss/policy_avg" in row) == (row["response/eos_rate"] > 0 or preset != "tldr-dapo")
        assert all(v == v for v in row.values() if isinstance(v, float))  # no NaN
    assert ("sampling/draws" in rows[0]) == (preset == "tldr-dapo")
    assert (out / "model" / "model.safetensors").is_file()


def tied_setup(ppo_dirs, tmp_path, **extra):
    functions = tmp_path / "ties.py"
    functions.write_text(TIES)
    return setup(
        "grpo",
        "tldr-dapo",
        ppo_dirs,
        tmp_path,
        samples_per_prompt=4,
        reward_model="",
        eos_trick=False,
        overlong_buffer=0,
        reward_functions=[f"{functions}:half_tied"],
        **extra,
    )


def test_dynamic_sampling_drops_groups_whose_scores_tie_and_refills_from_the_stream(ppo_dirs, tmp_path):
    cfg, models, train = tied_setup(ppo_dirs, tmp_path, dynamic_sampling_max_draws=8)
    prompts, texts = [e.query.ids for e in train], trainer.PromptTexts.of(train)
    stream, counts = PromptStream(), {}
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef, texts=texts, stream=stream, counts=counts)
    groups = batch.raw_scores.view(-1, 4)
    assert batch.size == 8 and bool((groups.max(1).values > groups.min(1).values).all())  # only informative groups kept
    even = [len(train[int(i)].query.text) % 2 == 0 for i in batch.prompts[::4]]
    assert not any(even)
    draws = int(counts["sampling/draws"])
    assert stream.position == draws * 2 and counts["sampling/filled_groups"] == 0  # 2 prompts per draw, all read
    assert counts["sampling/dropped_groups"] + 2 <= draws * 2  # the dropped and the kept come from the draws
    plain = collected(models, prompts, dataclasses.replace(cfg, dynamic_sampling=False), 0, cfg.kl_coef, texts=texts)
    assert plain.size == 8


def test_dynamic_sampling_fills_the_update_with_dropped_groups_when_the_draws_run_out(ppo_dirs, tmp_path):
    cfg, models, train = tied_setup(ppo_dirs, tmp_path, dynamic_sampling_max_draws=1, dynamic_sampling_min_spread=1e9)
    counts = {}
    batch = collected(
        models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef, texts=trainer.PromptTexts.of(train), counts=counts
    )
    assert batch.size == 8 and counts["sampling/filled_groups"] == 2 and counts["sampling/kept_share"] == 0
    # the one draw's groups, dropped, fill the update in their order: the stream's first two prompts
    assert batch.prompts[::4].tolist() == prompt_indices(len(train), 2, cfg.seed, 0).tolist()


def test_overlong_punishment_reaches_the_scores_and_filtering_drops_truncated_rows_from_the_loss(ppo_dirs, tmp_path):
    cfg, models, train = setup(
        "grpo",
        "tldr-dapo",
        ppo_dirs,
        tmp_path,
        samples_per_prompt=4,
        overlong_buffer=4,
        dynamic_sampling=False,
        eos_trick=False,
    )
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    excess = (batch.lengths.float() - (cfg.max_response_length - 4)).clamp(min=0)
    torch.testing.assert_close(batch.scores, batch.raw_scores - torch.clamp(excess / 4, max=1.0))
    objective = trainer.objective_of(cfg)
    assert bool((objective.loss_mask(batch).any(1) == batch.has_eos).all())


def test_remax_baseline_is_the_greedy_answers_score(ppo_dirs, tmp_path):
    # sampling at temperature 0 answers greedily: each sample is its prompt's greedy answer, so with no
    # KL every advantage is its score minus that same score
    cfg, models, train = setup(
        "reinforce", "tldr-reinforce-pp", ppo_dirs, tmp_path, advantage_estimator="remax", kl_coef=0.0
    )
    # a run refuses this no-op (tests/onpolicy/test_greedy_sampling.py); the collection is what is checked here
    cfg = dataclasses.replace(cfg, temperature=0.0)
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    torch.testing.assert_close(batch.baseline_scores, batch.scores)
    assert float(batch.advantages.abs().max()) < 1e-5
    sampled = collected(models, [e.query.ids for e in train], dataclasses.replace(cfg, temperature=1.0), 0, 0.0)
    torch.testing.assert_close(sampled.advantages[:, 0], sampled.scores - sampled.baseline_scores)


def test_objective_options_that_disagree_are_refused(ppo_dirs, tmp_path):
    for options, match in (
        ({"dual_clip": 0.5}, "dual_clip=0.5 must be above 1"),
        ({"clip_range": 0.0, "clip_range_high": 0.28}, "needs clipping"),
        ({"overlong_buffer": 53}, "overlong_buffer=53 must be below max_response_length=53"),
        ({"advantage_estimator": "reinforce-pp-baseline"}, "samples_per_prompt to 2"),
        ({"dynamic_sampling": True}, "samples_per_prompt to 2"),
    ):
        with pytest.raises(ConfigError, match=match):
            resolve("reinforce", "tldr-reinforce-pp", None, options)


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short
def test_dynamic_sampling_resumes_from_where_the_stream_stopped(ppo_dirs, tmp_path):
    functions = tmp_path / "ties.py"
    functions.write_text(TIES)
    args = stage_args(
        "grpo",
        ppo_dirs,
        tmp_path,
        max_steps=3,
        sample_every=1,
        samples_per_prompt=4,
        reward_model="",
        eos_trick="false",
        reward_functions=f"{functions}:half_tied",
        dynamic_sampling_max_draws=6,
        overlong_buffer=4,
    )
    straight, killed = straight_and_resumed("grpo", "tldr-dapo", args, tmp_path, kill_at=1)
    drawn = json.loads((straight / "checkpoints" / "step-000003" / "trainer.json").read_text())["prompts_drawn"]
    assert drawn > 3 * 2  # refills read past one draw per update
    assert (straight / "samples.jsonl").read_text() == (killed / "samples.jsonl").read_text()
