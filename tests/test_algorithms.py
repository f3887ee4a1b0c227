"""The on-policy algorithm declarations: each stage runs its own algorithm, read through typed fields."""

import dataclasses

import pytest
import torch

from rlhfkit import ops
from rlhfkit.config import resolve
from rlhfkit.config_onpolicy import PPOConfig
from rlhfkit.onpolicy.algorithms import ALGORITHMS, algorithm_of
from rlhfkit.onpolicy.update import ESTIMATORS, loss_units
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
    for got, want in zip(ESTIMATORS["gae"](cfg, rewards, mask, values, None), ops.gae(rewards, values, mask, 0.9, 0.8), strict=True):
        torch.testing.assert_close(got, want)
    groups = torch.tensor([0, 0])
    for scale in (True, False):
        grpo = dataclasses.replace(resolve("grpo", None, None, {}), scale_rewards=scale)
        advantages, _ = ESTIMATORS["grpo"](grpo, rewards, mask, None, groups)
        per_row = ops.group_relative_advantages(rewards.sum(-1), groups, scale)
        torch.testing.assert_close(advantages, per_row.unsqueeze(1) * mask)


def test_token_mean_aggregation_weighs_each_row_by_its_response_tokens():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert loss_units(ALGORITHMS["grpo"], mask).tolist() == [3.0, 1.0]
