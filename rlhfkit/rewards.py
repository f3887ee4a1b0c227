"""Reward functions: programmatic rewards beside (or instead of) a reward model in PPO, GRPO and RLOO.

A reward function takes the batch's prompts and completions and returns one float per completion. It is
called by keyword, as TRL's GRPOTrainer and RLOOTrainer call theirs, so TRL's reward functions run unchanged:

    def my_reward(prompts, completions, **columns) -> list[float]
    my_reward(prompts=..., completions=..., completion_ids=..., ..., **record_columns)

- `prompts`: each prompt. Conversational data (chat prompts: lists of `{role, content}` messages, GSM8K
  included) gives the prompt's messages as the dataset holds them; other data the query as the policy read it;
- `completions`: each sampled response, decoded without special tokens: after a conversational prompt one
  assistant message, `[{"role": "assistant", "content": text}]`, else the text (`text_of` reads either);
- `columns`: every other column of the prompt's dataset record, one value per completion (GSM8K:
  `answer`, `solution`, `calculator_steps`), plus the rollout's `ROLLOUT_COLUMNS`: `completion_ids` (each
  response's sampled token ids, EOS included when it ended, as TRL passes them), `completion_lengths`
  (their count), `has_eos` (whether the response ended) and `max_completion_length` (the configured
  limit, a single number). Accept `**columns` so that columns you do not use can be passed; a function
  without it is passed only the arguments it names.

`reward_functions=` names built-ins (`BUILTINS`) or a user's callable as `module:function` (a module
importable from the working directory, or `path/to/file.py:function`); through the Python API, the callable
itself (`supplied`). The score a policy is trained on is the weighted sum of the components
(`reward_weights=`, one per function and then one for the reward model when there is one). A function
that raises, returns the wrong number of values or a non-finite one, or overruns `reward_timeout`, is
never turned into a silent zero: the row is reported (function, row, where it came from, what went
wrong), counted in `rewards/<name>_errors`, and scored `reward_error_score`; with
`stop_on_reward_error=true` the run stops at the first such row instead. A function that ends the
process (`sys.exit`) stops the run in one line. A parameter without a default
names a dataset column the function needs, unless it is one of the arguments every call is given
(`prompts`, `completions`, the rollout columns): `required_columns`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .preemption import interruptible
from .supplied import is_supplied, lookup

RewardFunction = Callable[..., Sequence[float]]
Prompt = str | list[dict[str, Any]]  # a text, or a conversation's messages
Completion = str | list[dict[str, Any]]  # a text, or TRL's conversational form: one assistant message
ROLLOUT_COLUMNS = (
    "completion_ids",
    "completion_lengths",
    "has_eos",
    "max_completion_length",
)  # given to every call, beside the record's columns
GIVEN = ("prompts", "completions", *ROLLOUT_COLUMNS)  # the keyword arguments of every call but the record's columns
NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
ANSWER_PHRASE = re.compile(r"(?:answer is|####|\\boxed\{)\s*:?\s*(-?\$?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
FINAL_LINE = re.compile(r"the answer is:?\s*\$?-?\d[\d,]*(?:\.\d+)?\s*\.?\s*$", re.IGNORECASE)


def parse_number(text: str) -> float | None:
    cleaned = text.replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def extract_answer(completion: str) -> float | None:
    """The completion's final answer: the number after its last "answer is" (or `####`, `\\boxed{`),
    else the last number in it; None when it has no number."""
    stated = ANSWER_PHRASE.findall(completion)
    if stated:
        return parse_number(stated[-1])
    numbers = NUMBER.findall(completion)
    return parse_number(numbers[-1]) if numbers else None


def is_correct(completion: str, reference: Any) -> bool:
    """Exact match of the extracted final number with the reference number (to within 1e-6)."""
    predicted, expected = extract_answer(completion), parse_number(str(reference))
    return predicted is not None and expected is not None and math.isclose(predicted, expected, rel_tol=0, abs_tol=1e-6)


def mentions_answer(completion: str, reference: Any) -> bool:
    """Whether the reference number appears anywhere in the completion, as any of its numbers: a grader blind to
    where the answer stands, to tell a policy that learned to compute from one that learned to put its number last."""
    expected = parse_number(str(reference))
    found = (parse_number(n) for n in NUMBER.findall(completion))
    return expected is not None and any(n is not None and math.isclose(n, expected, abs_tol=1e-6) for n in found)


def digit_credit(completion: str, reference: Any) -> float:
    """Partial credit for an integer answer: the share of the reference's digits that the extracted final number
    has in the same place, counted from the units; a number of another length loses the places it lacks or adds
    (946 for 946: 1; 936: 2/3; 46: 2/3; 1946: 3/4); 0 without a number or for a non-integer reference."""
    predicted, expected = extract_answer(completion), parse_number(str(reference))
    if predicted is None or expected is None or predicted != int(predicted) or expected != int(expected):
        return 0.0
    got, want = str(abs(int(predicted)))[::-1], str(abs(int(expected)))[::-1]
    same = sum(a == b for a, b in zip(got, want, strict=False)) if (predicted < 0) == (expected < 0) else 0
    return same / max(len(got), len(want))


def text_of(completion: Completion) -> str:
    """A completion's text, given as a text or in TRL's conversational form (one assistant message)."""
    return completion if isinstance(completion, str) else completion[0]["content"]


def conversational_completions(prompts: list[Prompt], texts: list[str]) -> list[Completion]:
    """The completions as TRL gives them to reward functions: after a conversation's messages, one assistant
    message holding the text; after a text prompt, the text."""
    return [
        [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        for prompt, text in zip(prompts, texts, strict=True)
    ]


def gsm8k_exact_match(
    prompts: list[Prompt], completions: list[Completion], answer: list[Any], **columns
) -> list[float]:
    """1.0 when the completion's final number equals the reference `answer` column, else 0.0."""
    return [float(is_correct(text_of(c), a)) for c, a in zip(completions, answer, strict=True)]


def digit_match(
    prompts: list[Prompt], completions: list[Completion], answer: list[Any], **columns
) -> list[float]:
    """Partial credit against the reference `answer` column: the share of its digits in place (`digit_credit`)."""
    return [digit_credit(text_of(c), a) for c, a in zip(completions, answer, strict=True)]


def answer_format(prompts: list[Prompt], completions: list[Completion], **columns) -> list[float]:
    """1.0 when the completion ends with a line "The answer is N." (N a number), the form GSM8K's
    prompt asks for, else 0.0."""
    return [float(bool(FINAL_LINE.search(text_of(c).strip()))) for c in completions]


def length_penalty(
    prompts: list[Prompt],
    completions: list[Completion],
    completion_lengths: list[int],
    max_completion_length: int,
    **columns,
) -> list[float]:
    """-(response tokens / max_completion_length): from 0 (empty) down to -1 (the whole budget)."""
    return [-float(n) / max_completion_length for n in completion_lengths]


BUILTINS: dict[str, RewardFunction] = {
    "gsm8k": gsm8k_exact_match,
    "digits": digit_match,
    "format": answer_format,
    "length": length_penalty,
}


def load_callable(
    spec: str, option: str = "reward_functions", builtins: Iterable[str] = BUILTINS, kind: str = "function"
) -> Any:
    """`module:name` or `path/to/file.py:name` to the callable (a `kind`: function or class) for `option`, or
    a one-line error."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{option}: {spec!r} is neither a built-in ({', '.join(builtins)}) nor module:name")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ConfigError(f"{option}: {spec!r}: no such file {module_name}")
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{option}: cannot import {module_name!r} for {spec!r} ({type(e).__name__}: {e})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"{option}: {module_name} has no {kind} {attribute!r}")
    return function


def resolve(spec: str) -> RewardFunction:
    if is_supplied(spec):  # a callable given to the Python API
        return lookup(spec, "reward_functions")
    return BUILTINS[spec] if spec in BUILTINS else load_callable(spec)


def component_name(spec: str) -> str:
    return spec.rpartition(":")[2] if ":" in spec else spec


@dataclass
class RewardError:
    function: str
    row: int
    where: str
    problem: str

    def line(self) -> str:
        return f"reward function {self.function!r} failed on row {self.row} ({self.where}): {self.problem}"


@dataclass
class RewardFunctions:
    """The configured functions, applied to a batch with every failure found, reported and counted."""

    names: list[str]
    functions: list[RewardFunction]
    error_score: float = -1.0
    stop_on_error: bool = False
    timeout: float = 0.0  # seconds a call may take (0: no limit)
    errors: list[RewardError] = field(default_factory=list)

    @classmethod
    def from_specs(
        cls, specs: list[str], error_score: float = -1.0, stop_on_error: bool = False, timeout: float = 0.0
    ) -> RewardFunctions:
        names = [component_name(s) for s in specs]
        duplicated = {n for n in names if names.count(n) > 1}
        if duplicated:
            raise ConfigError(f"reward_functions: {', '.join(sorted(duplicated))} named twice")
        return cls(names, [resolve(s) for s in specs], error_score, stop_on_error, timeout)

    def __len__(self) -> int:
        return len(self.functions)

    def check_columns(self, columns: list[dict[str, Any]], where: list[str]) -> None:
        """Refuse, before any call, prompts (their dataset `columns`) that lack a column a function needs."""
        for name, fn in zip(self.names, self.functions, strict=True):
            for column in required_columns(fn):
                lacking = [i for i, row in enumerate(columns) if row.get(column) is None]
                if lacking:
                    raise ConfigError(
                        f"reward_functions: {name} reads the column {column!r}, which {len(lacking)} of {len(columns)} "
                        f"prompts lack (the first: {where[lacking[0]]}); give prompts with that column (gsm8k: "
                        f"prompt_format=gsm8k data), give the parameter a default, or leave {name} out (a function "
                        f"is called by keyword: {', '.join(GIVEN)} and the record's columns)"
                    )

    def score(
        self, prompts: list[Prompt], texts: list[str], columns: dict[str, Any], where: list[str]
    ) -> list[list[float]]:
        """(functions x rows) rewards of the completions `texts`; a failing row gets `error_score` and is
        recorded in `errors`. Functions read a completion after a conversation's messages as one assistant
        message (`conversational_completions`). `columns` holds lists (one value per row) and single values
        passed to every call alike. A function that ends the process (sys.exit, KeyboardInterrupt) stops the
        run in one line naming it."""
        completions = conversational_completions(prompts, texts)
        scores = []
        for name, fn in zip(self.names, self.functions, strict=True):
            try:
                scores.append(self.apply(name, fn, prompts, completions, columns, where))
            except (SystemExit, KeyboardInterrupt) as e:
                raise ConfigError(
                    f"reward function {name!r} raised {type(e).__name__}({e}) instead of returning its scores: a "
                    "reward function must return one number per completion, never end the process"
                ) from None
        return scores

    def apply(
        self,
        name: str,
        fn: RewardFunction,
        prompts: list[Prompt],
        completions: list[Completion],
        columns: dict[str, list[Any]],
        where: list[str],
    ) -> list[float]:
        """One call on the whole batch. A call that raised is retried one row at a time to find the rows that
        fail; a call that overran the time limit or returned the wrong number of values fails every row
        (no value can be matched to its row, and retrying would call a slow function once per row)."""
        rows = range(len(completions))
        try:
            values = self.guarded_call(fn, prompts, completions, columns)
        except TimedOut:
            values = [self.failed(name, i, where, self.overran()) for i in rows]
        except Exception:
            values = [self.one_row(name, fn, prompts, completions, columns, where, i) for i in rows]
        else:
            if len(values) != len(completions):
                problem = f"returned {len(values)} values for {len(completions)} completions"
                values = [self.failed(name, i, where, problem) for i in rows]
        return [self.checked(name, v, i, where) for i, v in enumerate(values)]

    def one_row(self, name, fn, prompts, completions, columns, where, i) -> float | RowFailure:
        try:
            row_columns = {k: v[i : i + 1] if isinstance(v, list) else v for k, v in columns.items()}
            values = self.guarded_call(fn, prompts[i : i + 1], completions[i : i + 1], row_columns)
        except TimedOut:
            return self.failed(name, i, where, self.overran())
        except Exception as e:
            return self.failed(name, i, where, f"raised {type(e).__name__}: {e}")
        if len(values) != 1:
            return self.failed(name, i, where, f"returned {len(values)} values for 1 completion")
        return values[0]

    def guarded_call(
        self,
        fn: RewardFunction,
        prompts: list[Prompt],
        completions: list[Completion],
        columns: dict[str, list[Any]],
    ) -> list[Any]:
        """`call`'s values, within the time limit; a stop signal ends the call at once (`interruptible`)."""
        with interruptible(), time_limit(self.timeout):
            return list(call(fn, prompts, completions, columns))

    def overran(self) -> str:
        return f"still running after reward_timeout={self.timeout:g} s: stopped"

    def checked(self, name: str, value: Any, row: int, where: list[str]) -> float:
        if isinstance(value, RowFailure):
            return self.error_score
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.failed(name, row, where, f"returned {value!r}, not a number")
            return self.error_score
        if not math.isfinite(number):
            self.failed(name, row, where, f"returned {number}")
            return self.error_score
        return number

    def failed(self, name: str, row: int, where: list[str], problem: str) -> RowFailure:
        error = RewardError(name, row, where[row], problem)
        if self.stop_on_error:
            raise ConfigError(error.line() + " (stop_on_reward_error=true)")
        self.errors.append(error)
        return RowFailure()

    def take_errors(self) -> list[RewardError]:
        errors, self.errors = self.errors, []
        return errors


class RowFailure:
    """The value of a row whose reward could not be computed (scored `error_score` once counted)."""


class TimedOut(BaseException):
    """A reward function's call overran the time limit. A BaseException, so that the function's own
    `except Exception` does not swallow it and go on."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimedOut in the block after `seconds` (0: no limit), through SIGALRM: the call runs in the
    main thread, where nothing but a signal can stop it. Elsewhere, or without SIGALRM, no limit."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def overran(_signum, _frame) -> None:
        raise TimedOut

    previous = signal.signal(signal.SIGALRM, overran)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def required_columns(fn: RewardFunction) -> list[str]:
    """The dataset columns `fn` cannot be called without: its parameters without a default, less the arguments
    every call is given by name (`GIVEN`: prompts, completions and the rollout columns). The built-in gsm8k:
    `answer`."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(fn).parameters.values()
    return [p.name for p in parameters if p.kind in named and p.default is p.empty and p.name not in GIVEN]


def call(
    fn: RewardFunction, prompts: list[Prompt], completions: list[Completion], columns: dict[str, list[Any]]
) -> Sequence[float]:
    """`fn(prompts=..., completions=..., **columns)`, by keyword as TRL calls reward functions, so that a
    function may name only what it reads (`reward_len(completions, **kwargs)`). A function without **kwargs
    is passed only the arguments it names. A record column named like a call's argument gives way to it."""
    arguments = columns | {"prompts": prompts, "completions": completions}
    parameters = inspect.signature(fn).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        named = {p.name for p in parameters}
        arguments = {k: v for k, v in arguments.items() if k in named}
    return fn(**arguments)
