"""The command line's own behaviour: help read through a pipe, spellings its help text gives."""

import json
import subprocess

from rlhfkit.cli import main

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
