"""On-policy distillation (docs/distillation.md): the student samples, a frozen teacher scores each of its tokens
once per update, and the update learns the teacher's signal (onpolicy/distillation.py, distill_ops.py)."""

import dataclasses
import json

import pytest
import torch
import torch.multiprocessing as mp

from rlhfkit.errors import ConfigError
from rlhfkit.logprobs import plain_lm_head
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.stages import resolve

from ..support.gradients import (
    assert_same_gradient,
    collected,
    distill_split_worker,
    distill_update_gradient,
)
from ..support.processes import (
    assert_same_files,
    assert_same_metrics,
    free_port,
    run_forked,
    straight_and_resumed,
)
from ..support.tiny import command, stage_args

LOSSES = ("reverse-kl-advantage", "jsd", "topk-forward-kl")
# the tiny random models' next-token distributions are near uniform over 49k tokens: a top 64 holds so little of
# the teacher's mass that the update barely moves; the split comparisons take the top 16,384
SPLIT_CASES = [{"distill_loss": "reverse-kl-advantage"}, {"distill_loss": "jsd", "distill_beta": 0.3},
               {"distill_loss": "topk-forward-kl", "distill_top_k": 16384}]


def distill_setup(ppo_dirs, tmp_path, teacher, **extra):
    options = stage_args("distill", ppo_dirs, tmp_path / "run", teacher=str(teacher), **extra)
    cfg = resolve("distill", None, None, options)
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, [e.query.ids for e in train]


@pytest.mark.parametrize("loss", LOSSES)
def test_a_student_equal_to_its_teacher_has_kl_0_loss_0_and_gradient_0(loss, ppo_dirs, tmp_path):
    cfg, models, prompts = distill_setup(ppo_dirs, tmp_path, ppo_dirs["policy"], distill_loss=loss,
                                         reuse_update_forward="false")
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    assert torch.equal(batch.teacher_logprobs, batch.logprobs)  # the teacher reads the rows as the student does
    assert batch.advantages.eq(0).all()
    plan = trainer.update_plan(models, cfg, "no")
    from rlhfkit.onpolicy.update import Averages, MicroBatch, Normalisers, UpdateStep, micro_loss

    rows = batch
    normalisers = Normalisers(float(plan.objective.units(rows).sum()), float(rows.trained_mask.sum()))
    stats = Averages()
    micro_loss(models, MicroBatch(rows, None, (1.0, 1.0)), plan, UpdateStep(1, 0.0), normalisers, stats)
    gradients = [p.grad for p in models.policy.parameters() if p.grad is not None]
    assert gradients and all(g.abs().max() < 1e-6 for g in gradients)  # no signal: student == teacher
    if loss != "reverse-kl-advantage":
        assert abs(stats.means()["distill/divergence"]) < 1e-6


def test_the_teachers_advantage_is_minus_coef_times_the_log_ratio_of_each_sampled_token(ppo_dirs, tiny_teacher_dir,
                                                                                         tmp_path):
    cfg, models, prompts = distill_setup(ppo_dirs, tmp_path, tiny_teacher_dir, distill_coef=0.5)
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    want = -0.5 * (batch.logprobs - batch.teacher_logprobs) * batch.trained_mask
    torch.testing.assert_close(batch.advantages, want, rtol=0, atol=1e-7)
    assert (batch.advantages != 0).any()
    discounted = collected(models, prompts, dataclasses.replace(cfg, distill_discount=1.0), 0, cfg.kl_coef)
    # discount 1: each token's advantage is the sum of its own and every later token's signal
    torch.testing.assert_close(discounted.advantages, want.flip(1).cumsum(1).flip(1) * batch.trained_mask,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda case: case["distill_loss"])
def test_one_distillation_update_is_the_same_in_1x8_2x4_and_4x2_micro_batches(case, ppo_dirs, tiny_teacher_dir,
                                                                              tmp_path):
    whole = distill_update_gradient(ppo_dirs, tiny_teacher_dir, tmp_path, case, micro=8)
    for micro in (4, 2):
        split = distill_update_gradient(ppo_dirs, tiny_teacher_dir, tmp_path, case, micro=micro)
        assert_same_gradient(split, whole, f"{case}: {8 // micro}x{micro}")


def test_two_gloo_processes_give_the_distillation_gradient_one_process_gives(ppo_dirs, tiny_teacher_dir, tmp_path):
    out = tmp_path / "gradients.pt"
    cases = SPLIT_CASES
    mp.start_processes(
        distill_split_worker,
        args=(2, free_port(), {k: str(v) for k, v in ppo_dirs.items()}, str(tiny_teacher_dir), str(tmp_path), cases,
              str(out)),
        nprocs=2, start_method="spawn", join=True,
    )
    for case, gradient in zip(cases, torch.load(out, weights_only=True), strict=True):
        want = distill_update_gradient(ppo_dirs, tiny_teacher_dir, tmp_path, case, micro=8)
        assert_same_gradient(gradient, want, f"2 processes, {case}")


@pytest.mark.parametrize("loss", ("reverse-kl-advantage", "jsd"))
def test_the_teacher_reads_each_row_once_an_update_however_many_epochs_and_minibatches(loss, ppo_dirs,
                                                                                        tiny_teacher_dir, tmp_path):
    options = {"distill_loss": loss, "update_epochs": 2, "num_minibatches": 2, "max_steps": 2}
    cfg, models, prompts = distill_setup(ppo_dirs, tmp_path, tiny_teacher_dir, **options)
    rows: list[int] = []
    plain_lm_head(models.teacher.model)  # its one-time probe of the head made before counting
    backbone = getattr(models.teacher.model, models.teacher.model.base_model_prefix)
    backbone.register_forward_hook(lambda _m, _a, kwargs, _o: rows.append(kwargs["input_ids"].size(0)),
                                   with_kwargs=True)
    (tmp_path / "run").mkdir()
    steps = trainer.train_on_policy(models, prompts, cfg, tmp_path / "run", launch=trainer.Launch.of(cfg),
                                    plan=trainer.update_plan(models, cfg, "no"))
    assert sum(rows) == steps.total * cfg.total_batch_size  # 2 updates x 8 rows, not x epochs x minibatches
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["perf/teacher_reads_per_row"] for m in metrics if "perf/teacher_reads_per_row" in m] == [1.0, 1.0]


def test_rlhfkit_distill_and_grpo_with_a_teacher_run_from_the_command_line(ppo_dirs, tiny_teacher_dir, tmp_path):
    out = tmp_path / "distill"
    run_forked(command("distill", ppo_dirs, out, teacher=str(tiny_teacher_dir), max_steps=2), tmp_path / "log",
               check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "distill/reverse_kl" in r]
    assert len(trained) == 2 and all(r["distill/reverse_kl"] != 0 and r["perf/teacher_reads_per_row"] == 1
                                     for r in trained)
    assert (out / "model" / "config.json").is_file()
    assert (out / "plots" / "distill.png").is_file()  # the report's distillation section
    report = (out / "report.html").read_text()
    assert "per-token KL(student || teacher)" in report and "Distillation: per-token KL to the teacher" in report
    assert "teacher" in (out / "config.yaml").read_text()
    mixed = tmp_path / "grpo"
    run_forked(command("grpo", ppo_dirs, mixed, teacher=str(tiny_teacher_dir), distill_coef=0.5, distill_loss="jsd"),
               tmp_path / "log-grpo", check=True)
    row = [json.loads(line) for line in (mixed / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["distill/divergence"] > 0 and "rewards/reward_model" in row  # the teacher beside the task reward


def test_rlhfkit_distill_from_python_takes_a_loaded_teacher(ppo_dirs, tiny_teacher_dir, tmp_path):
    import rlhfkit
    from rlhfkit.models import load_policy

    teacher, tokenizer = load_policy(str(tiny_teacher_dir))
    options = stage_args("distill", ppo_dirs, tmp_path / "run", max_steps=1, distill_loss="topk-forward-kl",
                         distill_top_k=8)
    result = rlhfkit.distill(teacher=(teacher, tokenizer), **options)
    assert result.metrics["distill/divergence"].iloc[-1] > 0
    assert result.config.teacher.startswith("python:teacher-")


def test_self_distillation_reads_the_prompt_with_its_hint(ppo_dirs, environment_dirs, tmp_path):
    options = stage_args("distill", ppo_dirs, tmp_path / "run", teacher="self", teacher_hint="The answer is {answer}.",
                         prompt_format="gsm8k", data=str(environment_dirs["gsm8k"]))
    cfg = resolve("distill", None, None, options)
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    assert models.teacher.model is models.reference  # no second model
    from rlhfkit.onpolicy.distillation import hinted_queries

    models.teacher.queries = hinted_queries(train, cfg.teacher_hint, models.tokenizer, cfg.max_query_length)
    first = models.tokenizer.decode(models.teacher.queries[0])
    assert f"The answer is {train[0].record.columns['answer']}." in first
    assert first.replace(f"\n\nThe answer is {train[0].record.columns['answer']}.", "") == train[0].query.text
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    assert not torch.equal(batch.teacher_logprobs, batch.ref_logprobs)  # the hint changes what the start says
    assert (batch.advantages != 0).any()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"reward_functions": "gsm8k"}, "run grpo, rloo, reinforce or ppo with teacher="),
        ({"teacher": "self"}, "teacher=self reads the prompt with teacher_hint="),
        ({"teacher_temperature": 1.0}, "teacher_temperature=1 differs from the sampling temperature=0.7"),
        ({"teacher_hint": "{answer}"}, "teacher_hint is read by teacher=self alone"),
    ],
)
def test_distillation_options_that_cannot_teach_are_refused(options, match, ppo_dirs, tiny_teacher_dir, tmp_path):
    with pytest.raises(ConfigError, match=match):
        given = stage_args("distill", ppo_dirs, tmp_path, teacher=str(tiny_teacher_dir)) | options
        resolve("distill", None, None, given)


def test_rlhfkit_distill_without_a_teacher_stops_before_any_model_loads(ppo_dirs, tmp_path):
    cfg = resolve("distill", None, None, stage_args("distill", ppo_dirs, tmp_path))  # its defaults resolve
    with pytest.raises(ConfigError, match="distill needs teacher=: a model/ folder"):
        trainer.load_models(cfg, None, torch.device("cpu"))


def test_a_teacher_temperature_that_differs_is_taken_when_asked(ppo_dirs, tiny_teacher_dir, tmp_path):
    cfg = resolve("distill", None, None, stage_args("distill", ppo_dirs, tmp_path, teacher=str(tiny_teacher_dir),
                                                    teacher_temperature=1.0, teacher_temperature_differs="true"))
    assert cfg.distill_options.temperature == 1.0


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short
@pytest.mark.parametrize("loss", ("reverse-kl-advantage", "jsd"))
def test_a_distillation_run_killed_and_resumed_is_bit_identical(loss, ppo_dirs, tiny_teacher_dir, tmp_path):
    args = stage_args("distill", ppo_dirs, tmp_path, max_steps=3, teacher=str(tiny_teacher_dir), distill_loss=loss)
    straight, killed = straight_and_resumed("distill", None, args, tmp_path, kill_at=1)
    assert_same_files(straight / "model", killed / "model", ["model.safetensors"])
    rows = assert_same_metrics(straight, killed, 3)
    assert any("distill/reverse_kl" in r for r in rows)
