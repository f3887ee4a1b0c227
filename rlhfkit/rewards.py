"""Reward functions: programmatic rewards beside (or instead of) a reward model in PPO, GRPO and RLOO.

A reward function takes the batch's prompts and completions and returns one value per completion. It is
called by keyword, as TRL's GRPOTrainer and RLOOTrainer call theirs, so TRL's reward functions run unchanged
(rlhfkit/reward_calls.py calls them):

    def my_reward(prompts, completions, **columns) -> list[float | None]
    my_reward(prompts=..., completions=..., completion_ids=..., ..., log_extra=..., log_metric=..., **record_columns)

- `prompts`: each prompt. Conversational data (chat prompts: lists of `{role, content}` messages, GSM8K
  included) gives the prompt's messages as the dataset holds them; other data the query as the policy read it;
- `completions`: each sampled response, decoded without special tokens: after a conversational prompt one
  assistant message, `[{"role": "assistant", "content": text}]`, else the text (`text_of` reads either);
- `columns`: every other column of the prompt's dataset record, one value per completion (GSM8K:
  `answer`, `solution`, `calculator_steps`), plus the rollout's `ROLLOUT_COLUMNS`: `completion_ids` (each
  response's sampled token ids, EOS included when it ended, as TRL passes them), `completion_lengths`
  (their count), `has_eos` (whether the response ended) and `max_completion_length` (the configured
  limit, a single number), and TRL's hooks `log_extra(column, values)` (a column of the logged samples) and
  `log_metric(name, value)` (logged as `reward/<function>/<name>`). Accept `**columns` so that columns you do
  not use can be passed; a function without it is passed only the arguments it names. An `async def`
  function is awaited, concurrently with the batch's other async calls.

A value is a number, or None where the function does not score the row (TRL's multi-task functions): the
row's reward is then the weighted sum of the components that scored it, and a row nothing scores is dropped
from the update (rlhfkit/onpolicy/scoring.py). A function that raises, returns the wrong number of values,
a value that is not a number (a string such as "1.0" included) or not finite, or overruns `reward_timeout`,
fails those rows, which are reported (function, row, where it came from, what went wrong) and counted
in `rewards/<name>_errors`; `reward_errors` says what becomes of them (`ERROR_POLICIES`). A function that
ends the process (`sys.exit`) stops the run in one line. A parameter without a default names a dataset
column the function needs, unless it is one of the arguments every call is given: `required_columns`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .reward_calls import HOOKS, Batch, Call, CallLog, Completion, Outcome, Prompt, Raised, RewardFunction, outcomes
from .supplied import is_supplied, lookup

ROLLOUT_COLUMNS = (
    "completion_ids",
    "completion_lengths",
    "has_eos",
    "max_completion_length",
)  # given to every call, beside the record's columns
GIVEN = ("prompts", "completions", *ROLLOUT_COLUMNS, *HOOKS)  # every call's keyword arguments but the record's
# reward_errors: what becomes of a row a function failed on
ERROR_POLICIES = {
    "skip": "the row is dropped from the update (a run stops past max_reward_error_fraction)",
    "score": "the row's component is reward_error_score",
    "stop": "the run stops at the first such row",
}
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
class RowLogs:
    """What a batch's functions logged through TRL's hooks: each `log_extra` column, one value per row of the
    batch (None where the row's call logged none), and each function's `log_metric` values by
    `<function>/<name>`."""

    rows: int
    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, function: str, log: CallLog, rows: list[int]) -> None:
        """The log of `function`'s call on `rows` of the batch."""
        for column, values in log.extra.items():
            filled = self.extra.setdefault(column, [None] * self.rows)
            for row, value in zip(rows, values, strict=True):
                filled[row] = value
        for name, values in log.metrics.items():
            self.metrics[f"{function}/{name}"] += values


@dataclass
class RewardFunctions:
    """The configured functions, applied to a batch with every failure found, reported and counted."""

    names: list[str]
    functions: list[RewardFunction]
    on_error: str = "skip"  # reward_errors: one of ERROR_POLICIES
    error_score: float = -1.0  # a failed row's value under on_error="score"
    timeout: float = 0.0  # seconds a call may take (0: no limit)
    errors: list[RewardError] = field(default_factory=list)
    logs: RowLogs = field(default_factory=lambda: RowLogs(0))  # what the last `score` call's functions logged

    @classmethod
    def from_specs(
        cls, specs: list[str], on_error: str = "skip", error_score: float = -1.0, timeout: float = 0.0
    ) -> RewardFunctions:
        names = [component_name(s) for s in specs]
        duplicated = {n for n in names if names.count(n) > 1}
        if duplicated:
            raise ConfigError(f"reward_functions: {', '.join(sorted(duplicated))} named twice")
        functions = [resolve(s) for s in specs]
        for name, fn in zip(names, functions, strict=True):
            check_signature(name, fn)
        return cls(names, functions, on_error, error_score, timeout)

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
        """(functions x rows) values of the completions `texts`: NaN where a function does not score the row (it
        returned None) or failed on it under on_error="skip", `error_score` where it failed under "score";
        failures are recorded in `errors`, what the functions logged in `logs`. Functions read a completion
        after a conversation's messages as one assistant message (`conversational_completions`). `columns`
        holds lists (one value per row) and single values passed to every call alike. Each function is
        called once on the batch, the async ones together; a function that ends the process (sys.exit,
        KeyboardInterrupt) stops the run in one line naming it."""
        batch = Batch(prompts, conversational_completions(prompts, texts), columns)
        self.logs = RowLogs(len(batch))
        functions = zip(self.names, self.functions, strict=True)
        calls = [Call(name, fn, batch, CallLog(len(batch))) for name, fn in functions]
        return [
            [self.checked(c.name, v, i, where) for i, v in enumerate(self.row_values(c, outcome, where))]
            for c, outcome in zip(calls, outcomes(calls, self.timeout), strict=True)
        ]

    def row_values(self, c: Call, outcome: Outcome, where: list[str]) -> list[Any]:
        """Each row's value from the batch call `c`. A call that raised is retried one row at a time to find
        the rows that fail; a call that overran the time limit or returned the wrong number of values fails
        every row (no value can be matched to its row, and retrying would call a slow function once per row)."""
        rows = list(range(len(c.batch)))
        if isinstance(outcome, Raised):
            return self.one_row_each(c, where)
        if not isinstance(outcome, list):
            return [self.failed(c.name, i, where, self.overran()) for i in rows]
        if len(outcome) != len(rows):
            problem = f"returned {len(outcome)} values for {len(rows)} completions"
            return [self.failed(c.name, i, where, problem) for i in rows]
        self.logs.add(c.name, c.log, rows)
        return outcome

    def one_row_each(self, c: Call, where: list[str]) -> list[Any]:
        """The call `c` again on each of its rows alone (an async function's rows concurrently)."""
        singles = [Call(c.name, c.fn, c.batch.row(i), CallLog(1)) for i in range(len(c.batch))]
        values = []
        for i, (single, outcome) in enumerate(zip(singles, outcomes(singles, self.timeout), strict=True)):
            if isinstance(outcome, Raised):
                values.append(self.failed(c.name, i, where, f"raised {type(outcome.error).__name__}: {outcome.error}"))
            elif not isinstance(outcome, list):
                values.append(self.failed(c.name, i, where, self.overran()))
            elif len(outcome) != 1:
                values.append(self.failed(c.name, i, where, f"returned {len(outcome)} values for 1 completion"))
            else:
                self.logs.add(c.name, single.log, [i])
                values.append(outcome[0])
        return values

    def overran(self) -> str:
        return f"still running after reward_timeout={self.timeout:g} s: stopped"

    def checked(self, name: str, value: Any, row: int, where: list[str]) -> float:
        """The row's value as a float: NaN for None (not scored), the failure's value for one that is no
        finite number. A string is no number, even one that reads as one ("1.0")."""
        if isinstance(value, RowFailure):
            return self.failure_value()
        if value is None:
            return math.nan
        try:
            if isinstance(value, str | bytes):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError):
            self.failed(name, row, where, f"returned {value!r}, not a number")
            return self.failure_value()
        if not math.isfinite(number):
            self.failed(name, row, where, f"returned {number}")
            return self.failure_value()
        return number

    def failure_value(self) -> float:
        return self.error_score if self.on_error == "score" else math.nan

    def failed(self, name: str, row: int, where: list[str], problem: str) -> RowFailure:
        error = RewardError(name, row, where[row], problem)
        if self.on_error == "stop":
            raise ConfigError(error.line() + " (reward_errors=stop)")
        self.errors.append(error)
        return RowFailure()

    def take_errors(self) -> list[RewardError]:
        errors, self.errors = self.errors, []
        return errors


class RowFailure:
    """The value of a row whose reward could not be computed (given its `failure_value` once counted)."""


def check_signature(name: str, fn: RewardFunction) -> None:
    """Refuse, before anything loads, a function that cannot be called by keyword: one with positional-only
    parameters (`def f(prompts, completions, /)`), which a call by keyword cannot reach."""
    positional = [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.POSITIONAL_ONLY]
    if positional:
        raise ConfigError(
            f"reward_functions: {name} takes {', '.join(positional)} as positional-only parameters, but a reward "
            "function is called by keyword, as TRL calls it: remove the `/` from its signature"
        )


def required_columns(fn: RewardFunction) -> list[str]:
    """The dataset columns `fn` cannot be called without: its parameters without a default, less the arguments
    every call is given by name (`GIVEN`: prompts, completions, the rollout columns and TRL's hooks). The
    built-in gsm8k: `answer`."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(fn).parameters.values()
    return [p.name for p in parameters if p.kind in named and p.default is p.empty and p.name not in GIVEN]
