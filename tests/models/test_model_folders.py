"""The model folders a user points at: a missing folder or one without tokenizer files, a reward model trained
elsewhere, folders that cannot serve (a small vocabulary, a classifier given as a policy, no config, cut
weights). Each mistake is one line with exit code 2 and no run folder; each model that should work does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from rlhfkit.cli import main as cli_main
from rlhfkit.models import check_model_source
from rlhfkit.reward_models import load_reward_model

from ..support.mistakes import one_error_line
from ..support.tiny import command


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



def test_a_model_folder_without_tokenizer_files_says_so_and_how_to_add_them(ppo_dirs, tmp_path, capsys):
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ppo_dirs["policy"] / name, weights_only / name)
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, model=weights_only), capsys)
    assert f"model={weights_only}: the folder has no tokenizer files" in line and "tokenizer.save_pretrained" in line, (
        line
    )
    assert not out.exists()


@pytest.mark.parametrize("missing", ["./no-such-model", "/tmp/does/not/exist", "{tmp}/models/policy"])
def test_a_missing_local_model_folder_is_named_as_such(ppo_dirs, tmp_path, monkeypatch, capsys, missing):
    monkeypatch.chdir(tmp_path)
    missing = missing.format(tmp=tmp_path)
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, model=missing), capsys)
    assert f"model={missing}: no such folder" in line and "Repo id" not in line, line
    assert not out.exists()


def test_a_hub_id_is_left_to_the_hub():
    check_model_source("EleutherAI/pythia-1b-deduped", "model")  # no local folder by that name: not refused here



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


MODEL_MISTAKES = [  # (the option given, model, stage, what the one line says)
    ("model", "smallvocab", "sft", "its tokenizer has 49152 tokens but the model's embeddings have 1000 rows"),
    ("model", "rm", "grpo", "is a reward or value model folder (it holds rlhfkit_scalar.json), not a causal LM"),
    ("model", "seqcls", "sft", "LlamaForSequenceClassification, which has no language-model head"),
    ("model", "noconfig", "sft", "Unrecognized model"),
    ("model", "truncated", "sft", "incomplete metadata"),
]


@pytest.mark.parametrize(
    "option, model, stage, message", MODEL_MISTAKES, ids=[m[1] for m in MODEL_MISTAKES]
)
def test_a_model_folder_that_cannot_serve_is_one_line_and_leaves_no_run_folder(
    option, model, stage, message, ppo_dirs, broken_models, tmp_path, capsys
):
    out = tmp_path / "run"
    line = one_error_line(command(stage, ppo_dirs | {"policy": broken_models[model]}, out), capsys)
    assert message in line and str(broken_models[model]) in line, line
    assert not out.exists()
