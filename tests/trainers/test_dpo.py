"""DPO: equation 4 at step 0, cached reference log-probabilities, implicit-reward evaluation, resume;
the DPO family through the stage (IPO, cDPO, SimPO: step 0, options, the record rm-eval reads)."""

import json
import math
from types import MethodType

import pytest
import torch
import yaml

from rlhfkit.cli import main as cli_main
from rlhfkit.config import RMEvalConfig
from rlhfkit.data.collate import pad
from rlhfkit.data.examples import prepare_pairs
from rlhfkit.data.split import split_comparisons
from rlhfkit.errors import ConfigError
from rlhfkit.logprobs import plain_lm_head, sequence_logprobs
from rlhfkit.models import load_policy
from rlhfkit.preference_ops import PreferenceObjective
from rlhfkit.reward_eval.command import load_pair_scorer
from rlhfkit.reward_eval.evaluate import evaluate_reward_model
from rlhfkit.reward_models import DPO_RECORD, ImplicitRewardModel, recorded_objective
from rlhfkit.scoring import collate_pairs
from rlhfkit.stages import resolve
from rlhfkit.trainers import dpo

from ..support.launches import launch
from ..support.tiny import stage_args


def pairs_for(cfg, tokenizer):
    train_records, val_records, _ = split_comparisons(cfg.pair_selection)
    return prepare_pairs(cfg.lengths, tokenizer, train_records)[0], prepare_pairs(cfg.lengths, tokenizer, val_records)[
        0
    ]


def test_sequence_logprobs_do_not_depend_on_padding_side_or_batch_company(tiny_model):
    model, tok = tiny_model
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17]]
    prompt_lengths = [2, 1, 3]
    alone = []
    for row, q in zip(rows, prompt_lengths, strict=True):
        ids = torch.tensor([row])
        response = torch.zeros_like(ids, dtype=torch.bool)
        response[0, q:] = True
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        alone.append(sum(float(logits[t - 1, row[t]]) for t in range(q, len(row))))
    for side in ("right", "left"):
        ids, mask = pad(rows, tok.pad_token_id, side)
        response = torch.zeros_like(mask, dtype=torch.bool)
        for i, (row, q) in enumerate(zip(rows, prompt_lengths, strict=True)):
            start = 0 if side == "right" else ids.size(1) - len(row)
            response[i, start + q : start + len(row)] = True
        with torch.no_grad():
            got = sequence_logprobs(model, ids, mask, response)
        torch.testing.assert_close(got, torch.tensor(alone), atol=1e-4, rtol=1e-5, msg=side)


def test_right_padded_rows_take_the_causal_path_without_a_mask_and_left_padded_rows_keep_theirs(tiny_model):
    """Right padding comes after every real token, so causal attention alone hides it: the backbone gets no
    mask (SDPA's is_causal fast path) and the same log-probabilities as with the mask."""
    from rlhfkit.logprobs import target_logprobs

    model, tok = tiny_model
    rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    plain_lm_head(model)  # its one-time check calls the backbone first
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
    )
    got = {}
    try:
        for side in ("right", "left"):
            ids, mask = pad(rows, tok.pad_token_id, side)
            with torch.no_grad():
                got[side], _ = target_logprobs(model, ids, mask, mask[:, 1:].bool() & mask[:, :-1].bool())
    finally:
        hook.remove()
    assert seen[0] is None and seen[1] is not None
    torch.testing.assert_close(got["right"], got["left"], atol=1e-5, rtol=1e-5)


def test_a_dpo_step_with_the_policy_equal_to_the_reference_gives_log2_and_zero_rewards(
    tiny_model_dir, ppo_dirs, tmp_path
):
    # exact in fp32; the loss below runs outside autocast, so the cached reference must too
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, mixed_precision="no"))
    policy, tok = load_policy(str(tiny_model_dir))
    train_pairs, _ = pairs_for(cfg, tok)
    examples = dpo.reference_logprobs(
        policy, str(tiny_model_dir), train_pairs[:6], tok.pad_token_id, cfg, tmp_path / "ref.pt"
    )
    loss_sum, extras = dpo.make_dpo_loss(cfg.beta)(policy, dpo.collate_dpo(examples, tok.pad_token_id))
    assert loss_sum.item() / 6 == pytest.approx(math.log(2), abs=1e-5)
    for key in ("train/chosen_reward", "train/rejected_reward", "train/margin", "train/kl_chosen"):
        assert abs(extras[key].item()) < 1e-4, key
    assert extras["train/accuracy"].item() <= 6


def test_shared_pairs_give_the_loss_and_gradient_of_a_row_per_response(tiny_model_dir, ppo_dirs, tmp_path):
    """One row per pair, the query once (scoring.collate_shared_pairs), against chosen and rejected rows of their
    own: the same DPO loss, metrics and gradient on real TL;DR pairs, at fewer tokens."""
    from rlhfkit.trainers.supervised import count_tokens

    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, mixed_precision="no"))
    policy, tok = load_policy(str(tiny_model_dir))
    pairs = pairs_for(cfg, tok)[0][:6]
    torch.manual_seed(0)  # reference log-probabilities away from the policy's, so the loss is not log 2
    examples = [dpo.DPOExample(p, -40 + 10 * torch.rand(()).item(), -40 + 10 * torch.rand(()).item()) for p in pairs]
    results = {}
    for shared in (False, True):
        batch = dpo.collate_dpo(examples, tok.pad_token_id, shared)
        policy.zero_grad()
        loss_sum, extras = dpo.make_dpo_loss(cfg.beta)(policy, batch)
        loss_sum.backward()
        grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
        results[shared] = loss_sum.detach(), extras, grads, count_tokens(batch)
    (loss, extras, grads, tokens), (shared_loss, shared_extras, shared_grads, shared_tokens) = results.values()
    torch.testing.assert_close(shared_loss, loss, atol=1e-5, rtol=1e-5)
    for key, value in extras.items():
        torch.testing.assert_close(shared_extras[key], value, atol=1e-4, rtol=1e-5, msg=key)
    for name, grad in grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert shared_tokens == sum(p.packed_width() for p in pairs) < tokens == sum(
        2 * len(p.query.ids) + len(p.chosen) + len(p.rejected) for p in pairs
    )


def test_the_reference_pass_gives_the_same_log_probabilities_in_both_pair_layouts(tiny_model_dir, ppo_dirs, tmp_path):
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, mixed_precision="no"))
    policy, tok = load_policy(str(tiny_model_dir))
    pairs = pairs_for(cfg, tok)[0][:7]
    shared, apart = (
        dpo.pair_logprobs_all(policy, pairs, tok.pad_token_id, 3, "no", "reference", layout)
        for layout in ("auto", "off")
    )
    for got, expected in zip(shared, apart, strict=True):
        assert got == pytest.approx(expected, abs=1e-4)


def test_a_model_whose_attention_takes_no_mask_reads_a_row_per_response(tiny_model_dir, caplog):
    policy, _ = load_policy(str(tiny_model_dir))
    assert dpo.shares_queries(policy, "auto") and not dpo.shares_queries(policy, "off")
    other, _ = load_policy(str(tiny_model_dir))
    other.config._attn_implementation = "flash_attention_2"
    with caplog.at_level("WARNING"):
        assert not dpo.shares_queries(other, "auto")
    assert "flash_attention_2" in caplog.text and "unshared rows" in caplog.text


# the DPO family beside dpo, each with the options it needs
NEW_LOSS_TYPES = pytest.mark.parametrize(
    ("loss_type", "options"),
    # IPO in the default run; cDPO and SimPO, whose losses tests/ops/test_preference_ops.py checks by hand, with -m slow
    [
        ("ipo", {}),
        pytest.param("cdpo", {"label_smoothing": 0.1}, marks=pytest.mark.slow),
        pytest.param("simpo", {}, marks=pytest.mark.slow),
    ],
    ids=["ipo", "cdpo", "simpo"],
)
# with the policy equal to the reference (h = 0, beta 0.05): IPO (0 - 1/(2 beta))^2 = 1/(4 x 0.05^2) = 100;
# cDPO (1-eps) log 2 + eps log 2 = log 2
STEP_ZERO_LOSS = {"ipo": 1 / (4 * 0.05**2), "cdpo": math.log(2)}


@NEW_LOSS_TYPES
def test_step_zero_of_each_loss_type(loss_type, options, tiny_model_dir, ppo_dirs, tmp_path):
    """With the policy equal to the reference every log-ratio is 0: STEP_ZERO_LOSS, with zero rewards.
    SimPO has no reference: its rewards are beta/|y| log pi(y) of the starting policy, and its loss follows from
    them."""
    cfg = resolve(
        "dpo",
        "tldr-dpo",
        None,
        stage_args("dpo", ppo_dirs, tmp_path, loss_type=loss_type, mixed_precision="no", **options),
    )
    objective = dpo.preference_objective(cfg)
    policy, tok = load_policy(str(tiny_model_dir))
    pairs = pairs_for(cfg, tok)[0][:6]
    examples = (
        dpo.reference_logprobs(policy, str(tiny_model_dir), pairs, tok.pad_token_id, cfg, tmp_path / "ref.pt")
        if objective.uses_reference
        else dpo.without_reference(pairs)
    )
    batch = dpo.collate_dpo(examples, tok.pad_token_id)
    loss_sum, extras = dpo.make_dpo_loss(objective)(policy, batch)
    if loss_type == "simpo":
        assert "ref_chosen" not in batch and "train/kl_chosen" not in extras
        with torch.no_grad():
            chosen, rejected = dpo.pair_logprobs(policy, batch)
        lengths = torch.tensor([len(p.chosen) for p in pairs]), torch.tensor([len(p.rejected) for p in pairs])
        rewards = 2.0 * chosen / lengths[0], 2.0 * rejected / lengths[1]  # SimPO's published beta 2.0, gamma 1.0
        torch.testing.assert_close(extras["train/chosen_reward"], rewards[0].sum())
        torch.testing.assert_close(loss_sum, torch.nn.functional.softplus(-(rewards[0] - rewards[1] - 1.0)).sum())
        assert extras["train/chosen_reward"].item() < 0  # mean token log-probabilities, not log-ratios: not 0 at step 0
        return
    assert loss_sum.item() / 6 == pytest.approx(STEP_ZERO_LOSS[loss_type], rel=1e-5)
    for key in ("train/chosen_reward", "train/rejected_reward", "train/margin", "train/kl_chosen"):
        assert abs(extras[key].item()) < 1e-4, key


def test_reference_logprobs_are_computed_once_and_read_back(tiny_model_dir, ppo_dirs, tmp_path, monkeypatch):
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path))
    policy, tok = load_policy(str(tiny_model_dir))
    pairs = pairs_for(cfg, tok)[0][:5]
    cache = tmp_path / "ref.pt"
    first = dpo.reference_logprobs(policy, "ref", pairs, tok.pad_token_id, cfg, cache)

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("the reference log-probabilities were recomputed")

    monkeypatch.setattr(dpo, "pair_logprobs_all", must_not_run)
    again = dpo.reference_logprobs(policy, "ref", pairs, tok.pad_token_id, cfg, cache)
    assert [(e.ref_chosen, e.ref_rejected) for e in again] == [(e.ref_chosen, e.ref_rejected) for e in first]
    with pytest.raises(AssertionError, match="recomputed"):  # other pairs or another reference: not the cache's
        dpo.reference_logprobs(policy, "another-reference", pairs, tok.pad_token_id, cfg, cache)


def test_training_raises_the_margin_on_the_training_pairs(tiny_model_dir, ppo_dirs, tmp_path):
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, learning_rate=3e-3))
    policy, tok = load_policy(str(tiny_model_dir))
    examples = dpo.reference_logprobs(
        policy, "ref", pairs_for(cfg, tok)[0][:8], tok.pad_token_id, cfg, tmp_path / "ref.pt"
    )
    batch = dpo.collate_dpo(examples, tok.pad_token_id)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss_sum, extras = dpo.make_dpo_loss(cfg.beta)(policy, batch)
        (loss_sum / 8).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss_sum.item() / 8)
    assert losses[-1] < losses[0] and extras["train/margin"].item() > 0


def test_run_directory_evaluation_and_rm_eval_of_the_dpo_policy(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, out, eval_every=2, report_to="tensorboard"))
    assert dpo.run(cfg) == 0
    for name in [
        "config.yaml",
        "metrics.jsonl",
        "report.html",
        "model/model.safetensors",
        f"model/{DPO_RECORD}",
        dpo.REFERENCE_CACHE,
        f"validation_{dpo.REFERENCE_CACHE}",
        "rm_eval/rm_eval.json",
        "eval_samples.jsonl",
        "plots/rm_training.png",
    ]:
        assert (out / name).is_file(), name
    assert json.loads((out / "model" / DPO_RECORD).read_text())["loss_type"] == "dpo"
    assert yaml.safe_load((out / "resolved.yaml").read_text())["shared_prefix"] == {"policy": "on"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert (
        rows[0]["step"] == 0
        and rows[0]["val/accuracy"] == 0
        and rows[0]["val/loss"] == pytest.approx(math.log(2), abs=1e-5)
    )
    train_rows = [r for r in rows if "train/loss" in r]
    assert {"train/accuracy", "train/chosen_reward", "train/rejected_reward", "train/margin", "train/kl_chosen"} <= set(
        train_rows[0]
    )
    assert train_rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-5)
    final_val = rows[-1]["val/accuracy"]
    evaluation = json.loads((out / "rm_eval" / "rm_eval.json").read_text())
    overall = evaluation["breakdown"]["overall"]
    assert overall["accuracy"] == pytest.approx(final_val)  # the training-time validation and rm-eval agree
    # rm-eval reads the DPO policy as a reward model: its implicit reward (equation 5), reference and beta from the
    # record
    eval_out = tmp_path / "rm-eval"
    assert (
        cli_main(
            [
                "rm-eval",
                f"model={out / 'model'}",
                f"data={ppo_dirs['pairs']}",
                "side=validation",
                "validation_fraction=0.2",
                "max_query_length=128",
                "probes=",
                f"out={eval_out}",
            ]
        )
        == 0
    )
    again = json.loads((eval_out / "rm_eval.json").read_text())["breakdown"]["overall"]
    assert again["accuracy"] == pytest.approx(overall["accuracy"]) and again["count"] == overall["count"]
    assert "accuracy" in capsys.readouterr().out


@NEW_LOSS_TYPES
def test_each_loss_type_trains_and_rm_eval_scores_its_own_implicit_reward(
    loss_type, options, tiny_model_dir, ppo_dirs, tmp_path, monkeypatch
):
    """One step of each loss type through the stage: the implicit-reward metrics are logged, the model
    folder records the loss, and rm-eval's loader scores the saved policy with that loss's reward."""
    out = tmp_path / "run"
    # one step of 4 pairs, a few validation pairs, short queries and responses: the final rm-eval's forward passes
    # dominate
    fast = {
        "max_steps": 1,
        "total_batch_size": 4,
        "validation_fraction": 0.1,
        "max_query_length": 96,
        "max_response_length": 48,
        "eval_pairs": 4,
        "eval_every": 1,
        "eval_samples": int(loss_type == "simpo"),
        "mixed_precision": "no",
    }
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, out, loss_type=loss_type, **fast, **options))
    if loss_type == "simpo":  # no reference: not one reference forward pass
        monkeypatch.setattr(
            dpo, "reference_logprobs", lambda *a, **k: pytest.fail("SimPO computed reference log-probabilities")
        )
        monkeypatch.setattr(
            dpo, "visited_with_reference", lambda *a, **k: pytest.fail("SimPO computed reference log-probabilities")
        )
    assert dpo.run(cfg) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_row = next(r for r in rows if "train/loss" in r)
    val_row = next(r for r in rows if "val/loss" in r)
    reward_metrics = {"accuracy", "chosen_reward", "rejected_reward", "margin"} | (
        {"kl_chosen"} if loss_type != "simpo" else set()
    )
    for prefix, row in (("train", train_row), ("val", val_row)):
        assert {f"{prefix}/{name}" for name in reward_metrics} <= set(row), prefix
        assert (f"{prefix}/kl_chosen" in row) == (loss_type != "simpo"), prefix
    if loss_type in STEP_ZERO_LOSS:
        assert val_row["step"] == 0 and val_row["val/loss"] == pytest.approx(STEP_ZERO_LOSS[loss_type], rel=1e-5)
        assert abs(val_row["val/margin"]) < 1e-6 and val_row["val/accuracy"] == 0
    assert (out / dpo.REFERENCE_CACHE).is_file() == (loss_type != "simpo")
    record = json.loads((out / "model" / DPO_RECORD).read_text())
    expected = {
        "ipo": {"loss_type": "ipo", "beta": 0.05, "label_smoothing": 0.0, "simpo_gamma": 0.0},
        "cdpo": {"loss_type": "cdpo", "beta": 0.05, "label_smoothing": 0.1, "simpo_gamma": 0.0},
        "simpo": {"loss_type": "simpo", "beta": 2.0, "label_smoothing": 0.0, "simpo_gamma": 1.0},
    }[loss_type]
    assert {k: record[k] for k in expected} == expected and ("reference_model" in record) == (loss_type != "simpo")
    assert (out / "rm_eval" / "rm_eval.json").is_file() and len(
        (out / "eval_samples.jsonl").read_text().splitlines()
    ) == cfg.eval_samples

    scorer, tok = load_pair_scorer(RMEvalConfig(model=str(out / "model")))
    assert scorer.objective.loss_type == loss_type and (scorer.reference is None) == (loss_type == "simpo")
    pairs = pairs_for(cfg, tok)[1][:3]
    batch = collate_pairs(pairs, tok.pad_token_id)
    policy, reference = load_policy(str(out / "model"))[0], load_policy(str(tiny_model_dir))[0]
    with torch.no_grad():
        scores = scorer(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        logps = sequence_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        ref_logps = sequence_logprobs(reference, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    lengths = torch.tensor([len(p.chosen) for p in pairs] + [len(p.rejected) for p in pairs])
    # SimPO: 2.0 x log pi / |y|; IPO, cDPO: equation 5, 0.05 x (log pi - log pi_ref)
    want = 2.0 * logps / lengths if loss_type == "simpo" else 0.05 * (logps - ref_logps)
    torch.testing.assert_close(scores, want.float(), atol=1e-5, rtol=1e-5)


def test_rm_eval_refuses_a_plain_policy_without_reference_and_beta(tiny_model_dir, ppo_dirs, tmp_path, capsys):
    assert (
        cli_main(["rm-eval", f"model={tiny_model_dir}", f"data={ppo_dirs['pairs']}", "probes=", f"out={tmp_path}"]) == 2
    )
    err = capsys.readouterr().err
    assert "not a reward" in err or "neither a reward model" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        (
            "tldr-dpo",
            {
                "num_epochs": 1,
                "adam_eps": 1e-5,
                "learning_rate": 3e-6,
                "lr_scheduler": "cosine",
                "total_batch_size": 64,
                "beta": 0.05,
            },
        ),
        ("hh-dpo", {"beta": 0.1, "learning_rate": 5e-7, "num_epochs": 1, "total_batch_size": 4, "data_format": "hh"}),
    ],
)
def test_dpo_presets(preset, expected):
    cfg = resolve("dpo", preset, None, {})
    assert {k: getattr(cfg, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"loss_type": "cdpo"}, r"needs label_smoothing in \(0, 0.5\)"),  # eps 0 would be plain dpo under another name
        ({"loss_type": "cdpo", "label_smoothing": 0.5}, r"needs label_smoothing in \(0, 0.5\)"),
        ({"loss_type": "cdpo", "label_smoothing": -0.1}, "must be >= 0"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "only applies to loss_type=cdpo"),
        ({"loss_type": "simpo", "reference_model": "another-policy"}, "uses no reference model"),
    ],
)
def test_preference_loss_options_are_checked_as_the_config_resolves(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve("dpo", "tldr-dpo", None, options)


def test_simpo_takes_its_own_published_beta_and_gamma_whatever_the_dpo_preset():
    # tldr-dpo sets beta 0.05 (Table 6); SimPO's weights are the Llama-3-Base setup of Meng et al. 2024
    assert dpo.preference_objective(resolve("dpo", "tldr-dpo", None, {"loss_type": "simpo"})) == PreferenceObjective(
        "simpo", 2.0, simpo_gamma=1.0
    )
    assert dpo.preference_objective(
        resolve("dpo", "tldr-dpo", None, {"loss_type": "cdpo", "label_smoothing": 0.1})
    ) == (PreferenceObjective("cdpo", 0.05, label_smoothing=0.1))


def test_a_record_without_a_loss_type_is_dpo_and_rm_eval_beta_replaces_the_recorded_one():
    old = {"reference_model": "/some/sft", "beta": 0.05}  # what rlhfkit dpo wrote before the DPO family
    assert recorded_objective(old, 0.0) == PreferenceObjective("dpo", 0.05)
    assert recorded_objective(
        {**old, "loss_type": "simpo", "beta": 2.0, "simpo_gamma": 1.0}, 2.5
    ) == PreferenceObjective("simpo", 2.5, simpo_gamma=1.0)


@pytest.mark.parametrize("loss_type", ["dpo", "simpo"])
def test_implicit_reward_accuracy_breaks_down_like_a_reward_models(loss_type, tiny_model_dir, ppo_dirs, tmp_path):
    """Same pairs through the reward-model evaluation: accuracy equals the sign agreement of the
    validation's implicit rewards (equation 5; SimPO's beta/|y| log pi, with no reference)."""
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, loss_type=loss_type))
    objective = dpo.preference_objective(cfg)
    policy, tok = load_policy(str(tiny_model_dir))
    reference = load_policy(str(tiny_model_dir))[0] if objective.uses_reference else None
    with torch.no_grad():
        policy.model.embed_tokens.weight.add_(0.05 * torch.randn_like(policy.model.embed_tokens.weight))
    _, val_pairs = pairs_for(cfg, tok)
    examples = (
        dpo.reference_logprobs(reference, "ref", val_pairs, tok.pad_token_id, cfg, tmp_path / "ref.pt")
        if objective.uses_reference
        else dpo.without_reference(val_pairs)
    )
    out = dpo.held_out_loss(policy, examples, tok.pad_token_id, cfg, objective)
    result = evaluate_reward_model(
        ImplicitRewardModel(policy, reference, objective),
        tok,
        val_pairs,
        tmp_path / "eval",
        batch_size=4,
        probes="",
        limits={"tldr": 128, "hh": 128, "cnndm": 128},
    )
    assert result["breakdown"]["overall"]["accuracy"] == pytest.approx(
        float((out.chosen_rewards > out.rejected_rewards).double().mean())
    )


def test_two_processes_train_like_one(ppo_dirs, one_process_run, tmp_path):
    """total_batch_size = micro batch x accumulation x processes; the DDP path of the log-probabilities
    (full logits, not the backbone called around DDP) gives the same weights as one process."""
    from safetensors.torch import load_file

    exact = {"max_steps": 2, "eval_samples": 0, "eval_pairs": 4, "mixed_precision": "no"}  # bf16 rounds otherwise
    runs = {1: one_process_run("dpo", stage_args("dpo", ppo_dirs, None, micro_batch_size=4, **exact))}
    runs[2] = tmp_path / "two"
    proc = launch("dpo", stage_args("dpo", ppo_dirs, runs[2], micro_batch_size=2, **exact), 2)
    assert proc.returncode == 0, proc.stderr[-3000:]

    a, b = load_file(runs[1] / "model" / "model.safetensors"), load_file(runs[2] / "model" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-6, rtol=1e-4)


def test_the_lm_head_check_holds_under_accelerates_bf16_wrapper(tiny_model_dir):
    """accelerate's mixed precision replaces the forward with one that runs under its own bf16 autocast and
    returns fp32 logits (Accelerator.prepare_model); the exactness check of the chunked log-probability
    path must not trip over it, or every bf16 SFT and DPO step would form the full (B, L, vocab) logits."""
    from accelerate.utils import convert_outputs_to_fp32

    model, _ = load_policy(str(tiny_model_dir))
    bf16_forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__)
    model.forward = MethodType(convert_outputs_to_fp32(bf16_forward), model)  # as accelerate does it
    ids = torch.arange(5).unsqueeze(0)
    assert not torch.allclose(model(input_ids=ids).logits, type(model).forward(model, input_ids=ids).logits, atol=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain_lm_head(model) is model.get_output_embeddings()


def test_reference_log_probabilities_cover_exactly_the_pairs_the_run_visits(
    tiny_model_dir, ppo_dirs, tmp_path, monkeypatch
):
    """max_steps=1 with batch 8 reaches 8 training pairs: only those pay a reference forward pass."""
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, max_steps=1))
    policy, tok = load_policy(str(tiny_model_dir))
    train_pairs, _ = pairs_for(cfg, tok)
    counted = []
    original = dpo.pair_logprobs_all
    monkeypatch.setattr(
        dpo, "pair_logprobs_all", lambda model, pairs, *a: counted.append(len(pairs)) or original(model, pairs, *a)
    )
    examples = dpo.visited_with_reference(policy, "ref", train_pairs, tok.pad_token_id, cfg, tmp_path / "ref.pt")
    assert counted == [8] and len(examples) == len(train_pairs) > 8
    from rlhfkit.trainers.supervised import batch_indices, plan_schedule

    micro_batches = batch_indices(plan_schedule(cfg, len(train_pairs), 1), cfg.seed, 0, 0)
    visited = {i for micro in micro_batches for i in micro}
    assert {i for i, e in enumerate(examples) if not math.isnan(e.ref_chosen)} == visited
    with pytest.raises(RuntimeError, match="no reference log-probability"):
        dpo.collate_dpo([e for i, e in enumerate(examples) if i not in visited][:2], tok.pad_token_id)
