"""Pickle weights (`pytorch_model.bin`, `*.pt`) load only with `allow_pickle`, and then with a warning."""

from __future__ import annotations

import inspect
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.config import RunConfig
from rlhfkit.errors import ModelError
from rlhfkit.models import load_policy
from rlhfkit.stages import resolve

from ..support.data import data_file


def pickled_copy(tiny_model_dir, folder, weights_name: str = "pytorch_model.bin"):
    """The tiny policy with its weights pickled (transformers 5 saves safetensors only, whatever it is asked)."""
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, folder / f.name)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    torch.save(weights, folder / weights_name)
    return folder, weights


@pytest.mark.parametrize("weights_name", ["pytorch_model.bin", "policy.pt"])
def test_pickle_weights_are_refused_naming_the_files_and_the_flag(tmp_path, tiny_model_dir, weights_name):
    folder, _ = pickled_copy(tiny_model_dir, tmp_path / "pickled", weights_name)
    with pytest.raises(ModelError) as err:
        load_policy(str(folder))
    message = str(err.value)
    assert f"only pickle weights ({weights_name})" in message and "allow_pickle=true" in message
    assert "unpickling can run arbitrary code" in message and "\n" not in message


def test_allow_pickle_loads_the_weights_with_a_one_line_warning(tmp_path, tiny_model_dir, capsys):
    folder, weights = pickled_copy(tiny_model_dir, tmp_path / "pickled")
    model, tokenizer = load_policy(str(folder), allow_pickle=True)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    assert tokenizer.pad_token == "[PAD]"
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlhfkit: warning:")]
    assert len(warnings) == 1
    assert (
        "allow_pickle" in warnings[0] and "pytorch_model.bin" in warnings[0] and "can run arbitrary code" in warnings[0]
    )


def test_allow_pickle_still_reads_safetensors_when_a_folder_has_both(tmp_path, tiny_model_dir, capsys):
    folder = tmp_path / "both"
    shutil.copytree(tiny_model_dir, folder)
    weights = load_file(str(folder / "model.safetensors"))
    torch.save({k: torch.zeros_like(v) for k, v in weights.items()}, folder / "pytorch_model.bin")
    model, _ = load_policy(str(folder), allow_pickle=True)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    assert "rlhfkit: warning:" not in capsys.readouterr().err


def test_allow_pickle_is_off_unless_set():
    assert inspect.signature(load_policy).parameters["allow_pickle"].default is False
    assert RunConfig().allow_pickle is False and RunConfig().trust_remote_code is False
    assert resolve("sft", None, None, {"allow_pickle": "true"}).allow_pickle is True
    assert resolve("rm", None, None, {}).allow_pickle is False


class Loaded(Exception):
    """Raised by the stand-in loader once it has seen the stage's arguments."""


STAGE_MODULES = (
    "rlhfkit.adapters",
    "rlhfkit.trainers.sft",
    "rlhfkit.trainers.reward",
    "rlhfkit.trainers.dpo",
    "rlhfkit.onpolicy.trainer",
)


def patch_every_load_policy(monkeypatch, loader):
    """Every rlhfkit module that imported `load_policy` gets the stand-in, so the test follows the
    loading code wherever a refactor moves it."""
    import importlib
    import sys

    for name in STAGE_MODULES:
        importlib.import_module(name)
    patched = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("rlhfkit") and getattr(m, "load_policy", None) is load_policy
    ]
    assert patched
    for module in patched:
        monkeypatch.setattr(module, "load_policy", loader)


@pytest.mark.parametrize("stage", ["sft", "rm", "dpo", "ppo"])
def test_every_training_stage_passes_allow_pickle_to_the_loader(
    stage, monkeypatch, tmp_path, tiny_model, tiny_model_dir
):
    from rlhfkit.cli import main
    from rlhfkit.reward_models import ScalarModel

    seen = {}

    def loader(*args, **kwargs):
        seen.update(kwargs)
        raise Loaded

    patch_every_load_policy(monkeypatch, loader)
    data = (
        data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz")
        if stage in ("sft", "ppo")
        else data_file("summarize-from-feedback-comparisons", "batch18.jsonl.gz")
    )
    # The tiny model keeps a missed stand-in a quick failure instead of a 135M training run.
    args = [
        stage,
        "allow_pickle=true",
        f"model={tiny_model_dir}",
        f"data={data}",
        f"output_dir={tmp_path / stage}",
        "report_to=",
    ]
    if stage == "ppo":
        policy, tokenizer = tiny_model
        ScalarModel.from_policy(policy).save_pretrained(tmp_path / "rm")
        tokenizer.save_pretrained(tmp_path / "rm")
        args.append(f"reward_model={tmp_path / 'rm'}")
    with pytest.raises(Loaded):
        main(args)
    assert seen["allow_pickle"] is True
