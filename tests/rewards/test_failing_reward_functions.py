"""Reward functions that cannot score: one that ends the process, fails on every row, returns the wrong
count, needs a column the prompts lack or hangs stops the run in its first update in one line; a hanging one
is cut at reward_timeout, and ended by Ctrl-C, within seconds."""

import contextlib
import signal
import subprocess
import time

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.rewards import BUILTINS, RewardFunctions, required_columns
from rlhfkit.runlock import LOCK_FILE

from ..support.mistakes import refusal_line
from ..support.processes import child_env, rlhfkit_command
from ..support.tiny import PRESETS, cli_args, preset_command, stage_args

REWARD_FUNCTIONS = '''
import os, sys, time
def exits(prompts, completions, **columns): sys.exit(0)
def interrupts(prompts, completions, **columns): raise KeyboardInterrupt
def raises(prompts, completions, **columns): raise RuntimeError("boom")
def wrongn(prompts, completions, **columns): return [1.0]
def slow(prompts, completions, **columns):
    if "REWARD_ENTERED" in os.environ:
        open(os.environ["REWARD_ENTERED"], "w").close()
    time.sleep(60)
    return [0.0] * len(completions)
def reads_answer(prompts, completions, answer, **columns): return [0.0] * len(completions)
'''


@pytest.fixture
def functions_file(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(REWARD_FUNCTIONS)
    return path


# (what the reward function does, options, the error line's fragment)
REFUSED = [
    (
        "sys.exit(0)",
        {"reward_functions": "{rf}:exits"},
        "reward function 'exits' raised SystemExit(0) instead of returning its scores",
    ),
    (
        "KeyboardInterrupt",
        {"reward_functions": "{rf}:interrupts"},
        "reward function 'interrupts' raised KeyboardInterrupt()",
    ),
    (
        "raises every call",
        {"reward_functions": "{rf}:raises"},
        "reward function 'raises' failed on all 8 rows of update 1 (the last: raised RuntimeError: boom)",
    ),
    (
        "gsm8k without answer",
        {"reward_functions": "gsm8k"},
        "reward_functions: gsm8k reads the column 'answer', which 32 of 32 prompts lack",
    ),
    (
        "a user function's column",
        {"reward_functions": "{rf}:reads_answer"},
        "reads_answer reads the column 'answer'",
    ),
    (
        "wrong count",
        {"reward_functions": "{rf}:wrongn"},
        "'wrongn' failed on all 8 rows of update 1 (the last: returned 1 values for 8 completions)",
    ),
    (
        "reward_timeout",
        {"reward_functions": "{rf}:slow", "reward_timeout": 0.5},
        "'slow' failed on all 8 rows of update 1 (the last: still running after reward_timeout=0.5 s: stopped)",
    ),
]


@pytest.mark.parametrize(("function", "options", "fragment"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_reward_function_that_cannot_score_stops_the_run_in_one_line_and_leaves_no_folder(
    ppo_dirs, functions_file, tmp_path, capsys, function, options, fragment
):
    out = tmp_path / "run"
    options = {k: str(v).format(rf=functions_file) for k, v in options.items()}
    started = time.monotonic()
    assert cli_main(preset_command("grpo", ppo_dirs, out, **options)) == 2
    assert fragment in refusal_line(capsys.readouterr().err)
    assert not out.exists()  # stopped in its first update: the folder is taken back
    assert time.monotonic() - started < 60  # never a per-row retry of a slow function


def test_wrong_count_is_counted_per_row_and_never_retried_one_row_at_a_time():
    calls = []

    def short(prompts, completions, **columns):
        calls.append(len(completions))
        return [1.0]

    functions = RewardFunctions(["short"], [short], on_error="score")
    assert functions.score(["p"] * 3, ["a", "b", "c"], {}, ["w1", "w2", "w3"]) == [[-1.0] * 3]
    assert calls == [3] and [e.row for e in functions.take_errors()] == [0, 1, 2]


def test_a_call_past_the_timeout_fails_its_rows_without_retrying_them():
    calls = []

    def stuck(prompts, completions, **columns):
        calls.append(len(completions))
        with contextlib.suppress(Exception):  # the function's own handler must not swallow the timeout
            time.sleep(30)
        return [0.0] * len(completions)

    functions = RewardFunctions(["stuck"], [stuck], on_error="score", timeout=0.2)
    started = time.monotonic()
    assert functions.score(["p"] * 2, ["a", "b"], {}, ["w1", "w2"]) == [[-1.0, -1.0]]
    assert time.monotonic() - started < 5 and calls == [2]
    assert "still running after reward_timeout=0.2 s" in functions.take_errors()[0].problem


def test_built_in_and_user_functions_declare_the_columns_they_need(tmp_path):
    assert required_columns(BUILTINS["gsm8k"]) == ["answer"]
    assert (
        required_columns(BUILTINS["length"]) == [] and required_columns(BUILTINS["format"]) == []
    )  # given to every call

    def optional(prompts, completions, answer=None, **columns):
        return [0.0] * len(completions)

    assert required_columns(optional) == []
    functions = RewardFunctions.from_specs(["gsm8k"])
    functions.check_columns([{"answer": "3"}, {"answer": "4"}], ["d:1", "d:2"])
    with pytest.raises(
        ConfigError, match=r"gsm8k reads the column 'answer', which 1 of 2 prompts lack \(the first: d:2\)"
    ):
        functions.check_columns([{"answer": "3"}, {}], ["d:1", "d:2"])


@pytest.mark.faults  # a child process and a real Ctrl-C, which a loaded machine can make slow
def test_ctrl_c_ends_a_hanging_reward_function_within_seconds(ppo_dirs, functions_file, tmp_path):
    out, log, entered = tmp_path / "run", tmp_path / "run.log", tmp_path / "entered"
    options = stage_args("grpo", ppo_dirs, out, max_steps=2, reward_functions=f"{functions_file}:slow")
    with log.open("w") as sink:
        proc = subprocess.Popen(
            rlhfkit_command("grpo", "--preset", PRESETS["grpo"], *cli_args(options)),
            env=child_env() | {"REWARD_ENTERED": str(entered)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while not entered.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # the child's SIGINT is Python's default: a Ctrl-C
        sent = time.monotonic()
        code = proc.wait(timeout=60)
    output = log.read_text()
    assert code == 130 and time.monotonic() - sent < 15, output[-3000:]
    assert f"rlhfkit: stopped by SIGINT after update 0; checkpoint written to {out / 'checkpoints'}" in output
    assert "Traceback" not in output and not (out / LOCK_FILE).exists()
