"""Review 2026-11, cases 9-12, 15 and 18: reward functions that end the process, fail on every row,
return the wrong count or hang; greedy sampling in a method that compares samples; SIGTERM/SIGINT
inside a reward function, in the final evaluation and in DPO's reference pass."""

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.preemption import Interrupted, StopSignal, interruptible
from rlhfkit.rewards import BUILTINS, RewardFunctions, required_columns
from rlhfkit.runlock import LOCK_FILE
from rlhfkit.stages import resolve

from .support.processes import child_env, rlhfkit_command
from .support.tiny import PRESETS, cli_args, stage_args

REWARD_FUNCTIONS = '''
import os, signal, sys, time
CALLS = []
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
def signals_on_call(prompts, completions, **columns):
    """Sends the signal in os.environ["SIGNAL_ON_CALL"] ("SIGTERM:2": on its 2nd call) to its own process,
    then hangs."""
    CALLS.append(1)
    name, _, call = os.environ.get("SIGNAL_ON_CALL", "").partition(":")
    if name and len(CALLS) == int(call):
        os.kill(os.getpid(), getattr(signal, name))
        time.sleep(60)
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def functions_file(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(REWARD_FUNCTIONS)
    return path


def grpo_args(ppo_dirs, out: Path, **extra) -> list[str]:
    return [
        "grpo",
        "--preset",
        PRESETS["grpo"],
        *cli_args(stage_args("grpo", ppo_dirs, out, **({"max_steps": 1} | extra))),
    ]


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# (case, options, the error line's fragment)
REFUSED = [
    (
        "9: sys.exit(0)",
        {"reward_functions": "{rf}:exits"},
        "reward function 'exits' raised SystemExit(0) instead of returning its scores",
    ),
    (
        "9: KeyboardInterrupt",
        {"reward_functions": "{rf}:interrupts"},
        "reward function 'interrupts' raised KeyboardInterrupt()",
    ),
    (
        "10: raises every call",
        {"reward_functions": "{rf}:raises"},
        "reward function 'raises' failed on all 8 rows of update 1 (the last: raised RuntimeError: boom)",
    ),
    (
        "10: gsm8k without answer",
        {"reward_functions": "gsm8k"},
        "reward_functions: gsm8k reads the column 'answer', which 32 of 32 prompts lack",
    ),
    (
        "10: a user function's column",
        {"reward_functions": "{rf}:reads_answer"},
        "reads_answer reads the column 'answer'",
    ),
    (
        "11: wrong count",
        {"reward_functions": "{rf}:wrongn"},
        "'wrongn' failed on all 8 rows of update 1 (the last: returned 1 values for 8 completions)",
    ),
    (
        "15: reward_timeout",
        {"reward_functions": "{rf}:slow", "reward_timeout": 0.5},
        "'slow' failed on all 8 rows of update 1 (the last: still running after reward_timeout=0.5 s: stopped)",
    ),
    (
        "12: grpo greedy",
        {"temperature": 0},
        "temperature=0 samples greedily: the samples_per_prompt=4 responses to a prompt are identical",
    ),
]


@pytest.mark.parametrize(("case", "options", "fragment"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_run_that_cannot_learn_stops_in_one_line_and_leaves_no_folder(
    ppo_dirs, functions_file, tmp_path, capsys, case, options, fragment
):
    out = tmp_path / "run"
    options = {k: str(v).format(rf=functions_file) for k, v in options.items()}
    started = time.monotonic()
    assert cli_main(grpo_args(ppo_dirs, out, **options)) == 2
    assert fragment in one_error_line(capsys.readouterr().err)
    assert not out.exists()  # stopped in its first update: the folder is taken back
    assert time.monotonic() - started < 60  # never a per-row retry of a slow function


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


def test_interruptible_raises_at_once_inside_a_step_and_nowhere_else():
    with StopSignal() as stop, pytest.raises(Interrupted), interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a hanging call: the handler raises in it
    assert stop.signum == signal.SIGTERM
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        with pytest.raises(Interrupted), interruptible():  # a stop asked for before the call: the call never starts
            pytest.fail("called after the stop")
    with StopSignal(droppable=False) as stop, interruptible():  # several processes: recorded, as anywhere in a step
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
    assert stop.signum == signal.SIGTERM


@pytest.mark.faults  # a signal, a checkpoint and a resume: the fault-injection suite
def test_sigterm_inside_a_reward_function_checkpoints_the_update_before_and_resumes_bit_identical(
    ppo_dirs, functions_file, tmp_path, capsys, monkeypatch
):
    options = {"reward_model": "", "reward_functions": f"{functions_file}:signals_on_call", "max_steps": 2}
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert cli_main(grpo_args(ppo_dirs, straight, **options)) == 0
    monkeypatch.setenv("SIGNAL_ON_CALL", "SIGTERM:2")  # in update 2's reward call, which then hangs
    with pytest.raises(SystemExit) as stopped:
        cli_main(grpo_args(ppo_dirs, out, **options))
    err = capsys.readouterr().err
    assert stopped.value.code == 143 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGTERM after update 1; checkpoint written to {out / 'checkpoints'}; resume with: "
        f"rlhfkit grpo resume={out}"
    )
    assert json.loads((out / "checkpoints" / "latest").read_text())["step"] == 1

    monkeypatch.delenv("SIGNAL_ON_CALL")
    assert cli_main(["grpo", f"resume={out}"]) == 0
    assert sha256(out / "model" / "model.safetensors") == sha256(straight / "model" / "model.safetensors")
    assert metrics_without_timings(out) == metrics_without_timings(straight)


@pytest.mark.faults  # a run and its resume with an evaluation each: over 10 s
def test_sigint_in_the_final_evaluation_names_the_final_checkpoint_and_resuming_finishes(
    ppo_dirs, functions_file, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    monkeypatch.setenv("SIGNAL_ON_CALL", "SIGINT:3")  # update 1, the SFT policy's answers, then the trained policy's
    with pytest.raises(SystemExit) as stopped:
        cli_main(grpo_args(ppo_dirs, out, reward_functions=f"{functions_file}:signals_on_call", eval_samples=2))
    err = capsys.readouterr().err
    assert stopped.value.code == 130 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGINT after update 1; checkpoint written to {out / 'checkpoints'}; resume with: "
        f"rlhfkit grpo resume={out}"
    )
    assert not (out / "eval.json").exists()
    monkeypatch.delenv("SIGNAL_ON_CALL")
    assert cli_main(["grpo", f"resume={out}"]) == 0
    assert json.loads((out / "eval.json").read_text())["eval/posts"] == 2


@pytest.mark.faults  # a signal and a second run: the fault-injection suite
def test_sigterm_in_dpo_reference_pass_says_how_to_start_again_which_finishes(ppo_dirs, tmp_path, capsys, monkeypatch):
    from rlhfkit.trainers import dpo

    original = dpo.pair_logprobs_all

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return original(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(dpo, "pair_logprobs_all", signalled)
    with pytest.raises(SystemExit) as stopped:
        cli_main(["dpo", "--preset", PRESETS["dpo"], *cli_args(stage_args("dpo", ppo_dirs, out, max_steps=1))])
    err = capsys.readouterr().err
    restart = f"rlhfkit dpo --config {out / 'config.yaml'}"
    assert stopped.value.code == 143 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGTERM before the run's first checkpoint; start it again with: {restart}"
    )
    monkeypatch.setattr(dpo, "pair_logprobs_all", original)
    assert cli_main(restart.split()[1:]) == 0
    assert (out / "model" / "model.safetensors").is_file()


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


def stop_line(err: str) -> str:
    """The one line saying how the run stopped: at the start of a line, or after the `\\r` of a progress bar
    cleared from the screen."""
    [line] = [part for line in err.splitlines() for part in line.split("\r") if part.startswith("rlhfkit: stopped by ")]
    return line


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def metrics_without_timings(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]
