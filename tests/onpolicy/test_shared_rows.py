"""Shared-prefix rows (rlhfkit/shared_rows.py): a group's query read once, and every number the same.

A group of G responses to one query is one row under a mask where each response sees the query and
itself only; log-probabilities, entropies, values, reward scores and the update's gradient must equal
those of the unshared rows (fp32, summation order aside) for every grouped method and aggregation, on
1 and 2 processes, with LoRA; a model that cannot take the mask keeps unshared rows and says why.
"""

import dataclasses
import logging

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from rlhfkit.config import GRPOConfig, LoraOptions
from rlhfkit.onpolicy.algorithms import METHODS
from rlhfkit.onpolicy.scoring import (
    OnPolicyModels,
    RowLayout,
    pack_rollout,
    policy_logprobs,
    reward_scores,
    value_estimates,
)
from rlhfkit.onpolicy.update import group_order, micro_batch_plan
from rlhfkit.policy_losses import AGGREGATIONS
from rlhfkit.reward_models import ScalarModel
from rlhfkit.shared_rows import OBSTACLE_CHECKED, pack_groups, shared_rows_obstacle
from rlhfkit.tracking import read_metrics

from ..support.gradients import (
    assert_same_gradient,
    k1_reuse_worker,
    k1_update,
    one_update_gradient,
    split_invariance_worker,
    synthetic_rollout,
)
from ..support.launches import run_in_this_process
from ..support.processes import free_port
from ..support.tiny import stage_args

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def policy_and_rollout(tiny_model_dir, attention="sdpa", group=4):
    from rlhfkit.models import load_policy

    policy, tokenizer = load_policy(str(tiny_model_dir))
    policy.config._attn_implementation = attention
    return policy, tokenizer, synthetic_rollout(policy, tokenizer.pad_token_id, 0.7, group=group)


def test_pack_groups_restarts_positions_and_lets_each_response_see_only_the_query_and_itself():
    pad = 0
    query_ids = torch.tensor([[pad, 11, 12]] * 2 + [[21, 22, 23]] * 2)
    query_mask = (query_ids != pad).long()
    responses = torch.tensor([[31, 32, pad], [41, pad, pad], [51, 52, 53], [61, 62, pad]])
    mask = responses != pad
    shared = pack_groups(query_ids, query_mask, responses, mask, group=2)
    assert shared.input_ids.shape == (2, 8)  # the second group's 3 + 3 + 2 tokens; no padding inside a row
    assert shared.input_ids[0, :5].tolist() == [11, 12, 31, 32, 41]
    assert shared.input_ids[1].tolist() == [21, 22, 23, 51, 52, 53, 61, 62]
    assert shared.position_ids[0, :5].tolist() == [0, 1, 2, 3, 2]  # the second response restarts after the query
    assert shared.position_ids[1].tolist() == [0, 1, 2, 3, 4, 5, 3, 4]
    sees = shared.sees[1, 0]
    assert sees[6].tolist() == [True, True, True, False, False, False, True, False]  # 61: query and itself
    assert sees[7].tolist() == [True, True, True, False, False, False, True, True]
    assert sees[4].tolist() == [True, True, True, True, True, False, False, False]  # 52 never sees 61, 62
    assert not shared.sees[0, 0, :5, 5].any() and shared.sees[0, 0, 5, 5]  # nothing sees padding; it sees itself
    # the first token of each response is predicted by the query's last column, the rest by the token before
    assert shared.predictors.view(2, 2, 3)[1].tolist() == [[2, 3, 4], [2, 6, 0]]
    assert shared.tokens.view(2, 2, 3)[1].tolist() == [[3, 4, 5], [6, 7, 0]]
    assert shared.eos_index.tolist() == [[3, 4], [5, 7]]


def test_pack_groups_refuses_rows_that_are_not_one_prompts_samples():
    query_ids = torch.tensor([[1, 2], [1, 3]])
    with pytest.raises(ValueError, match="not one prompt's samples"):
        pack_groups(query_ids, torch.ones_like(query_ids), torch.tensor([[4], [5]]), torch.ones(2, 1, dtype=bool), 2)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("head_path", ["plain head", "model logits"])
def test_shared_logprobs_and_entropies_equal_unshared_rows(tiny_model_dir, attention, head_path, monkeypatch):
    policy, _, batch = policy_and_rollout(tiny_model_dir, attention)
    if head_path == "model logits":  # the path DDP, FSDP and DeepSpeed take
        from rlhfkit import logprobs

        monkeypatch.setattr(logprobs, "plain_lm_head", lambda model: None)
    with torch.no_grad():
        want = policy_logprobs(policy, batch, 0.7)
        got = policy_logprobs(policy, batch, 0.7, pack_rollout(batch, 4))
    for name, a, b in zip(("logprobs", "entropy"), got, want, strict=True):
        torch.testing.assert_close(a[batch.mask], b[batch.mask], **TOLERANCE, msg=name)


def test_a_mask_that_lets_responses_see_each_other_changes_the_logprobs(tiny_model_dir, monkeypatch):
    """The equality above has teeth: seeing the group's other responses moves the numbers."""
    from rlhfkit import shared_rows

    policy, _, batch = policy_and_rollout(tiny_model_dir)
    with torch.no_grad():
        want = policy_logprobs(policy, batch, 0.7)[0]

        def causal_only(segments):
            width = segments.size(1)
            return torch.ones(width, width, dtype=torch.bool).tril().expand(len(segments), -1, -1)

        monkeypatch.setattr(shared_rows, "block_sees", causal_only)
        leaky = policy_logprobs(policy, batch, 0.7, pack_rollout(batch, 4))[0]
    assert (leaky - want)[batch.mask].abs().max() > 1e-3


@pytest.mark.parametrize("head", ["eos-linear", "mean-mlp"])
def test_shared_reward_scores_and_values_equal_unshared_rows(tiny_model_dir, head):
    from rlhfkit.models import load_policy

    policy, _, batch = policy_and_rollout(tiny_model_dir)
    torch.manual_seed(0)
    scalar = ScalarModel.from_policy(load_policy(str(tiny_model_dir))[0], head=head).eval()
    shared = pack_rollout(batch, 4)
    with torch.no_grad():
        torch.testing.assert_close(reward_scores(scalar, batch, shared), reward_scores(scalar, batch), **TOLERANCE)
        if head == "eos-linear":
            got, want = value_estimates(scalar, batch, shared), value_estimates(scalar, batch)
            torch.testing.assert_close(got[batch.mask], want[batch.mask], **TOLERANCE)


def test_lora_policy_and_its_adapter_disabled_reference_read_shared_rows_alike(tiny_model_dir):
    from rlhfkit.adapters import AdapterDisabled, add_adapter

    policy, _, batch = policy_and_rollout(tiny_model_dir)
    policy = add_adapter(policy, LoraOptions(rank=4, alpha=8, dropout=0.0, target_modules=[]))
    generator = torch.Generator().manual_seed(0)
    for name, param in policy.named_parameters():
        if "lora_B" in name:  # zero at creation: give the adapter values, as training would
            param.data = torch.randn(param.shape, generator=generator) * 0.1
    reference = AdapterDisabled(policy)
    shared = pack_rollout(batch, 4)
    for model in (policy, reference):
        with torch.no_grad():
            got, want = policy_logprobs(model, batch, 0.7, shared)[0], policy_logprobs(model, batch, 0.7)[0]
        torch.testing.assert_close(got[batch.mask], want[batch.mask], **TOLERANCE)
    assert shared_rows_obstacle(policy) is None and shared_rows_obstacle(reference) is None
    with torch.no_grad():
        apart = policy_logprobs(policy, batch, 0.7, shared)[0] - policy_logprobs(reference, batch, 0.7, shared)[0]
    assert apart[batch.mask].abs().max() > 1e-3  # the adapter is really off in the reference


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_a_lora_adapter_gets_the_same_update_from_shared_rows(tiny_model_dir, aggregation):
    options = {"loss_aggregation": aggregation}
    unshared = one_update_gradient(tiny_model_dir, options | {"shared_prefix": "off"}, 8, lora_rank=4)
    assert unshared and all("lora_" in name for name in unshared)
    assert_same_gradient(one_update_gradient(tiny_model_dir, options, 4, lora_rank=4), unshared, f"LoRA, {aggregation}")


GROUPED = [m for m in METHODS if m.name not in ("ppo", "reinforce-pp")]  # ReMax included: G > 1 is allowed
UPDATE_FIELDS = {f.name for f in dataclasses.fields(GRPOConfig)}


def method_options(method, aggregation):
    options = {k: v for k, v in method.options.items() if k in UPDATE_FIELDS and k != "advantage_estimator"}
    return options | {"loss_aggregation": aggregation}


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("method", GROUPED, ids=lambda m: m.name)
def test_every_grouped_method_and_aggregation_makes_the_same_update_with_shared_rows(
    tiny_model_dir, method, aggregation, caplog
):
    options = method_options(method, aggregation)
    unshared = one_update_gradient(tiny_model_dir, options | {"shared_prefix": "off"}, micro_batch_size=8)
    with caplog.at_level(logging.WARNING):
        for micro in (8, 4):
            shared = one_update_gradient(tiny_model_dir, options, micro_batch_size=micro)
            assert_same_gradient(shared, unshared, f"{method.name}, {aggregation}, micro-batches of {micro}")
    assert "unshared rows" not in caplog.text  # every pass above read shared rows


def test_shared_rows_on_two_gloo_processes_make_the_update_of_one_unshared_process(tiny_model_dir, tmp_path):
    cases = [{"loss_aggregation": a} for a in AGGREGATIONS]
    out = tmp_path / "gradients.pt"
    mp.start_processes(
        split_invariance_worker,
        args=(2, free_port(), str(tiny_model_dir), cases, 4, str(out)),  # one group of 4 per process
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    for case, gradient in zip(cases, torch.load(out, weights_only=True), strict=True):
        one = one_update_gradient(tiny_model_dir, case | {"shared_prefix": "off"}, micro_batch_size=8)
        assert_same_gradient(gradient, one, f"2 processes, shared rows, {case}")


class FakeProcesses:
    def __init__(self, rank, processes):
        self.process_index, self.num_processes = rank, processes


def test_micro_batches_and_process_shares_never_split_a_group():
    rng = np.random.default_rng(0)
    order = group_order(rng, 32, 4)
    assert sorted(order.tolist()) == list(range(32))
    for minibatch in (order[:16], order[16:]):
        for rank in (0, 1):
            plan = micro_batch_plan(minibatch, 32, 8, FakeProcesses(rank, 2), lockstep=True, group=4)
            for rows, _ in plan:
                assert len(rows) % 4 == 0 and all(len(set(chunk // 4)) == 1 for chunk in np.split(rows, len(rows) // 4))
    assert np.array_equal(group_order(np.random.default_rng(3), 8, 1), np.random.default_rng(3).permutation(8))


def models_of(policy, tokenizer):
    return OnPolicyModels(policy, policy, None, None, tokenizer)


def layout_and_log(policy, tokenizer, caplog, **options):
    cfg = dataclasses.replace(GRPOConfig(), **options)
    with caplog.at_level(logging.WARNING, logger="rlhfkit.shared_rows"):
        layout = RowLayout.of(
            models_of(policy, tokenizer), cfg.shared_prefix, cfg.samples_per_prompt, cfg.micro_batch_size,
            "micro_batch_size",
        )
    return layout, caplog.text


class NoPositions(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.config = model.config

    def forward(self, input_ids=None, attention_mask=None):
        raise AssertionError("never called: the signature alone rules it out")


@pytest.mark.parametrize(
    "obstacle", ["flash_attention_2", "sliding window", "no position_ids", "ignores the mask", "splits a group"]
)
def test_a_model_or_config_that_cannot_share_falls_back_to_unshared_rows_and_says_why(
    tiny_model_dir, obstacle, caplog
):
    policy, tokenizer, batch = policy_and_rollout(tiny_model_dir)
    options, reason = {"micro_batch_size": 8}, None
    if obstacle == "flash_attention_2":
        policy.config._attn_implementation, reason = "flash_attention_2", "'flash_attention_2' takes no custom 4-D mask"
    elif obstacle == "sliding window":
        policy.config.sliding_window, reason = 16, "sliding-window layers"
    elif obstacle == "no position_ids":
        assert shared_rows_obstacle(NoPositions(policy)) == (
            "NoPositions.forward takes no position_ids, so a response's positions cannot restart"
        )
        return
    elif obstacle == "ignores the mask":
        backbone_forward = policy.model.forward
        policy.model.forward = lambda **kw: backbone_forward(**{**kw, "attention_mask": None})
        reason = "a probe's shared row differed from its unshared rows"
    else:
        options, reason = {"micro_batch_size": 6}, "micro_batch_size=6 is not a multiple of samples_per_prompt=4"
    layout, logged = layout_and_log(policy, tokenizer, caplog, **options)
    assert not layout.policy and reason in logged and "unshared rows" in logged
    assert policy.__dict__[OBSTACLE_CHECKED] is None if obstacle == "splits a group" else reason in policy.__dict__[
        OBSTACLE_CHECKED]
    layout, _ = layout_and_log(policy, tokenizer, caplog, shared_prefix="off", micro_batch_size=8)
    assert not layout


def test_shared_prefix_off_and_ppo_read_unshared_rows_without_a_word(tiny_model_dir, caplog):
    policy, tokenizer, _ = policy_and_rollout(tiny_model_dir)
    for options in ({"shared_prefix": "off"}, {"samples_per_prompt": 1}):
        layout, logged = layout_and_log(policy, tokenizer, caplog, micro_batch_size=8, **options)
        assert not layout and logged == ""
    assert layout_and_log(policy, tokenizer, caplog, micro_batch_size=8)[0].policy


# ---------------------------------------------------------------- K = 1: the update's own forward


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_k1_old_logprobs_from_the_update_forward_make_the_same_update(tiny_model_dir, aggregation):
    separate = k1_update(tiny_model_dir, reuse=False, options={"loss_aggregation": aggregation})
    reused = k1_update(tiny_model_dir, reuse=True, options={"loss_aggregation": aggregation})
    assert_same_gradient(reused[0], separate[0], f"K=1, {aggregation}")
    torch.testing.assert_close(reused[2], separate[2], atol=1e-6, rtol=1e-6)
    assert reused[1]["val/ratio"] == 1.0 and reused[1]["policy/clipfrac_avg"] == 0
    for key in ("loss/policy_avg", "loss/kl_avg", "policy/entropy_avg", "val/ratio"):
        assert reused[1][key] == pytest.approx(separate[1][key], abs=1e-6), key


def test_k1_reuse_on_two_gloo_processes_makes_one_processs_update_and_gives_every_row(tiny_model_dir, tmp_path):
    """Each process fills its own rows' old log-probabilities; summed across processes, every process
    holds every row, as the trainer's KL and entropy metrics need."""
    out = tmp_path / "k1.pt"
    mp.start_processes(
        k1_reuse_worker, args=(2, free_port(), str(tiny_model_dir), str(out)), nprocs=2, start_method="spawn", join=True
    )
    gradient, old = torch.load(out, weights_only=True)
    separate, _, logprobs = k1_update(tiny_model_dir, reuse=False)
    assert_same_gradient(gradient, separate, "K=1 reuse on 2 processes")
    assert (old != 0).sum(-1).tolist() == logprobs.ne(0).sum(-1).tolist()  # every row filled, on process 0 too
    torch.testing.assert_close(old, logprobs, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("reuse", [True, False])
def test_an_update_refuses_a_rollout_whose_old_logprobs_disagree_with_its_plan(tiny_model_dir, reuse):
    """The run's plan says where the old log-probabilities come from, never whether a rollout has them:
    a rollout with them where the update's forward gives them, or without them where scoring does, is
    refused before any forward."""
    from rlhfkit.onpolicy.trainer import update_plan
    from rlhfkit.onpolicy.update import Optimizers, update_on_rollout

    policy, tokenizer, batch = policy_and_rollout(tiny_model_dir)
    models = OnPolicyModels(policy, policy, None, None, tokenizer)
    cfg = dataclasses.replace(GRPOConfig(), update_epochs=1, micro_batch_size=4, max_response_length=6,
                              reuse_update_forward=reuse)
    plan = update_plan(models, cfg, "no")
    assert plan.old_logprobs == ("update" if reuse else "scoring")
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    disagreeing = batch if reuse else dataclasses.replace(batch, logprobs=None)
    with pytest.raises(ValueError, match="the plan takes them from"):
        update_on_rollout(models=models, optimizers=optimizers, batch=disagreeing, plan=plan, update=1, kl_coef=0.1)
    assert all(torch.equal(v, before[k]) for k, v in policy.named_parameters())


@pytest.mark.parametrize(
    "options, reuses",
    [
        ({"update_epochs": 1}, True),
        ({"update_epochs": 4}, True),  # the first epoch's forwards all precede the one step per epoch
        ({"update_epochs": 4, "num_minibatches": 2}, False),
        ({"update_epochs": 1, "num_minibatches": 2}, False),
        ({"update_epochs": 1, "kl_placement": "reward"}, False),
        ({"update_epochs": 1, "kl_placement": "reward", "kl_coef": 0.0}, True),
        ({"update_epochs": 1, "reuse_update_forward": False}, False),
    ],
)
def test_scoring_leaves_the_old_logprobs_to_the_update_only_where_they_would_be_the_same(
    tiny_model_dir, options, reuses
):
    from rlhfkit.onpolicy.scoring import score_rollout
    from rlhfkit.onpolicy.trainer import scoring_plan

    policy, tokenizer, batch = policy_and_rollout(tiny_model_dir)
    scalar = ScalarModel.from_policy(policy).eval()
    models = OnPolicyModels(policy, policy, scalar, None, tokenizer)
    cfg = dataclasses.replace(GRPOConfig(), forward_batch_size=4, max_response_length=6, **options)
    plan = scoring_plan(models, cfg)
    assert plan.old_logprobs == ("update" if reuses else "scoring")
    bare = dataclasses.replace(batch, logprobs=None, ref_logprobs=None, advantages=None)
    scored = score_rollout(models, bare, plan, "no")
    assert (scored.logprobs is None) == reuses and scored.ref_logprobs is not None


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_grpo_run_with_the_update_forward_logs_and_trains_as_one_with_a_scoring_pass(ppo_dirs, tmp_path, epochs):
    """The trainer's side of reuse: KL, entropy and every loss are logged from the update's own
    log-probabilities after the update, and the weights end where a separate pass takes them; at K = 2 the
    second epoch's ratios are to what the first epoch's forwards gave."""
    runs = {}
    for reuse in (True, False):
        args = stage_args("grpo", ppo_dirs, tmp_path / str(reuse), update_epochs=epochs, eos_trick="false",
                          reuse_update_forward=str(reuse).lower())
        runs[reuse] = run_in_this_process("grpo", args)
    rows = {reuse: read_metrics(run) for reuse, run in runs.items()}
    assert len(rows[True]) == len(rows[False]) == 2
    for reused, separate in zip(rows[True], rows[False], strict=True):
        assert reused["val/ratio"] == 1.0 if epochs == 1 else reused["val/ratio"] != 1.0
        for key in ("objective/kl", "objective/entropy", "objective/scores", "loss/policy_avg", "loss/kl_avg"):
            assert reused[key] == pytest.approx(separate[key], rel=1e-4, abs=1e-5), key
    assert rows[True][0]["objective/kl"] == 0 and rows[True][1]["objective/kl"] != 0
    a, b = (load_file(run / "model" / "model.safetensors") for run in (runs[True], runs[False]))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
