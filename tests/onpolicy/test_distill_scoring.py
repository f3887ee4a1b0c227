"""The teacher scores the student's sampled tokens in the scoring pass, each row once (onpolicy/scoring.py)."""

import copy
import dataclasses

import torch

from rlhfkit.logprobs import plain_lm_head
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.onpolicy.distillation import Teacher
from rlhfkit.onpolicy.scoring import score_rollout
from rlhfkit.stages import resolve

from ..support.gradients import collected
from ..support.tiny import stage_args


def rows_read(model: torch.nn.Module) -> list[int]:
    """The rows of each forward pass of `model`'s backbone from now on (its plain-head probe made first)."""
    plain_lm_head(model)
    passes: list[int] = []
    backbone = getattr(model, model.base_model_prefix)
    backbone.register_forward_hook(lambda _module, _args, kwargs, _out: passes.append(kwargs["input_ids"].size(0)),
                                   with_kwargs=True)
    return passes


def test_a_teacher_equal_to_the_start_scores_each_token_as_the_reference_does_each_row_once(ppo_dirs, tmp_path):
    # unshared rows for every model: the teacher reads none yet, and the comparison is to the bit
    options = stage_args("grpo", ppo_dirs, tmp_path / "run", forward_batch_size=4, shared_prefix="off",
                         teacher=str(ppo_dirs["policy"]))
    cfg = resolve("grpo", None, None, options)
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    teacher = Teacher(copy.deepcopy(models.reference), cfg.distill_options, len(models.tokenizer),
                      models.tokenizer.pad_token_id)
    models = dataclasses.replace(models, teacher=teacher)
    passes = rows_read(teacher.model)
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    assert torch.equal(batch.teacher_logprobs, batch.ref_logprobs)
    assert torch.equal(batch.teacher_logprobs, batch.logprobs)  # before any update: the KL to the teacher is 0
    assert passes == [4] * (batch.size // 4)  # every row once, forward_batch_size rows a pass
    assert (batch.teacher_logprobs * ~batch.trained_mask).eq(0).all()
    rescored = score_rollout(models, batch, trainer.scoring_plan(models, cfg), "no")
    assert len(passes) == 2 * batch.size // 4 and torch.equal(rescored.teacher_logprobs, batch.teacher_logprobs)


def test_without_a_teacher_the_rollout_has_no_teacher_logprobs(ppo_dirs, tmp_path):
    cfg = resolve("grpo", None, None, stage_args("grpo", ppo_dirs, tmp_path / "run"))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    assert collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef).teacher_logprobs is None
