"""One episode plan for training and evaluation (rlhfkit/environments/plan.py): `eval gsm8k` builds each policy's
plan with the function an on-policy stage builds its own with, from the same options, and its episodes are seeded
by the plan's rule, as the stage's held-out episodes are."""

from rlhfkit.config import GRPOConfig, Gsm8kEvalConfig
from rlhfkit.environments import episode_plan
from rlhfkit.environments.calculator import Gsm8kCalculator
from rlhfkit.eval.gsm8k import answer, named_environments, named_models, select_problems
from rlhfkit.generation import EVALUATION_STREAM

from ..support.data import data_file
from ..support.episodes import eos_prone_policy

OPTIONS = {"environment_args": {"max_calls": 3}, "max_turns": 5, "environment_timeout": 9.0, "check_tokens": True,
           "seed": 4}


def evaluation_plan(**options):
    cfg = Gsm8kEvalConfig(models=["calc=m"], environments=["calc=gsm8k-calculator"], **options)
    return named_environments(cfg, named_models(cfg.models))["calc"]


def test_eval_gsm8k_builds_the_plan_an_on_policy_stage_builds_from_the_same_options():
    training = episode_plan(GRPOConfig(environment="gsm8k-calculator", **OPTIONS).episode_options)
    evaluation = evaluation_plan(**OPTIONS)
    assert evaluation == training
    assert evaluation.environment is Gsm8kCalculator and evaluation.arguments == {"max_calls": 3}
    assert evaluation.limits(60, 0.7) == training.limits(60, 0.7)
    assert [evaluation.seed(0, EVALUATION_STREAM, row) for row in range(4)] == [
        training.seed(0, EVALUATION_STREAM, row) for row in range(4)
    ]


def test_the_evaluation_and_the_stage_default_to_the_same_episode_limits():
    assert evaluation_plan(seed=4) == episode_plan(GRPOConfig(environment="gsm8k-calculator", seed=4).episode_options)


class SeedsSeen(Gsm8kCalculator):
    seeds: list[int] = []

    def __init__(self, start, tokenizer, **arguments):
        super().__init__(start, tokenizer, **arguments)
        SeedsSeen.seeds.append(start.seed)


def test_an_evaluated_episode_is_seeded_by_the_plans_rule_on_the_evaluation_stream(monkeypatch):
    model, tokenizer = eos_prone_policy()
    cfg = Gsm8kEvalConfig(data=[str(data_file("gsm8k", "test.jsonl.gz"))], max_prompts=3, max_response_length=8,
                          generation_batch_size=2, **OPTIONS | {"check_tokens": False})
    plan = episode_plan(cfg.episode_options("tests.environments.test_episode_plan:SeedsSeen"))
    monkeypatch.setattr(SeedsSeen, "seeds", [])
    batch = answer(model, select_problems(cfg, tokenizer), tokenizer, cfg, 0.7, 2, plan)
    assert batch.episodes is not None and batch.size == 6
    assert sorted(SeedsSeen.seeds) == sorted(plan.seed(0, EVALUATION_STREAM, row) for row in range(6))
