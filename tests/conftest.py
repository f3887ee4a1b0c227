"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models, and ../shared/data (the helpers the
tests share are in helpers.py)."""

from __future__ import annotations

import os

import pytest
import torch

from .helpers import first_lines

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tokenizer():
    from rlhfkit.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved 2-layer d=64 random Llama with the real SmolLM2 tokenizer (and [PAD])."""
    from rlhfkit.tiny_models import save_tiny_policy

    return save_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture(scope="session")
def pad_is_eos_policy(tmp_path_factory, tiny_model_dir):
    """The tiny policy saved as a hub model whose PAD is its EOS (the embedded SmolLM2's tokenizer as
    shipped): no [PAD] row, so every load adds one (Detail 3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhfkit.models import resolve_model_path

    folder = tmp_path_factory.mktemp("pad-is-eos") / "policy"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_model(tiny_model_dir):
    from rlhfkit.models import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="session")
def ppo_dirs(tmp_path_factory, tiny_model_dir):
    """The inputs of every stage's tiny runs (helpers.stage_args): a tiny policy, a reward model made
    from it (scalar head at seed 1), 40 real TL;DR posts and 80 real TL;DR human comparisons."""
    from rlhfkit.models import load_policy
    from rlhfkit.reward_models import ScalarModel

    root = tmp_path_factory.mktemp("ppo")
    policy, tok = load_policy(str(tiny_model_dir))
    torch.manual_seed(1)
    reward = ScalarModel.from_policy(policy)
    reward.save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    return {"policy": tiny_model_dir, "rm": root / "rm",
            "posts": first_lines(root / "posts.jsonl", 40, "tldr-sft-sample", "tldr_sft_sample.jsonl.gz"),
            "pairs": first_lines(root / "pairs.jsonl", 80, "summarize-from-feedback-comparisons", "batch13.jsonl.gz")}
