"""DPO (issue 8): equation 4 at step 0, cached reference log-probabilities, implicit-reward evaluation, resume."""

import json
import math

import numpy as np
import pytest
import torch

from rlhfkit import generation as rollout
from rlhfkit.cli import main as cli_main
from rlhfkit.config import resolve
from rlhfkit.data.collate import pad
from rlhfkit.data.examples import prepare_pairs
from rlhfkit.data.split import split_comparisons
from rlhfkit.eval.rm_eval import evaluate_reward_model
from rlhfkit.models import DPO_RECORD, load_policy
from rlhfkit.trainers import dpo

from .helpers import (
    assert_same_files,
    assert_same_metrics,
    cli_args,
    launcher_env,
    rlhfkit_command,
    stage_args,
    straight_and_resumed,
)


def pairs_for(cfg, tokenizer):
    train_records, val_records, _ = split_comparisons(cfg)
    return prepare_pairs(cfg, tokenizer, train_records)[0], prepare_pairs(cfg, tokenizer, val_records)[0]


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
            got = rollout.sequence_logprobs(model, ids, mask, response)
        torch.testing.assert_close(got, torch.tensor(alone), atol=1e-4, rtol=1e-5, msg=side)


def test_a_dpo_step_with_the_policy_equal_to_the_reference_gives_log2_and_zero_rewards(tiny_model_dir, ppo_dirs, tmp_path):
    # exact in fp32; the loss below runs outside autocast, so the cached reference must too
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, mixed_precision="no"))
    policy, tok = load_policy(str(tiny_model_dir))
    train_pairs, _ = pairs_for(cfg, tok)
    examples = dpo.reference_logprobs(policy, str(tiny_model_dir), train_pairs[:6], tok.pad_token_id, cfg, tmp_path / "ref.pt")
    loss_sum, extras = dpo.make_dpo_loss(cfg.beta)(policy, dpo.collate_dpo(examples, tok.pad_token_id))
    assert loss_sum.item() / 6 == pytest.approx(math.log(2), abs=1e-5)
    for key in ("train/chosen_reward", "train/rejected_reward", "train/margin", "train/kl_chosen"):
        assert abs(extras[key].item()) < 1e-4, key
    assert extras["train/accuracy"].item() <= 6


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
    examples = dpo.reference_logprobs(policy, "ref", pairs_for(cfg, tok)[0][:8], tok.pad_token_id, cfg, tmp_path / "ref.pt")
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
    for name in ["config.yaml", "metrics.jsonl", "report.html", "model/model.safetensors", f"model/{DPO_RECORD}",
                 dpo.REFERENCE_CACHE, f"validation_{dpo.REFERENCE_CACHE}", "rm_eval/rm_eval.json", "eval_samples.jsonl",
                 "plots/rm_training.png"]:
        assert (out / name).is_file(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and rows[0]["val/accuracy"] == 0 and rows[0]["val/loss"] == pytest.approx(math.log(2), abs=1e-5)
    train_rows = [r for r in rows if "train/loss" in r]
    assert {"train/accuracy", "train/chosen_reward", "train/rejected_reward", "train/margin", "train/kl_chosen"} <= set(train_rows[0])
    assert train_rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-5)
    final_val = rows[-1]["val/accuracy"]
    evaluation = json.loads((out / "rm_eval" / "rm_eval.json").read_text())
    overall = evaluation["breakdown"]["overall"]
    assert overall["accuracy"] == pytest.approx(final_val)  # the training-time validation and rm-eval agree
    # rm-eval reads the DPO policy as a reward model: its implicit reward (equation 5), reference and beta from the record
    eval_out = tmp_path / "rm-eval"
    assert cli_main(["rm-eval", f"model={out / 'model'}", f"data={ppo_dirs['pairs']}", "side=validation", "validation_fraction=0.2",
                     "max_query_length=128", "probes=", f"out={eval_out}"]) == 0
    again = json.loads((eval_out / "rm_eval.json").read_text())["breakdown"]["overall"]
    assert again["accuracy"] == pytest.approx(overall["accuracy"]) and again["count"] == overall["count"]
    assert "accuracy" in capsys.readouterr().out


def test_rm_eval_refuses_a_plain_policy_without_reference_and_beta(tiny_model_dir, ppo_dirs, tmp_path, capsys):
    assert cli_main(["rm-eval", f"model={tiny_model_dir}", f"data={ppo_dirs['pairs']}", "probes=", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "not a reward" in err or "neither a reward model" in err
    assert "Traceback" not in err


@pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short
def test_resume_after_sigkill_is_identical(ppo_dirs, tmp_path):
    args = stage_args("dpo", ppo_dirs, tmp_path, max_steps=4, eval_samples=0, eval_every=2)
    straight, killed = straight_and_resumed("dpo", "tldr-dpo", args, tmp_path, kill_at=2)
    assert_same_files(straight, killed, ["model/model.safetensors"])
    assert_same_metrics(straight, killed, 4)


@pytest.mark.parametrize(("preset", "expected"), [
    ("tldr-dpo", {"num_epochs": 1, "adam_eps": 1e-5, "learning_rate": 3e-6, "lr_scheduler": "cosine", "total_batch_size": 64, "beta": 0.05}),
    ("hh-dpo", {"beta": 0.1, "learning_rate": 5e-7, "num_epochs": 1, "total_batch_size": 4, "data_format": "hh"}),
])
def test_dpo_presets(preset, expected):
    cfg = resolve("dpo", preset, None, {})
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_implicit_reward_accuracy_breaks_down_like_a_reward_models(tiny_model_dir, ppo_dirs, tmp_path):
    """Same pairs through the reward-model evaluation: accuracy equals the sign agreement of equation 5."""
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path))
    policy, tok = load_policy(str(tiny_model_dir))
    reference, _ = load_policy(str(tiny_model_dir))
    with torch.no_grad():
        policy.model.embed_tokens.weight.add_(0.05 * torch.randn_like(policy.model.embed_tokens.weight))
    _, val_pairs = pairs_for(cfg, tok)
    examples = dpo.reference_logprobs(reference, "ref", val_pairs, tok.pad_token_id, cfg, tmp_path / "ref.pt")
    chosen, rejected = dpo.implicit_rewards(policy, examples, tok.pad_token_id, cfg)
    from rlhfkit.reward_models import ImplicitRewardModel

    result = evaluate_reward_model(ImplicitRewardModel(policy, reference, cfg.beta), tok, val_pairs, tmp_path / "eval",
                                   batch_size=4, probes="", limits={"tldr": 128, "hh": 128, "cnndm": 128})
    assert result["breakdown"]["overall"]["accuracy"] == pytest.approx(float(np.mean(chosen > rejected)))


def test_two_processes_train_like_one(ppo_dirs, tmp_path):
    """total_batch_size = micro batch x accumulation x processes; the DDP path of the log-probabilities
    (full logits, not the backbone called around DDP) gives the same weights as one process."""
    import subprocess

    env, runs = launcher_env(), {}
    for processes, micro in ((1, 4), (2, 2)):
        out = tmp_path / f"p{processes}"
        args = stage_args("dpo", ppo_dirs, out, max_steps=2, micro_batch_size=micro, eval_samples=0, eval_pairs=4,
                          mixed_precision="no")  # exact in fp32; bf16 rounds differently for other batch shapes
        command = rlhfkit_command("dpo", "--preset", "tldr-dpo", *cli_args(args), "--num-processes", str(processes))
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[processes] = out
    from safetensors.torch import load_file

    a, b = load_file(runs[1] / "model" / "model.safetensors"), load_file(runs[2] / "model" / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-6, rtol=1e-4)


def test_the_lm_head_check_holds_under_accelerates_bf16_wrapper(tiny_model_dir):
    """accelerate's mixed precision returns fp32 logits from a bf16 forward; the exactness check of the
    chunked log-probability path must not trip over the dtypes (it runs in fp32)."""
    from accelerate.utils import convert_outputs_to_fp32

    model, _ = load_policy(str(tiny_model_dir))
    model.forward = convert_outputs_to_fp32(model.forward)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert rollout.plain_lm_head(model) is model.get_output_embeddings()


def test_reference_log_probabilities_cover_exactly_the_pairs_the_run_visits(tiny_model_dir, ppo_dirs, tmp_path, monkeypatch):
    """max_steps=1 with batch 8 reaches 8 training pairs: only those pay a reference forward pass."""
    cfg = resolve("dpo", "tldr-dpo", None, stage_args("dpo", ppo_dirs, tmp_path, max_steps=1))
    policy, tok = load_policy(str(tiny_model_dir))
    train_pairs, _ = pairs_for(cfg, tok)
    counted = []
    original = dpo.pair_logprobs_all
    monkeypatch.setattr(dpo, "pair_logprobs_all", lambda model, pairs, *a: counted.append(len(pairs)) or original(model, pairs, *a))
    examples = dpo.visited_with_reference(policy, "ref", train_pairs, tok.pad_token_id, cfg, tmp_path / "ref.pt")
    assert counted == [8] and len(examples) == len(train_pairs) > 8
    from rlhfkit.trainers.engine import batch_indices, plan_schedule

    micro_batches = batch_indices(plan_schedule(cfg, len(train_pairs), 1), cfg.seed, 0, 0)
    visited = {i for micro in micro_batches for i in micro}
    assert {i for i, e in enumerate(examples) if not math.isnan(e.ref_chosen)} == visited
    with pytest.raises(RuntimeError, match="no reference log-probability"):
        dpo.collate_dpo([e for i, e in enumerate(examples) if i not in visited][:2], tok.pad_token_id)
