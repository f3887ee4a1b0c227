"""The command line's own behaviour: help read through a pipe, spellings its help text gives, command groups
that list their commands, a warning that starts its own line under a progress bar."""

import io
import json
import subprocess

import pytest
from tqdm import tqdm

from rlhfkit.cli import main
from rlhfkit.errors import warn

from ..support.processes import child_env, rlhfkit_command


def test_help_read_through_a_pipe_that_closes_early_ends_quietly():
    """`rlhfkit ppo --help | head -1`: the reader leaves after one line; no BrokenPipeError traceback."""
    shell = " ".join(rlhfkit_command("ppo", "--help")) + " | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, env=child_env(),
                          timeout=120)
    assert done.stdout.startswith("usage: rlhfkit ppo") and len(done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_plan_takes_a_shipped_model_by_the_name_its_help_gives(capsys):
    assert main(["plan", "--help"]) == 0
    assert "Llama-3.2-1B" in capsys.readouterr().out
    for spelling in ("Llama-3.2-1B", "meta-llama/Llama-3.2-1B", "pythia-1b-deduped"):
        assert main(["plan", f"model={spelling}", "stage=sft", "format=json"]) == 0
        assert json.loads(capsys.readouterr().out)["model"] == spelling


@pytest.mark.parametrize("argv", [["data", "--help"], ["data", "-h"], ["data"], ["models", "--help"]])
def test_a_command_group_lists_its_commands(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rlhfkit {argv[0]} <command>") and f"  {argv[0]} " in out


def test_a_warning_printed_while_a_progress_bar_is_on_screen_starts_a_line(capsys):
    bar_output = io.StringIO()  # tqdm's own line, as it goes to a log file: no newline until the bar closes
    with tqdm(total=2, file=bar_output, desc="scoring") as bar:
        bar.update(1)
        warn("reward function 'raises' failed on row 0")
    warn("after the bar")
    err = capsys.readouterr().err
    assert err == "\nrlhfkit: warning: reward function 'raises' failed on row 0\nrlhfkit: warning: after the bar\n"
