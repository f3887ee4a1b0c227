"""The on-policy declarations: each command runs its own algorithm, and each published method's presets
set the options that make it."""

import dataclasses

import pytest
import torch

from rlhfkit import ops
from rlhfkit.config import resolve
from rlhfkit.config_onpolicy import PPOConfig
from rlhfkit.generation import RolloutBatch
from rlhfkit.onpolicy.advantages import ESTIMATORS
from rlhfkit.onpolicy.algorithms import ALGORITHMS, METHODS, algorithm_of
from rlhfkit.onpolicy.update import Objective
from rlhfkit.stages import STAGES


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_declaration_is_a_multi_process_command_whose_presets_build_its_config(name):
    algorithm = ALGORITHMS[name]
    stage = STAGES[name]
    assert (stage.config, stage.presets, stage.about, stage.multi_process) == (algorithm.config, algorithm.presets, algorithm.about, True)
    for preset in algorithm.presets:
        cfg = resolve(name, preset, None, {})
        assert algorithm_of(cfg) is algorithm and cfg.advantage_estimator in algorithm.estimators
    assert set(algorithm.estimators) <= set(ESTIMATORS)


def test_only_ppo_declares_a_value_model_and_reads_its_options_from_its_own_config():
    assert [name for name, a in ALGORITHMS.items() if a.needs_value_model] == ["ppo"]
    cfg = dataclasses.replace(PPOConfig(), value_model="v", vf_coef=0.3, value_clip_range=0.0)
    options = ALGORITHMS["ppo"].value(cfg)
    assert (options.source, options.coef, options.clip_range) == ("v", 0.3, 0.0)


def test_estimators_read_their_settings_from_the_config():
    rewards = torch.tensor([[0.1, 0.2, 1.0], [0.0, 0.5, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.1, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    cfg = dataclasses.replace(PPOConfig(), gamma=0.9, lam=0.8)
    batch = RolloutBatch(None, None, None, None, mask.bool(), None, values=values)
    for got, want in zip(ESTIMATORS["gae"](cfg, rewards, mask, batch, None), ops.gae(rewards, values, mask, 0.9, 0.8), strict=True):
        torch.testing.assert_close(got, want)
    groups = torch.tensor([0, 0])
    for scale in (True, False):
        grpo = dataclasses.replace(resolve("grpo", None, None, {}), scale_rewards=scale)
        advantages, _ = ESTIMATORS["grpo"](grpo, rewards, mask, batch, groups)
        per_row = ops.group_relative_advantages(rewards.sum(-1), groups, scale)
        torch.testing.assert_close(advantages, per_row.unsqueeze(1) * mask)


def test_the_objective_counts_tokens_or_sequences_and_drops_truncated_rows_when_asked():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    batch = RolloutBatch(None, None, None, torch.zeros(3, 3), mask, torch.tensor([True, True, False]))
    ppo, grpo = resolve("ppo", None, None, {}), resolve("grpo", None, None, {})
    assert Objective.of(ppo).units(batch).tolist() == [3.0, 1.0, 2.0]  # token-mean: each row's tokens
    assert Objective.of(grpo).units(batch).tolist() == [1.0, 1.0, 1.0]  # GRPO's sequence mean: one each
    dapo = resolve("grpo", "tldr-dapo", None, {})
    assert Objective.of(dapo).units(batch).tolist() == [3.0, 1.0, 0.0]  # the row cut without EOS takes no part
    assert Objective.of(resolve("grpo", "tldr-dr-grpo", None, {})).constant == 53.0  # max_response_length


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

    from rlhfkit.config_onpolicy import OnPolicyConfig
    from rlhfkit.policy_losses import AGGREGATIONS, POLICY_LOSSES

    hints = typing.get_type_hints(OnPolicyConfig)
    assert set(typing.get_args(hints["policy_loss"])) == set(POLICY_LOSSES)
    assert set(typing.get_args(hints["loss_aggregation"])) == set(AGGREGATIONS)
