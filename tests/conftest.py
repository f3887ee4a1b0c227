"""Shared fixtures: the real SmolLM2 tokenizer, tiny random models, and ../shared/data (the helpers the
tests share are in support/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from .support.data import first_lines
from .support.launches import run_in_this_process

# under pytest-xdist each worker takes one core's worth of threads, so that two workers do not fight over two cores
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


# the longest tests of the slow and fault suites (1-5 minutes each), started first: pytest-xdist hands out tests in
# this order, and a long one left for last keeps one worker busy while the other has nothing to do
LONGEST_FIRST = (
    "test_recipes.py::test_the_short_version_of_each_recipe_ends_inside_its_expected_bands[arithmetic-grpo]",
    "test_examples.py::test_the_notebook_runs", "test_compare_trl.py::", "test_fault_injection.py::",
    "test_gpu_suite.py::test_real_tiny")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return next((i for i, name in enumerate(LONGEST_FIRST) if name in item.nodeid), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: every other test keeps its place


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
def tiny_teacher_dir(tmp_path_factory, tiny_model_dir):
    """The tiny policy with other weights (seed 7) and its own tokenizer, the student's: a distillation teacher
    that disagrees with the tiny student on every token."""
    from rlhfkit.models import load_policy

    teacher, tokenizer = load_policy(str(tiny_model_dir))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.add_(0.5 * parameter.std().nan_to_num(0.02) * torch.randn(parameter.shape, generator=generator))
    folder = tmp_path_factory.mktemp("teacher") / "teacher"
    teacher.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
    """The inputs of every stage's tiny runs (support.tiny.stage_args): a tiny policy, a reward model made
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


@pytest.fixture(scope="session")
def one_process_run(tmp_path_factory):
    """`run(stage, options)`: the folder of a one-process `rlhfkit <stage>` run with these options (their
    output_dir aside), made in this process the first time a test asks and shared by every test that asks
    again, in any module: the reference that 2-process and sharded runs are compared with, within tolerances. Tests
    read it and never write to it."""
    runs: dict[str, Path] = {}

    def run(stage: str, options: dict) -> Path:
        key = json.dumps([stage, {k: str(v) for k, v in options.items() if k != "output_dir"}], sort_keys=True)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"{stage}-one-process") / "run"
            runs[key] = run_in_this_process(stage, options | {"output_dir": str(out)})
        return runs[key]

    return run


@pytest.fixture(scope="session")
def environment_dirs(tmp_path_factory, ppo_dirs):
    """The inputs of the tiny multi-turn runs: a tiny policy that ends turns with EOS about one step in
    fifteen (support.episodes.eos_prone_policy), the tiny reward model, 40 real GSM8K problems (chat prompts) and 40
    real HH-RLHF dialogues."""
    from .support.episodes import eos_prone_policy

    root = tmp_path_factory.mktemp("environments")
    policy, tokenizer = eos_prone_policy()
    policy.save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    return {"policy": root / "policy", "rm": ppo_dirs["rm"],
            "gsm8k": first_lines(root / "gsm8k.jsonl", 40, "gsm8k", "train.jsonl.gz"),
            "hh": first_lines(root / "hh.jsonl", 40, "hh-rlhf", "harmless-base", "test.jsonl.gz")}
