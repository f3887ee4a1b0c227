"""What a run's `auto` options resolved to is recorded (resolved.yaml, report.json, report.html) and kept
by `resume=`, so a run resumed on another kind of machine computes as it started."""

import json

import pytest
import yaml

from rlhfkit.cli import main
from rlhfkit.trainers import run as run_services

from ..support.launches import run_in_this_process
from ..support.processes import assert_same_files
from ..support.tiny import cli_args, stage_args


def test_a_run_records_what_each_auto_option_resolved_to_in_its_folder_and_report(ppo_dirs, tmp_path):
    run = run_in_this_process("grpo", stage_args("grpo", ppo_dirs, tmp_path / "run", max_steps=1))
    assert yaml.safe_load((run / "config.yaml").read_text())["mixed_precision"] == "auto"  # what was asked
    resolved = yaml.safe_load((run / "resolved.yaml").read_text())
    assert resolved["mixed_precision"] == ("bf16" if run_services.native_bf16() else "no")
    assert resolved["decoding"] == "eager" and resolved["threads"] >= 1 and resolved["device"].startswith("cpu")
    assert resolved["prompt_format"] == "tldr-sft"  # detected from the posts' columns
    assert resolved["attention"] == {"policy": "sdpa", "reference": "sdpa", "reward": "sdpa"}
    assert resolved["shared_prefix"] == {"policy": "on", "reference": "on", "reward": "on"}  # G = 4
    assert json.loads((run / "report.json").read_text())["resolved"] == resolved
    html = (run / "report.html").read_text()
    assert "Settings resolved on this machine" in html and "policy: sdpa" in html


def test_a_bf16_run_resumed_where_bf16_is_not_native_continues_in_bf16_and_ends_as_the_uninterrupted_run(
    ppo_dirs, tmp_path, monkeypatch, capsys
):
    """Started where bf16 is native (auto: bf16), resumed where it is not (auto would be fp32): the resumed
    steps still compute in bf16, so the weights are the uninterrupted run's, bit for bit."""

    def sft(out, steps, native):
        monkeypatch.setattr(run_services, "native_bf16", lambda: native)
        args = stage_args("sft", ppo_dirs, out, max_steps=steps, lr_scheduler="constant", save_every=1)
        return run_in_this_process("sft", args)

    straight = sft(tmp_path / "straight", 2, native=True)
    fp32 = sft(tmp_path / "fp32", 2, native=False)
    with pytest.raises(AssertionError):  # the precision moves the weights: the comparison below can fail
        assert_same_files(straight, fp32, ["model/model.safetensors"])
    resumed = sft(tmp_path / "resumed", 1, native=True)
    monkeypatch.setattr(run_services, "native_bf16", lambda: False)
    capsys.readouterr()
    assert main(["sft", f"resume={resumed}", *cli_args({"max_steps": 2})]) == 0
    assert "continues in emulated bf16" in capsys.readouterr().out
    resolved = yaml.safe_load((resumed / "resolved.yaml").read_text())
    assert resolved["mixed_precision"] == "bf16" and resolved["data_format"] == "tldr-sft"
    assert_same_files(straight, resumed, ["model/model.safetensors"])
