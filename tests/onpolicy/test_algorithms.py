"""The on-policy declarations: each command runs its own algorithm, and each published method's presets
set the options that make it."""

import dataclasses

import pytest
import torch

from rlhfkit import ops
from rlhfkit.cli import main as cli_main
from rlhfkit.config import PPOConfig
from rlhfkit.errors import ConfigError
from rlhfkit.onpolicy import advantages
from rlhfkit.onpolicy.advantages import ESTIMATORS, EstimatorNeeds, estimators_for
from rlhfkit.onpolicy.algorithms import ALGORITHMS, METHODS, algorithm_of
from rlhfkit.onpolicy.trainer import objective_of
from rlhfkit.rollout import RolloutBatch
from rlhfkit.stages import STAGES, check_with_registry, resolve

from ..support.tiny import cli_args, stage_args


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_declaration_is_a_multi_process_command_whose_presets_build_its_config(name):
    algorithm = ALGORITHMS[name]
    stage = STAGES[name]
    assert (stage.config, stage.presets, stage.about, stage.multi_process) == (
        algorithm.config,
        algorithm.presets,
        algorithm.about,
        True,
    )
    for preset in algorithm.presets:
        cfg = resolve(name, preset, None, {})
        assert algorithm_of(type(cfg)) is algorithm and cfg.advantage_estimator in estimators_for(algorithm.config)


def test_each_stage_takes_the_estimators_declared_for_its_config_and_refuses_others_naming_them():
    assert {name: estimators_for(a.config) for name, a in ALGORITHMS.items()} == {
        "ppo": ["gae"],
        "grpo": ["grpo"],
        "rloo": ["rloo"],
        "reinforce": ["reinforce-pp", "reinforce-pp-baseline", "remax"],
        "distill": ["teacher"],
    }
    with pytest.raises(ConfigError, match=r"advantage_estimator='gae' is not accepted; choose one of: grpo$"):
        resolve("grpo", None, None, {"advantage_estimator": "gae"})


def test_only_ppo_declares_a_value_model_and_reads_its_options_from_its_own_config():
    assert [name for name, a in ALGORITHMS.items() if a.needs_value_model] == ["ppo"]
    cfg = dataclasses.replace(PPOConfig(), value_model="v", vf_coef=0.3, value_clip_range=0.0)
    options = cfg.value_options
    assert (options.source, options.coef, options.clip_range) == ("v", 0.3, 0.0)


def test_estimators_read_their_settings_from_the_config():
    rewards = torch.tensor([[0.1, 0.2, 1.0], [0.0, 0.5, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.1, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    cfg = dataclasses.replace(PPOConfig(), gamma=0.9, lam=0.8)
    batch = RolloutBatch(None, None, None, None, mask.bool(), None, values=values)
    for got, want in zip(
        ESTIMATORS["gae"](cfg, rewards, mask, batch, None), ops.gae(rewards, values, mask, 0.9, 0.8), strict=True
    ):
        torch.testing.assert_close(got, want)
    groups = torch.tensor([0, 0])
    for scale in (True, False):
        grpo = dataclasses.replace(resolve("grpo", None, None, {}), scale_rewards=scale)
        advantages, _ = ESTIMATORS["grpo"](grpo, rewards, mask, batch, groups)
        per_row = ops.group_relative_advantages(rewards.sum(-1), groups, scale)
        torch.testing.assert_close(advantages, per_row.unsqueeze(1) * mask)


def test_estimators_declare_their_needs_where_they_are_defined():
    needs = {name: (e.needs.groups, e.needs.greedy_baseline) for name, e in ESTIMATORS.items()}
    assert needs == {
        "gae": (False, False),
        "grpo": (True, False),
        "rloo": (True, False),
        "reinforce-pp": (False, False),
        "reinforce-pp-baseline": (True, False),
        "remax": (False, True),
        "teacher": (False, False),
    }


GREEDY = "so every advantage is 0 and the run learns nothing; set temperature above 0 (e.g. 0.7)"


@pytest.mark.parametrize(
    ("stage", "options", "message"),
    [
        (
            "reinforce",
            {"advantage_estimator": "reinforce-pp-baseline", "samples_per_prompt": 1},
            "advantage_estimator=reinforce-pp-baseline compares the samples of a prompt: set samples_per_prompt to 2 "
            "or more",
        ),
        (
            "ppo",
            {"dynamic_sampling": True},
            "dynamic_sampling=true compares the samples of a prompt: set samples_per_prompt to 2 or more",
        ),
        (
            "reinforce",
            {"advantage_estimator": "remax", "temperature": 0.0},
            "temperature=0 samples greedily: each response is its own greedy baseline (advantage_estimator=remax), "
            f"{GREEDY}",
        ),
        (
            "rloo",
            {"temperature": 0.0},
            "temperature=0 samples greedily: the samples_per_prompt=4 responses to a prompt are identical "
            f"(advantage_estimator=rloo compares them), {GREEDY}",
        ),
        (
            "grpo",
            {"temperature": 0.0, "dynamic_sampling": True},
            "temperature=0 samples greedily: the samples_per_prompt=4 responses "
            f"to a prompt are identical (dynamic_sampling=true drops every group), {GREEDY}",
        ),
        ("reinforce", {"advantage_estimator": "reinforce-pp", "temperature": 0.0}, None),
        ("ppo", {"temperature": 0.0}, None),
    ],
)
def test_a_config_that_cannot_give_its_estimator_what_it_needs_is_refused(stage, options, message):
    cfg = dataclasses.replace(resolve(stage, None, None, {}), **options)
    if message is None:
        check_with_registry(stage, cfg)
    else:
        with pytest.raises(ConfigError) as refused:
            check_with_registry(stage, cfg)
        assert str(refused.value) == message


def test_an_estimator_declared_elsewhere_with_the_decorator_is_registered_checked_and_used(monkeypatch):
    monkeypatch.setattr(advantages, "ESTIMATORS", dict(ESTIMATORS))  # the shipped registry stays as it was

    @advantages.estimator("best-of-group", needs_groups=True)
    def best_of_group(_options, rewards, mask, _batch, groups):
        """1 for each token of its group's best response, else 0."""
        totals = rewards.sum(-1)
        best = torch.stack([totals[groups == g].max() for g in groups.tolist()])
        return (totals == best).float().unsqueeze(1) * mask, rewards

    assert advantages.ESTIMATORS["best-of-group"].needs == EstimatorNeeds(groups=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    zeros = torch.zeros(4, 3)
    batch = RolloutBatch(
        torch.tensor([0, 0, 1, 1]),
        None,
        None,
        torch.zeros(4, 3, dtype=torch.long),
        mask,
        torch.ones(4, dtype=torch.bool),
        logprobs=zeros,
        ref_logprobs=zeros,
        raw_scores=torch.tensor([0.5, 0.9, 0.2, -0.3]),
    )
    grpo = resolve("grpo", None, None, {})
    cfg = dataclasses.replace(grpo, advantage_estimator="best-of-group", samples_per_prompt=2, whiten_advantages=False)
    out = advantages.compute_advantages(batch, cfg.advantage_options, 0.0)
    assert out.advantages.tolist() == [[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]]
    with pytest.raises(ConfigError, match="advantage_estimator=best-of-group compares the samples of a prompt"):
        check_with_registry("grpo", dataclasses.replace(cfg, samples_per_prompt=1))
    assert "best-of-group" not in ESTIMATORS


def test_an_estimator_registered_in_a_test_runs_through_rlhfkit_grpo(monkeypatch, ppo_dirs, tmp_path):
    """docs/architecture.md, "A new advantage estimator": the decorator is all it takes."""
    monkeypatch.setattr(advantages, "ESTIMATORS", dict(ESTIMATORS))
    called = []

    @advantages.estimator("toy-mean-baseline", needs_groups=True)
    def toy_mean_baseline(_options, rewards, mask, _batch, groups):
        """The sequence reward minus the batch's mean, unscaled: a baseline that ignores the groups."""
        called.append(groups.numel())
        totals = rewards.sum(-1)
        return ops.sequence_advantages(totals - totals.mean(), mask)

    out = tmp_path / "toy"
    options = stage_args("grpo", ppo_dirs, out, advantage_estimator="toy-mean-baseline")
    assert cli_main(["grpo", "--preset", "tldr-grpo", *cli_args(options)]) == 0
    assert called and all(n == 8 for n in called)  # once per update, on the whole batch of 8 rows
    assert "advantage_estimator: toy-mean-baseline" in (out / "config.yaml").read_text()
    assert (out / "model" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="advantage_estimator=toy-mean-baseline compares the samples of a prompt"):
        resolve("reinforce", None, None, {"advantage_estimator": "toy-mean-baseline"})  # one sample per prompt


def test_the_objective_counts_tokens_or_sequences_and_drops_truncated_rows_when_asked():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    batch = RolloutBatch(None, None, None, torch.zeros(3, 3), mask, torch.tensor([True, True, False]))
    ppo, grpo = resolve("ppo", None, None, {}), resolve("grpo", None, None, {})
    assert objective_of(ppo).units(batch).tolist() == [3.0, 1.0, 2.0]  # token-mean: each row's tokens
    assert objective_of(grpo).units(batch).tolist() == [1.0, 1.0, 1.0]  # GRPO's sequence mean: one each
    dapo = resolve("grpo", "tldr-dapo", None, {})
    assert objective_of(dapo).units(batch).tolist() == [3.0, 1.0, 0.0]  # the row cut without EOS takes no part
    assert objective_of(resolve("grpo", "tldr-dr-grpo", None, {})).constant == 53.0  # max_response_length


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_every_method_preset_sets_the_options_that_make_the_method(method):
    assert method.command in ALGORITHMS and method.citation and method.changes
    for preset in method.presets:
        assert preset in ALGORITHMS[method.command].presets
        cfg = resolve(method.command, preset, None, {})
        assert {k: getattr(cfg, k) for k in method.options} == method.options, preset
    if not method.presets:  # a method without a preset still resolves from its options
        cfg = resolve(method.command, None, None, {k: str(v).lower() for k, v in method.options.items()})
        assert {k: getattr(cfg, k) for k in method.options} == method.options


def test_every_shipped_on_policy_preset_belongs_to_a_declared_method():
    presets = {p for a in ALGORITHMS.values() for p in a.presets}
    assert presets == {p for m in METHODS for p in m.presets}


def test_the_config_offers_exactly_the_policy_losses_and_aggregations_the_update_knows():
    import typing

    from rlhfkit.config import OnPolicyConfig
    from rlhfkit.policy_losses import AGGREGATIONS, POLICY_LOSSES

    hints = typing.get_type_hints(OnPolicyConfig)
    assert set(typing.get_args(hints["policy_loss"])) == set(POLICY_LOSSES)
    assert set(typing.get_args(hints["loss_aggregation"])) == set(AGGREGATIONS)
