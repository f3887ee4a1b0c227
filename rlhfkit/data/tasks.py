"""Verifiable arithmetic tasks made from a seed (`rlhfkit data make-task`), for RL whose reward is the truth.

Each problem is written as a GSM8K record: the question, and a worked solution whose steps carry GSM8K's
calculator annotations (`<<347+589=936>>`) and whose last line is `#### <answer>`. So the GSM8K data format
reads it, the `gsm8k` exact-match and `format` rewards score it, `rlhfkit eval gsm8k` measures it, and
nothing downstream knows it was generated.

Training and held-out problems are disjoint by construction: a problem's split is a function of the problem
itself (a hash of its text with the seed), so no problem can be drawn for both sides; within a side no
problem repeats. The same seed and sizes give the same files on any machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError


@dataclass(frozen=True)
class Problem:
    question: str
    steps: list[tuple[str, int]]  # (expression, value) in the order a solution computes them

    @property
    def answer(self) -> int:
        return self.steps[-1][1]

    def record(self) -> dict[str, str]:
        """The problem as GSM8K writes one: each step with its calculator annotation, then `#### answer`."""
        lines = [f"{expression} = <<{expression.replace(' ', '')}={value}>>{value}" for expression, value in self.steps]
        return {"question": self.question, "answer": "\n".join(lines) + f"\n#### {self.answer}"}


def operand(rng: random.Random, digits: int) -> int:
    """A number with exactly `digits` digits."""
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def addition(rng: random.Random, digits: int) -> Problem:
    a, b = operand(rng, digits), operand(rng, digits)
    return Problem(f"What is {a} + {b}?", [(f"{a} + {b}", a + b)])


def subtraction(rng: random.Random, digits: int) -> Problem:
    a, b = sorted((operand(rng, digits), operand(rng, digits)), reverse=True)
    return Problem(f"What is {a} - {b}?", [(f"{a} - {b}", a - b)])


def multiplication(rng: random.Random, digits: int) -> Problem:
    """A `digits`-digit number times a one-digit number (2 to 9)."""
    a, b = operand(rng, digits), rng.randint(2, 9)
    return Problem(f"What is {a} * {b}?", [(f"{a} * {b}", a * b)])


def two_step(rng: random.Random, digits: int) -> Problem:
    """(a + b) * c: a sum, then a product with a one-digit number: two steps, each checked by the solution."""
    a, b, c = operand(rng, digits), operand(rng, digits), rng.randint(2, 9)
    return Problem(f"What is ({a} + {b}) * {c}?", [(f"{a} + {b}", a + b), (f"{a + b} * {c}", (a + b) * c)])


TASKS: dict[str, tuple[Callable[[random.Random, int], Problem], str]] = {
    "add": (addition, "a + b, both with `digits` digits"),
    "sub": (subtraction, "a - b, both with `digits` digits, a >= b"),
    "mul": (multiplication, "a * b, a with `digits` digits, b from 2 to 9"),
    "add-mul": (two_step, "(a + b) * c, a and b with `digits` digits, c from 2 to 9: two steps"),
}
HELD_OUT_PERCENT = 20  # the default: about this many problems in 100 fall on the held-out side
FILES = ("train.jsonl", "test.jsonl", "task.json")


def held_out(problem: Problem, seed: int, percent: int = HELD_OUT_PERCENT) -> bool:
    """The side a problem belongs to, from its own text and the seed: the same problem is always on the same
    side, and about `percent` in 100 problems are held out."""
    digest = hashlib.sha256(f"{seed}:{problem.question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def make_problems(
    task: str, digits: int, seed: int, train: int, test: int, held_out_percent: int = HELD_OUT_PERCENT
) -> tuple[list[Problem], list[Problem]]:
    """`train` and `test` distinct problems of `task`, drawn in order from a generator seeded with `seed`,
    each side keeping the ones its rule (`held_out`) gives it."""
    if task not in TASKS:
        raise ConfigError(f"task={task!r}: choose one of {', '.join(TASKS)}")
    if not 1 <= digits <= 9:
        raise ConfigError(f"digits={digits}: choose 1 to 9")
    if not 1 <= held_out_percent <= 99:
        raise ConfigError(f"held_out_percent={held_out_percent}: choose 1 to 99")
    draw, _ = TASKS[task]
    rng, sides = random.Random(f"{task}-{digits}-{seed}"), {False: {}, True: {}}
    wanted = {False: train, True: test}
    for _ in range(50 * (train + test) + 1000):
        if all(len(sides[side]) >= wanted[side] for side in sides):
            break
        problem = draw(rng, digits)
        side = held_out(problem, seed, held_out_percent)
        if len(sides[side]) < wanted[side]:
            sides[side].setdefault(problem.question, problem)
    else:
        raise ConfigError(
            f"task={task} digits={digits} has too few distinct problems for train={train} test={test}: "
            f"drew {len(sides[False])} and {len(sides[True])} with held_out_percent={held_out_percent}; lower the "
            "counts, raise digits or move held_out_percent towards the side that lacks problems"
        )
    return list(sides[False].values()), list(sides[True].values())


def write_task(
    out: Path, task: str, digits: int, seed: int, train: int, test: int, held_out_percent: int = HELD_OUT_PERCENT
) -> dict:
    """train.jsonl and test.jsonl (GSM8K records) and task.json (how they were made) in `out`."""
    train_problems, test_problems = make_problems(task, digits, seed, train, test, held_out_percent)
    with writable(out):
        out.mkdir(parents=True, exist_ok=True)
        for name, problems in (("train", train_problems), ("test", test_problems)):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(p.record()) + "\n" for p in problems))
    about = {
        "task": task,
        "about": TASKS[task][1],
        "digits": digits,
        "seed": seed,
        "train": len(train_problems),
        "test": len(test_problems),
        "split_rule": f"held out when int(sha256(f'{{seed}}:{{question}}')[:8 bytes]) % 100 < {held_out_percent}",
        "format": "gsm8k",
    }
    with writable(out):
        (out / "task.json").write_text(json.dumps(about, indent=2) + "\n")
    return about


@contextlib.contextmanager
def writable(out: Path) -> Iterator[None]:
    """An OS refusal to make or write `out` (a file there, a path through a file, no permission) as one line
    naming it."""
    try:
        yield
    except FileExistsError:
        raise ConfigError(f"out={out}: exists and is not a folder; give a folder for the task's files") from None
    except OSError as e:
        raise ConfigError(f"out={out}: cannot be created or written: {e.strerror or e}; choose another out=") from None
