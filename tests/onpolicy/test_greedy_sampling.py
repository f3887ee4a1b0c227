"""Greedy sampling (temperature=0) gives a prompt's responses alike: refused where advantages compare a
prompt's samples (or a sample with its greedy baseline), accepted where they do not."""

import time

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.stages import resolve

from ..support.mistakes import refusal_line
from ..support.tiny import PRESETS, preset_command


def test_a_greedy_grpo_run_stops_in_one_line_and_leaves_no_folder(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    started = time.monotonic()
    assert cli_main(preset_command("grpo", ppo_dirs, out, temperature="0")) == 2
    fragment = "temperature=0 samples greedily: the samples_per_prompt=4 responses to a prompt are identical"
    assert fragment in refusal_line(capsys.readouterr().err)
    assert not out.exists()  # stopped in its first update: the folder is taken back
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("stage", "options", "fragment"),
    [
        ("rloo", {}, "advantage_estimator=rloo compares them"),
        (
            "reinforce",
            {"advantage_estimator": "reinforce-pp-baseline", "samples_per_prompt": 2},
            "reinforce-pp-baseline compares them",
        ),
        ("reinforce", {"advantage_estimator": "remax"}, "each response is its own greedy baseline"),
        ("grpo", {"dynamic_sampling": True}, "dynamic_sampling=true drops every group"),
    ],
)
def test_greedy_sampling_is_refused_where_samples_are_compared(stage, options, fragment):
    with pytest.raises(ConfigError, match=f"temperature=0 samples greedily: .*{fragment}.*every advantage is 0"):
        resolve(stage, PRESETS[stage], None, options | {"temperature": "0"})


@pytest.mark.parametrize(("stage", "options"), [("ppo", {}), ("reinforce", {})])
def test_greedy_sampling_is_accepted_where_advantages_do_not_compare_samples(stage, options):
    assert resolve(stage, PRESETS[stage], None, options | {"temperature": "0"}).temperature == 0
