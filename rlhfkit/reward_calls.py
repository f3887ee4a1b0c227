"""How one reward function is called (rlhfkit/rewards.py holds what its values mean): by keyword as TRL calls
it, within `reward_timeout`, with TRL's `log_extra` and `log_metric` hooks, a synchronous function in the main
thread and an `async def` one awaited on an event loop beside the other calls of its batch.

    fn(prompts=..., completions=..., completion_ids=..., ..., log_extra=..., log_metric=..., **record_columns)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import signal
import threading
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .preemption import interruptible

RewardFunction = Callable[..., Sequence[Any]]
Prompt = str | list[dict[str, Any]]  # a text, or a conversation's messages
Completion = str | list[dict[str, Any]]  # a text, or TRL's conversational form: one assistant message
HOOKS = ("log_extra", "log_metric")  # TRL's logging callables, given to every call


@dataclass(frozen=True)
class Batch:
    """The arguments of one call: the prompts, completions and columns (lists, one value per row, or single
    values passed alike to every call)."""

    prompts: list[Prompt]
    completions: list[Completion]
    columns: dict[str, Any]

    def __len__(self) -> int:
        return len(self.completions)

    def row(self, i: int) -> Batch:
        return Batch(
            self.prompts[i : i + 1],
            self.completions[i : i + 1],
            {k: v[i : i + 1] if isinstance(v, list) else v for k, v in self.columns.items()},
        )


@dataclass
class CallLog:
    """What one call logged through TRL's hooks: `log_extra(column, values)`, one value per completion of the
    call, and `log_metric(name, value)`, a number."""

    rows: int
    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        values = list(values)
        if len(values) != self.rows:  # raised in the function's call: that call fails, as a wrong count does
            raise ValueError(f"log_extra({column!r}, ...) got {len(values)} values for {self.rows} completions")
        self.extra[column] = values

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(float(value))

    def hooks(self) -> dict[str, Callable[..., None]]:
        return {"log_extra": self.log_extra, "log_metric": self.log_metric}


class TimedOut(BaseException):
    """A reward function's call overran the time limit. A BaseException, so that the function's own
    `except Exception` does not swallow it and go on."""


def is_async(fn: RewardFunction) -> bool:
    """Whether calling `fn` gives a coroutine to await: an `async def` function, a partial of one, or an object
    whose `__call__` is one."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__)


@dataclass(frozen=True)
class Call:
    """One call of the function `name` on a batch, with the log its hooks write to."""

    name: str
    fn: RewardFunction
    batch: Batch
    log: CallLog

    def run(self) -> Any:
        """`fn(prompts=..., completions=..., **columns, log_extra=..., log_metric=...)`, by keyword as TRL calls
        reward functions, so that a function may name only what it reads (`reward_len(completions, **kwargs)`).
        A function without **kwargs is passed only the arguments it names. A record column named like a call's
        argument gives way to it. An async function's call gives its coroutine."""
        batch = self.batch
        arguments = batch.columns | self.log.hooks() | {"prompts": batch.prompts, "completions": batch.completions}
        parameters = inspect.signature(self.fn).parameters.values()
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            named = {p.name for p in parameters}
            arguments = {k: v for k, v in arguments.items() if k in named}
        return self.fn(**arguments)


@dataclass(frozen=True)
class Raised:
    """A call that raised: what it raised (its rows are then retried one at a time)."""

    error: Exception


Outcome = list[Any] | Raised | TimedOut  # a call's values, or how it failed


def ended(name: str, error: BaseException) -> ConfigError:
    return ConfigError(
        f"reward function {name!r} raised {type(error).__name__}({error}) instead of returning its scores: a "
        "reward function must return one number per completion, never end the process"
    )


def call_in_time(c: Call, seconds: float) -> Outcome:
    """A synchronous call's outcome, within `seconds` (0: no limit); a stop signal ends the call at once
    (`interruptible`), and one that ends the process (sys.exit, KeyboardInterrupt) stops the run naming it."""
    try:
        with interruptible(), time_limit(seconds):
            return list(c.run())
    except TimedOut as e:
        return e
    except Exception as e:
        return Raised(e)
    except (SystemExit, KeyboardInterrupt) as e:
        raise ended(c.name, e) from None


def await_all(calls: list[Call], seconds: float) -> list[Outcome]:
    """The outcome of each async call, all run concurrently on one event loop, each within `seconds` (0: no
    limit); as `call_in_time`, a stop signal ends them all at once and one that ends the process stops the
    run. A coroutine that blocks the loop (time.sleep, not asyncio.sleep) holds up the others."""

    async def outcome(c: Call) -> Outcome:
        try:
            async with asyncio.timeout(seconds or None):
                return list(await c.run())
        except TimeoutError:
            return TimedOut()
        except Exception as e:
            return Raised(e)
        except (SystemExit, KeyboardInterrupt) as e:
            raise ended(c.name, e) from None

    async def together() -> list[Outcome]:
        return await asyncio.gather(*(outcome(c) for c in calls))

    with interruptible():
        return run_coroutine(together())


def outcomes(calls: list[Call], seconds: float) -> list[Outcome]:
    """The outcome of each call, in order: the synchronous ones one after another, the async ones together."""
    found: dict[int, Outcome] = {i: call_in_time(c, seconds) for i, c in enumerate(calls) if not is_async(c.fn)}
    waiting = [i for i, c in enumerate(calls) if is_async(c.fn)]
    found |= dict(zip(waiting, await_all([calls[i] for i in waiting], seconds), strict=True)) if waiting else {}
    return [found[i] for i in range(len(calls))]


def run_coroutine(coroutine: Coroutine) -> Any:
    """`asyncio.run(coroutine)`; where this thread already runs an event loop (a notebook's), on a thread of its
    own, since a loop cannot be run inside another."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


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
