"""Review cases 1-7, 13 and 17 of ../shared/reviews/bad-inputs-2026-11.md: the models a user points at and the
run folders rlhfkit writes. Each mistake ends in one line with exit code 2 and nothing written or lost; each
input that should work does. The SIGKILL resume from a model whose PAD is its EOS is in
test_fault_injection.py (faults suite)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from rlhfkit.cli import main as cli_main
from rlhfkit.logprobs import response_logprobs
from rlhfkit.models import load_policy
from rlhfkit.reward_models import load_reward_model

from .helpers import cli_args, files_of, one_error_line, stage_args


def command(stage: str, inputs: dict, out: Path, **extra) -> list[str]:
    return [stage, *cli_args(stage_args(stage, inputs, out, **{"max_steps": 1} | extra))]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory, pad_is_eos_policy, ppo_dirs) -> dict[str, Path]:
    """Model folders a user might point at by mistake, next to the PAD = EOS policy they came from."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = AutoTokenizer.from_pretrained(pad_is_eos_policy)
    small = LlamaConfig.from_pretrained(pad_is_eos_policy)
    small.vocab_size = 1000
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(small).save_pretrained(root / "smallvocab")
    classifier = LlamaConfig.from_pretrained(pad_is_eos_policy)
    classifier.num_labels = 1
    LlamaForSequenceClassification(classifier).save_pretrained(root / "seqcls")
    for name in ("smallvocab", "seqcls"):
        tokenizer.save_pretrained(root / name)
    shutil.copytree(pad_is_eos_policy, root / "noconfig")
    (root / "noconfig" / "config.json").unlink()
    shutil.copytree(pad_is_eos_policy, root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {"smallvocab": root / "smallvocab", "seqcls": root / "seqcls", "noconfig": root / "noconfig",
            "truncated": root / "truncated", "rm": ppo_dirs["rm"]}


# ---------------------------------------------------------------- case 1: the [PAD] a model whose PAD is its EOS gains


def test_the_added_pad_row_is_zero_and_the_same_on_every_load(pad_is_eos_policy):
    (first, tokenizer), (second, _) = load_policy(str(pad_is_eos_policy)), load_policy(str(pad_is_eos_policy))
    rows = first.get_input_embeddings().weight
    assert rows.size(0) == len(tokenizer) and tokenizer.pad_token_id == len(tokenizer) - 1
    assert torch.equal(rows[tokenizer.pad_token_id], torch.zeros_like(rows[0]))
    assert all(
        torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )


def test_loading_a_model_leaves_the_random_stream_as_it_was(pad_is_eos_policy):
    torch.manual_seed(3)
    load_policy(str(pad_is_eos_policy))
    after_load = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(4), after_load)


def test_the_pad_row_changes_no_other_tokens_probability(pad_is_eos_policy):
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(pad_is_eos_policy)  # no [PAD] row
    policy, tokenizer = load_policy(str(pad_is_eos_policy))
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logprobs, entropies = response_logprobs(policy, ids, mask, 2, 0.7)
        expected = (original(ids).logits[:, 1:-1].float() / 0.7).log_softmax(-1)
    torch.testing.assert_close(logprobs, expected.gather(-1, ids[:, 2:, None]).squeeze(-1), rtol=0, atol=1e-6)
    # the same entropy as without the row: PAD has probability 0 and every other token its old one
    torch.testing.assert_close(entropies, -(expected.exp() * expected).sum(-1), rtol=0, atol=1e-5)
    padded = ids.clone()
    padded[0, -2:] = (
        tokenizer.pad_token_id
    )  # a response's padding after its EOS: finite, so masked products stay finite
    assert torch.equal(response_logprobs(policy, padded, mask, 2, 0.7)[0][0, -2:], torch.zeros(2))


def test_kl_is_exactly_zero_at_the_first_update_from_a_model_whose_pad_is_its_eos(
    ppo_dirs, pad_is_eos_policy, tmp_path
):
    out = tmp_path / "run"
    assert cli_main(command("grpo", ppo_dirs | {"policy": pad_is_eos_policy}, out, eos_trick="false")) == 0
    assert [r["objective/kl"] for r in metrics(out) if "objective/kl" in r] == [0.0]


# ---------------------------------------------------------------- cases 5, 6, 7, 17: models that are not what they seem


def test_a_trl_reward_model_whose_pad_is_its_eos_loads_with_its_pad_row(broken_models):
    model, tokenizer = load_reward_model(broken_models["seqcls"])
    assert model.backbone.get_input_embeddings().num_embeddings == len(tokenizer)
    assert model.pad_token_id == tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = torch.tensor([[5, 6, tokenizer.eos_token_id, tokenizer.pad_token_id]])
    assert torch.isfinite(model(ids, torch.tensor([[1, 1, 1, 0]]))).all()


@pytest.mark.parametrize("stage", ["grpo", "rm-eval"])
def test_a_trl_reward_model_scores_in_the_stages_that_read_one(stage, ppo_dirs, broken_models, tmp_path):
    out = tmp_path / "run"
    if stage == "grpo":
        argv = command("grpo", ppo_dirs | {"rm": broken_models["seqcls"]}, out)
    else:
        argv = ["rm-eval", f"model={broken_models['seqcls']}", f"data={ppo_dirs['pairs']}", f"out={out}", "max_pairs=8"]
    assert cli_main(argv) == 0


MODEL_MISTAKES = [  # (case, the option given, model, stage, what the one line says)
    (6, "model", "smallvocab", "sft", "its tokenizer has 49152 tokens but the model's embeddings have 1000 rows"),
    (7, "model", "rm", "grpo", "is a reward or value model folder (it holds rlhfkit_scalar.json), not a causal LM"),
    (7, "model", "seqcls", "sft", "LlamaForSequenceClassification, which has no language-model head"),
    (17, "model", "noconfig", "sft", "Unrecognized model"),
    (17, "model", "truncated", "sft", "incomplete metadata"),
]


@pytest.mark.parametrize(
    "case, option, model, stage, message", MODEL_MISTAKES, ids=[f"{m[0]}-{m[2]}" for m in MODEL_MISTAKES]
)
def test_a_model_folder_that_cannot_serve_is_one_line_and_leaves_no_run_folder(
    case, option, model, stage, message, ppo_dirs, broken_models, tmp_path, capsys
):
    out = tmp_path / "run"
    line = one_error_line(command(stage, ppo_dirs | {"policy": broken_models[model]}, out), capsys)
    assert message in line and str(broken_models[model]) in line, line
    assert not out.exists()


def test_a_run_folder_given_for_its_model_names_the_model_folder_to_give(finished_run, ppo_dirs, tmp_path, capsys):
    out = tmp_path / "grpo"
    line = one_error_line(command("grpo", ppo_dirs | {"rm": finished_run}, out), capsys)  # case 24
    assert (
        line
        == f"rlhfkit: error: reward_model={finished_run} is a run folder; give the model it wrote: "
           f"reward_model={finished_run}/model"
    )
    assert not out.exists()


# ---------------------------------------------------------------- cases 2, 3, 4, 13: run folders and options


def test_a_folder_of_someone_elses_files_is_refused_and_overwrite_moves_it_aside(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "notes"
    (out / "model").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"my": "metrics"}\n')
    (out / "report.html").write_text("notes\n")
    before = files_of(out)
    line = one_error_line(command("sft", ppo_dirs, out), capsys)
    assert f"output_dir={out} is not empty (metrics.jsonl, model, report.html) and holds no rlhfkit run" in line, line
    assert files_of(out) == before and sorted(p.name for p in out.iterdir()) == [
        "metrics.jsonl",
        "model",
        "report.html",
    ]
    assert cli_main(command("sft", ppo_dirs, out, overwrite="true")) == 0
    (aside,) = tmp_path.glob("notes.old-*")
    assert files_of(aside) == before and (out / "config.yaml").is_file()


@pytest.fixture
def finished_run(ppo_dirs, tmp_path) -> Path:
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out, max_steps=2, save_every=1, keep_checkpoints=0)) == 0
    return out


@pytest.mark.parametrize(
    "changed, named",
    [
        (["learning_rate=0.5"], "learning_rate=0.5 (the run has 0.001)"),
        (
            ["learning_rate=0.5", "total_batch_size=2"],
            "learning_rate=0.5 (the run has 0.001); total_batch_size=2 (the run has 4)",
        ),
        (["model={other}"], "model={other} (the run has {policy})"),
    ],
)
def test_resume_refuses_options_that_could_not_take_effect_naming_each(
    changed, named, finished_run, ppo_dirs, pad_is_eos_policy, capsys
):
    fill = {"other": pad_is_eos_policy, "policy": ppo_dirs["policy"]}
    before = files_of(finished_run)
    line = one_error_line(["sft", f"resume={finished_run}", *(c.format(**fill) for c in changed)], capsys)
    assert named.format(**fill) in line and "a resumed run may change only max_steps" in line, line
    assert files_of(finished_run) == before


def test_resume_with_a_larger_max_steps_trains_on_the_recomputed_schedule(finished_run, capsys):
    at_two = load_file(finished_run / "model" / "model.safetensors")
    capsys.readouterr()
    assert cli_main(["sft", f"resume={finished_run}", "max_steps=3"]) == 0
    assert "rlhfkit: resume: max_steps 2 -> 3: the learning-rate schedule is recomputed" in capsys.readouterr().out
    at_three = load_file(finished_run / "model" / "model.safetensors")
    # the cosine schedule of 2 steps had reached 0; recomputed for 3 it is lr x 0.25 at step 3
    assert max(float((at_three[k] - at_two[k]).abs().max()) for k in at_two) > 1e-5
    assert "max_steps: 3" in (finished_run / "config.yaml").read_text()


def test_a_moved_run_resumes_where_it_is(finished_run, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(finished_run, moved)
    shutil.rmtree(finished_run)
    shutil.rmtree(moved / "model")
    shutil.rmtree(moved / "checkpoints" / "step-000002")
    (moved / "checkpoints" / "latest").write_text(json.dumps({"checkpoint": "step-000001", "step": 1}))
    assert cli_main(["sft", f"resume={moved}"]) == 0
    assert (moved / "model").is_dir() and not finished_run.exists()
    assert f"output_dir: {moved}" in (moved / "config.yaml").read_text()


def test_sharding_on_one_process_is_refused_rather_than_recorded(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, sharding="fsdp2"), capsys)
    assert "sharding=fsdp2 splits the models across processes and this run has one: add --num-processes N" in line, line
    assert not out.exists()


def test_an_unfinished_run_with_checkpoints_is_refused_before_any_data_is_read(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out, max_steps=2, save_every=1)) == 0
    shutil.rmtree(out / "model")  # as if stopped after its first checkpoint
    before = files_of(out)
    line = one_error_line(command("sft", ppo_dirs, out, data=tmp_path / "never-read.jsonl"), capsys)
    assert line == (
        f"rlhfkit: error: output_dir={out} holds an unfinished run with checkpoints; pass resume={out} to continue "
        "it, choose a new output_dir, or set overwrite=true to move it aside"
    )
    assert files_of(out) == before


def test_a_run_that_fails_before_it_starts_puts_back_the_run_it_moved_aside(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(command("sft", ppo_dirs, out)) == 0
    before = files_of(out)
    unusable = tmp_path / "empty-posts.jsonl"
    unusable.write_text(json.dumps({"subreddit": "a", "title": "b", "post": "", "summary": "c"}) + "\n")
    one_error_line(command("sft", ppo_dirs, out, data=unusable, overwrite="true"), capsys)
    assert files_of(out) == before and not list(tmp_path.glob("run.old-*"))
