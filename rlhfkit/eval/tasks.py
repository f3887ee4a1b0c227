"""The verifiable tasks `rlhfkit eval gsm8k` measures accuracy on (`task=`), each declared once in `TASKS`: how its
problems are read and how an answer is graded against a problem's reference. Everything else the command gives
(greedy and sampled accuracy, pass@k, intervals, pairs, episodes with an environment, its files) is the same for
every task, so adding a task is adding its entry (tests/eval/test_adding_a_task.py adds one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..data.gsm8k import load_gsm8k
from ..data.records import SkipLog
from ..data.tldr import SFTRecord
from ..errors import ConfigError
from ..rewards import answer_format, is_correct, mentions_answer

Reader = Callable[[list[str], str], tuple[list[SFTRecord], SkipLog]]
Grader = Callable[[str, Any], bool]  # (completion, reference answer) -> right


def reference_anywhere(completion: str, reference: Any) -> bool:
    return str(reference) in completion


def any_form(completion: str) -> bool:
    """A task whose prompt asks for no particular form: every answer is in it."""
    return True


@dataclass(frozen=True)
class Task:
    """`read(paths, hf_split)`: the problems as records (the prompt, the reference answer in the `answer` column)
    and a SkipLog of the rows it could not use. `grade`: whether an answer is right. `mentions`: the grader blind to
    where the answer stands, which tells a policy that learned to answer from one that learned where to put an
    answer. `in_format`: whether an answer ends in the form the prompt asks for."""

    read: Reader
    grade: Grader
    mentions: Grader = reference_anywhere
    in_format: Callable[[str], bool] = any_form


def ends_with_the_answer_line(completion: str) -> bool:
    return bool(answer_format([], [completion])[0])


# `data make-task` writes its arithmetic problems as GSM8K records, so task gsm8k reads and grades them too
TASKS: dict[str, Task] = {"gsm8k": Task(load_gsm8k, is_correct, mentions_answer, ends_with_the_answer_line)}


def task_named(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"task={name}: not a task of rlhfkit/eval/tasks.py; choose one of {', '.join(TASKS)}")
    return TASKS[name]
