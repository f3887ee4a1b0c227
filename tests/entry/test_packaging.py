"""The toolkit as users install and first meet it: what pyproject.toml lets pip install, quiet model
loads in stage logs, and `--help` that names the presets and the baselines."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from rlhfkit import cli
from rlhfkit.config import preset_names
from rlhfkit.models import load_policy
from rlhfkit.presets import ABOUT
from rlhfkit.reward_models import ScalarModel
from rlhfkit.stages import STAGES

from ..support.data import REPO, data_file

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def requirement(name: str) -> Requirement:
    return next(r for r in map(Requirement, PROJECT["dependencies"]) if r.name == name)


def help_text(*words: str) -> str:
    """`rlhfkit WORDS --help` through the installed console script, as a user types it."""
    script = Path(sys.executable).with_name("rlhfkit")
    return subprocess.run([str(script), *words, "--help"], capture_output=True, text=True, check=True).stdout


# ---------------------------------------------------------------- what pip installs


def test_python_versions_are_not_capped():
    supported = SpecifierSet(PROJECT["requires-python"])
    running = ".".join(map(str, sys.version_info[:3]))
    assert all(version in supported for version in (running, "3.11", "3.12", "3.13", "3.14"))
    assert "3.10" not in supported  # hashlib.file_digest (checkpoint hashes) is 3.11's


def test_torch_is_a_range_that_keeps_the_installed_build():
    """A pin would make `pip install -e .` swap a user's CUDA build for the pinned one."""
    torch_range = requirement("torch").specifier
    assert not any(spec.operator in ("==", "===") for spec in torch_range)
    assert all(torch_range.contains(v) for v in (torch.__version__, "2.13.0+cpu", "2.13.0+cu128", "2.6.0"))
    assert not torch_range.contains("2.5.1")  # FSDP2's fully_shard is public from torch 2.6


def test_readme_installs_the_cpu_torch_first_and_the_range_keeps_it():
    first_command = re.search(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), re.S).group(1)
    assert first_command.index("pip install torch==2.13.0") < first_command.index("pip install -e .")
    assert requirement("torch").specifier.contains("2.13.0")


# ---------------------------------------------------------------- quiet model loads


def test_model_loads_draw_no_loading_weights_bar(tiny_model_dir, tmp_path, capfd):
    AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # the bar transformers draws on a plain load
    assert "Loading weights" in capfd.readouterr().err
    policy, _ = load_policy(str(tiny_model_dir))
    ScalarModel.from_policy(policy).save_pretrained(tmp_path / "rm")
    capfd.readouterr()
    ScalarModel.from_pretrained(tmp_path / "rm")
    load_policy(str(tiny_model_dir))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the caller's setting comes back after a load


# ---------------------------------------------------------------- --help


def test_pipeline_help_lists_the_quickstart_and_paper_presets_with_descriptions():
    lines = help_text("pipeline").splitlines()
    for preset in ("quickstart", "paper-pythia-1b", "paper-pythia-2.8b", "paper-pythia-6.9b", "seed002-gpt2-hh"):
        assert f"  {preset:<24} {ABOUT[preset]}" in lines


def test_every_shipped_preset_has_a_description():
    from rlhfkit.config import preset_names

    assert not set(preset_names()) - set(ABOUT)


def test_every_command_that_takes_a_preset_lists_what_it_takes(capsys):
    for stage in (s for s in STAGES.values() if s.config is not None):
        assert cli.main([*stage.words, "--help"]) == 0
        out = capsys.readouterr().out
        assert all(f"\n  {preset:<24} {ABOUT.get(preset, '')}".rstrip() in out for preset in stage.presets), stage.name
        assert stage.presets or "presets: none shipped for this command" in out, stage.name
    grpo = help_text("grpo")
    assert "tldr-grpo" in grpo and "hh-grpo" in grpo


def test_every_description_names_a_shipped_preset():
    assert set(ABOUT) <= set(preset_names())


def test_rm_eval_help_says_accuracy_is_shown_beside_the_always_longer_rule():
    about = help_text("rm-eval").split("\n\n")[1]
    assert "accuracy" in about and "beside the always-prefer-longer rule on the same pairs (always-longer)" in about


def test_every_test_the_reliability_promises_name_exists():
    """docs/reliability.md and the README's Resuming section name, after each promise, the test that checks it:
    a renamed or deleted test must not leave a promise pointing at nothing."""
    named = []
    for doc in (REPO / "docs" / "reliability.md", REPO / "README.md"):
        module = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", doc.read_text()):
            module = path or module
            named.append((doc.name, module, name))
    assert len(named) > 50
    missing = [n for n in named if not re.search(rf"^def {n[2]}\(", (REPO / n[1]).read_text(), re.MULTILINE)]
    assert not missing, missing


def test_a_missing_shared_data_file_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        data_file("no-such-folder", "no-such-file.jsonl")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="not found"):
        data_file("no-such-folder", "no-such-file.jsonl")
