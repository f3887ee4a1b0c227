"""An environment that raises, ends the process, hangs past environment_timeout, returns what is not a Reply,
inserts ids outside the vocabulary, replies where the token rules do not allow it or ends with a NaN reward stops
the run in one line naming it and the episode (exit 2, a UserError from Python, no folder left); a stop signal ends
a hanging call at once and the run checkpoints the update before; environment_args values are checked against the
constructor's annotations before anything loads."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time

import pytest
import torch

from rlhfkit.cli import main as cli_main
from rlhfkit.environments import Environment, EpisodeStart, Reply, check_environment
from rlhfkit.environments.calls import built
from rlhfkit.environments.driver import EpisodeDriver, EpisodeLimits
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.preemption import Interrupted, StopSignal

from ..support.episodes import episode_args
from ..support.mistakes import api_error, one_error_line
from ..support.tiny import PRESETS, cli_args

HERE = "tests.environments.test_environment_faults"
LABEL = "5 (problems.jsonl:3)"


class Raises(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        raise RuntimeError("environment exploded")


class WrongType(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        return "24>>"


class ReturnsNone(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        return None


class BadIds(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        return Reply([10_000_000], "?", {"role": "user", "content": "?"})


class KbInt(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        raise KeyboardInterrupt


class Exits(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        sys.exit(0)


class EndWithNaN(Environment):
    has_reward = True

    def respond(self, turn_ids, turn_text, ended_by_eos):
        return Reply.end(reward=float("nan"))


class Hang(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        with contextlib.suppress(Exception):  # the environment's own handler must not swallow the stop
            time.sleep(30)
        return Reply.end()


class MessageAfterPause(Environment):
    def pauses_after(self, turn_text):
        return True

    def respond(self, turn_ids, turn_text, ended_by_eos):
        return self.message("user", "And then?")  # a new message inside the policy's turn


class InlineAfterEos(Environment):
    def respond(self, turn_ids, turn_text, ended_by_eos):
        return self.inline(" [ok]")


class ListComponents(Environment):
    component_names = ("calls",)

    def respond(self, turn_ids, turn_text, ended_by_eos):
        return Reply.end()

    def components(self):
        return [1.0]


class RaisesInConstructor(Environment):
    def __init__(self, start, tokenizer, rounds: int = 2):
        super().__init__(start, tokenizer)
        raise ValueError(f"no rounds column in {sorted(start.columns)}")


class SignalsOnEpisode(Environment):
    """Sends the signal in os.environ["SIGNAL_AT_EPISODE"] ("SIGTERM:9": the 9th episode built in this process, the
    first of update 2 in an 8-episode update) to its own process at its first reply, then hangs."""

    built = 0

    def __init__(self, start, tokenizer):
        super().__init__(start, tokenizer)
        SignalsOnEpisode.built += 1
        self.number = SignalsOnEpisode.built

    def respond(self, turn_ids, turn_text, ended_by_eos):
        name, _, episode = os.environ.get("SIGNAL_AT_EPISODE", "").partition(":")
        if name and self.number == int(episode):
            os.kill(os.getpid(), getattr(signal, name))
            time.sleep(60)
        return Reply.end()


def driven(tokenizer, environment: type[Environment], token: int, timeout: float = 0.0) -> EpisodeDriver:
    """A one-row driver whose policy has just sampled `token`: EOS ends its turn, any other token a pause."""
    env = environment(EpisodeStart([], {}, 0), tokenizer)
    driver = EpisodeDriver([env], tokenizer, EpisodeLimits(40, 8, 1.0, timeout=timeout), labels=[LABEL])
    driver.advance(torch.tensor([token]), torch.zeros(1, len(tokenizer)))
    return driver


FAULTS = [
    (Raises, "raised RuntimeError: environment exploded"),
    (WrongType, "respond returned str, not a Reply"),
    (ReturnsNone, "respond returned NoneType, not a Reply"),
    (BadIds, "inserted id 10000000, outside the vocabulary (ids 0 to 49152)"),
    (KbInt, "raised KeyboardInterrupt"),
    (Exits, "raised SystemExit: 0"),
    (EndWithNaN, "ended the episode with reward nan, not a finite number"),
    (InlineAfterEos, "answered the policy's EOS with text inside the ended turn"),
]


@pytest.mark.parametrize(("environment", "problem"), FAULTS, ids=[f[0].__name__ for f in FAULTS])
def test_an_environment_fault_is_one_line_naming_the_environment_and_the_episode(tokenizer, environment, problem):
    with pytest.raises(UserError) as raised:
        driven(tokenizer, environment, tokenizer.eos_token_id)
    assert str(raised.value).startswith(f"environment {environment.__name__} failed on episode {LABEL}: {problem}")
    assert "\n" not in str(raised.value)


def test_a_message_after_a_pause_is_refused_as_the_token_rules_say(tokenizer):
    """The docs keep a new message for after the policy's EOS; inside a turn it would be inserted unseen."""
    token = tokenizer.encode(" so", add_special_tokens=False)[0]
    with pytest.raises(UserError, match="answered a pause inside the policy's turn with a new message: after the"):
        driven(tokenizer, MessageAfterPause, token)


def test_components_that_are_not_a_dict_of_numbers_are_named(tokenizer):
    driver = driven(tokenizer, ListComponents, tokenizer.eos_token_id)
    with pytest.raises(UserError, match=f"failed on episode {re.escape(LABEL)}: components\\(\\) returned list"):
        driver.results(1, torch.device("cpu"))


def test_a_constructor_that_raises_names_the_episode(tokenizer):
    start = EpisodeStart([], {"question": "q"}, 0)
    with pytest.raises(
        UserError,
        match=r"environment RaisesInConstructor failed on episode 7 \(d:1\): raised "
        r"ValueError: no rounds column in \['question'\]",
    ):
        built(RaisesInConstructor, start, tokenizer, {"rounds": 3}, "7 (d:1)", 0.0)


def test_a_call_past_environment_timeout_stops_the_run_in_one_line(tokenizer):
    started = time.monotonic()
    with pytest.raises(
        UserError, match="environment Hang failed on episode .*: still running after environment_timeout=0.3 s: stopped"
    ):
        driven(tokenizer, Hang, tokenizer.eos_token_id, timeout=0.3)
    assert time.monotonic() - started < 5


def test_a_stop_signal_ends_a_hanging_environment_call_at_once(tokenizer):
    """Inside a step (a StopSignal that may drop it) SIGINT raises Interrupted in the hanging call, as it does in
    a reward function's; the training loop then checkpoints the update before (next test)."""
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    with StopSignal() as stop, pytest.raises(Interrupted):
        timer.start()
        driven(tokenizer, Hang, tokenizer.eos_token_id)
    timer.join()
    assert stop.signum == signal.SIGINT and time.monotonic() - started < 10


def test_environment_args_are_checked_against_the_constructors_annotations():
    """A wrong type or a negative count fails before anything loads, not at the first call."""
    calculator = "gsm8k-calculator"
    refused = [
        (calculator, {"max_calls": "lots"}, "environment_args: max_calls expects an integer, got 'lots'"),
        (calculator, {"max_calls": 2.5}, "environment_args: max_calls expects an integer, got 2.5"),
        (calculator, {"max_calls": True}, "environment_args: max_calls expects an integer, got True"),
        (calculator, {"max_calls": -5}, "environment_args: max_calls is a count: give 0 or more, got -5"),
        ("hh-dialogue", {"max_human_turns": -1}, "environment_args: max_human_turns is a count: give 0 or more"),
        ("tests.support.episodes:FixedTextEnv", {"text": 3}, "environment_args: text expects a string, got 3"),
    ]
    for spec, arguments, message in refused:
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_environment(spec, arguments)
    assert check_environment(calculator, {"max_calls": 0}) is not None
    assert check_environment("tests.support.episodes:FixedTextEnv", {"user_turns": 1, "text": "Hi."}) is not None


def fault_args(environment_dirs, out, environment: str, **extra) -> list[str]:
    """A one-update tiny grpo run with `environment` (module:Class) on GSM8K's chat prompts."""
    options = episode_args(
        "grpo",
        environment_dirs,
        out,
        environment=environment,
        environment_args={},
        check_tokens="false",
        max_steps=1,
    )
    return ["grpo", "--preset", PRESETS["grpo"], *cli_args(options | extra)]


def run_error(argv: list[str], capsys) -> str:
    """The error line of `rlhfkit ARGV`, which must exit 2 without a traceback (its progress bar shares stderr), the
    Python API raising a user error with the same message."""
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert api_error(argv) == lines[0].removeprefix("rlhfkit: error: ")
    return lines[0]


RUN_FAULTS = [
    ("Raises", {}, "raised RuntimeError: environment exploded"),
    ("EndWithNaN", {"eos_trick": "false"}, "ended the episode with reward nan"),  # not "loss is nan", exit 3
    ("Hang", {"environment_timeout": 0.5}, "still running after environment_timeout=0.5 s"),
]


@pytest.mark.parametrize(("environment", "options", "problem"), RUN_FAULTS, ids=[f[0] for f in RUN_FAULTS])
def test_a_run_whose_environment_fails_stops_in_one_line_and_leaves_no_folder(
    environment_dirs, tmp_path, capsys, environment, options, problem
):
    out = tmp_path / "run"
    line = run_error(fault_args(environment_dirs, out, f"{HERE}:{environment}", **options), capsys)
    assert re.match(rf"rlhfkit: error: environment {environment} failed on episode \d+ \(.*gsm8k.jsonl:\d+\): ", line)
    assert problem in line
    assert not out.exists()  # stopped in its first update: the folder is taken back


def test_environment_args_of_the_wrong_type_stop_the_run_before_anything_loads(environment_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    args = fault_args(environment_dirs, out, "gsm8k-calculator", environment_args={"max_calls": "lots"})
    line = one_error_line(args, capsys)
    assert line == "rlhfkit: error: environment_args: max_calls expects an integer, got 'lots'"
    assert not out.exists()


@pytest.mark.faults  # a signal, a checkpoint and a resume: the fault-injection suite
def test_sigterm_inside_a_hanging_environment_checkpoints_the_update_before_and_resumes(
    environment_dirs, tmp_path, capsys, monkeypatch
):
    """The run prints the resume line and exits 143 within seconds; the resumed run ends as one never stopped."""
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert cli_main(fault_args(environment_dirs, straight, f"{HERE}:SignalsOnEpisode", max_steps=2)) == 0
    monkeypatch.setattr(SignalsOnEpisode, "built", 0)
    monkeypatch.setenv("SIGNAL_AT_EPISODE", "SIGTERM:9")  # update 2's first episode, which then hangs
    with pytest.raises(SystemExit) as stopped:
        cli_main(fault_args(environment_dirs, out, f"{HERE}:SignalsOnEpisode", max_steps=2))
    err = capsys.readouterr().err
    assert stopped.value.code == 143 and "Traceback" not in err  # a call left to hang would end update 2 first
    assert (
        f"rlhfkit: stopped by SIGTERM after update 1; checkpoint written to {out / 'checkpoints'}; resume with: "
        f"rlhfkit grpo resume={out}" in err
    )
    assert json.loads((out / "checkpoints" / "latest").read_text())["step"] == 1
    monkeypatch.delenv("SIGNAL_AT_EPISODE")
    assert cli_main(["grpo", f"resume={out}"]) == 0
    assert (out / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()
