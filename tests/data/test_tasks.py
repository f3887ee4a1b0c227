"""`rlhfkit data make-task`: arithmetic problems from a seed, in GSM8K's format, training and held-out sides
disjoint by construction; the `digits` partial-credit reward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data.gsm8k import load_gsm8k
from rlhfkit.data.tasks import TASKS, held_out, make_problems
from rlhfkit.errors import ConfigError
from rlhfkit.rewards import BUILTINS, digit_credit, gsm8k_exact_match

SIDES = ("train", "test")
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def worked(step: str) -> int:
    """The value of one annotated step `a op b`, computed here without the generator's code."""
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", step).groups()
    return OPERATIONS[op](int(a), int(b))


def make(tmp_path, name: str, **options) -> tuple[list[dict], list[dict], dict]:
    out = tmp_path / name
    args = [f"{key}={value}" for key, value in ({"out": out} | options).items()]
    assert cli_main(["data", "make-task", *args]) == 0
    train, test = ([json.loads(line) for line in (out / f"{side}.jsonl").read_text().splitlines()] for side in SIDES)
    return train, test, json.loads((out / "task.json").read_text())


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_problem_is_solved_by_its_annotated_steps_and_read_as_gsm8k(task, tmp_path):
    train, test, about = make(tmp_path, task, task=task, digits=2, train_problems=300, test_problems=80)
    assert (len(train), len(test)) == (300, 80) == (about["train"], about["test"])
    records, log = load_gsm8k([str(tmp_path / task / "train.jsonl")])
    assert log.kept == 300 and not log.skipped
    for row, record in zip(train, records, strict=True):
        steps = re.findall(r"<<([^=]+)=(-?\d+)>>", row["answer"])
        assert steps and all(worked(expression) == int(value) for expression, value in steps)
        assert record.columns["answer"] == steps[-1][1] == row["answer"].rsplit("#### ", 1)[1]
        assert record.columns["calculator_steps"] == (2 if task == "add-mul" else 1)
        operands = [int(n) for n in re.findall(r"\d+", row["question"])]
        two_digit = operands[:1] if task == "mul" else operands[:2]  # a and b have `digits` digits, c (and mul's b) one
        assert all(10 <= n <= 99 for n in two_digit) and all(2 <= n <= 9 for n in operands[len(two_digit) :])
        if task == "sub":
            assert int(record.columns["answer"]) >= 0


def test_the_sides_are_disjoint_by_construction_and_the_same_seed_gives_the_same_files(tmp_path):
    train, test, _ = make(tmp_path, "a", task="add", digits=2, train_problems=1000, test_problems=250, seed=7)
    questions = {side: [row["question"] for row in rows] for side, rows in (("train", train), ("test", test))}
    assert len(set(questions["train"])) == 1000 and len(set(questions["test"])) == 250  # no repeats on a side
    assert not set(questions["train"]) & set(questions["test"])
    # the side is a function of the problem and the seed: the rule put each problem where it is
    first, second = make_problems("add", 2, 7, 1000, 250)
    assert all(not held_out(p, 7) for p in first) and all(held_out(p, 7) for p in second)
    assert [p.question for p in first] == questions["train"]
    again, _, _ = make(tmp_path, "b", task="add", digits=2, train_problems=1000, test_problems=250, seed=7)
    other, _, _ = make(tmp_path, "c", task="add", digits=2, train_problems=1000, test_problems=250, seed=8)
    assert again == train and other != train


def test_held_out_percent_moves_problems_to_the_held_out_side_by_the_same_rule():
    # mul with 2 digits has 90 * 8 = 720 distinct problems: the default fifth held out cannot give 500
    with pytest.raises(ConfigError, match="drew .* with held_out_percent=20"):
        make_problems("mul", 2, 0, 100, 500)
    train, test = make_problems("mul", 2, 0, 196, 524, held_out_percent=75)
    assert len(train) == 196 and len(test) == 524 and len({p.question for p in train + test}) == 720
    assert all(held_out(p, 0, 75) for p in test) and not any(held_out(p, 0, 75) for p in train)
    # a larger share only adds problems to the held-out side: every default held-out problem stays held out
    assert {p.question for p in test} >= {p.question for p in train + test if held_out(p, 0)}


def test_an_existing_task_folder_is_refused_unless_overwrite_and_too_many_problems_is_refused(tmp_path, capsys):
    make(tmp_path, "t", task="mul", digits=2, train_problems=10, test_problems=5)
    before = (tmp_path / "t" / "train.jsonl").read_text()
    assert cli_main(["data", "make-task", f"out={tmp_path / 't'}", "task=mul", "seed=1"]) == 2
    err = capsys.readouterr().err
    assert "already holds train.jsonl, test.jsonl, task.json" in err and "overwrite=true" in err
    assert (tmp_path / "t" / "train.jsonl").read_text() == before
    make(tmp_path, "t", task="mul", digits=2, train_problems=10, test_problems=5, seed=1, overwrite="true")
    assert (tmp_path / "t" / "train.jsonl").read_text() != before
    with pytest.raises(ConfigError, match="too few distinct problems"):
        make_problems("add", 1, 0, 500, 100)  # 81 sums of two one-digit numbers
    assert cli_main(["data", "make-task", "task=divide"]) == 2
    assert "task" in capsys.readouterr().err


def make_task_error(out, capsys) -> str:
    """The one stderr line of `rlhfkit data make-task out=OUT`, which must exit 2."""
    assert cli_main(["data", "make-task", f"out={out}", "train_problems=10", "test_problems=10"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_an_out_that_cannot_be_a_folder_is_one_line_and_a_file_there_is_kept(tmp_path, capsys, monkeypatch):
    """A file, a path through a file, a folder that refuses to be made."""
    existing = tmp_path / "existing.txt"
    existing.write_text("precious\n")
    assert make_task_error(existing, capsys) == (
        f"rlhfkit: error: out={existing}: exists and is not a folder; give a folder for the task's files"
    )
    assert existing.read_text() == "precious\n"
    below = existing / "sub"
    assert make_task_error(below, capsys) == (
        f"rlhfkit: error: out={below}: cannot be created or written: Not a directory; choose another out="
    )

    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused)  # as an immutable parent folder refuses (chattr +i; root ignores modes)
    immutable = tmp_path / "ro" / "task"
    assert make_task_error(immutable, capsys) == (
        f"rlhfkit: error: out={immutable}: cannot be created or written: Permission denied; choose another out="
    )


@pytest.mark.parametrize(
    ("completion", "reference", "credit"),
    [
        ("347 + 589 = 936. The answer is 936.", "936", 1.0),
        ("The answer is 926.", "936", 2 / 3),
        ("The answer is 36.", "936", 2 / 3),  # a missing place counts against
        ("The answer is 1936.", "936", 3 / 4),  # so does an extra one
        ("The answer is 639.", "936", 1 / 3),
        ("The answer is -936.", "936", 0.0),
        ("The answer is 936.5.", "936", 0.0),
        ("I do not know.", "936", 0.0),
    ],
)
def test_digit_credit_counts_the_reference_digits_in_place(completion, reference, credit):
    assert digit_credit(completion, reference) == pytest.approx(credit)


def test_the_digits_reward_is_a_built_in_that_gives_exact_answers_what_exact_match_gives():
    completions = ["The answer is 936.", "The answer is 930.", "nothing"]
    answers = ["936", "936", "936"]
    partial = BUILTINS["digits"]([""] * 3, completions, answer=answers)
    exact = gsm8k_exact_match([""] * 3, completions, answer=answers)
    assert partial == pytest.approx([1.0, 2 / 3, 0.0]) and exact == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "mentioned"),
    [
        ("24 * 3 = 72. The answer is N.", True),  # right, but not where the answer goes
        ("The answer is 72.", True),
        ("72.0 is it", True),
        ("24 * 3 = 27", False),
        ("1,072", False),
    ],
)
def test_mentions_answer_finds_the_right_number_wherever_it_stands(completion, mentioned):
    from rlhfkit.rewards import mentions_answer

    assert mentions_answer(completion, "72") is mentioned
