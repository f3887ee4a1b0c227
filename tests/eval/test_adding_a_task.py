"""Adding an evaluation task is one entry in rlhfkit/eval/tasks.py's TASKS (docs/architecture.md, "Adding an
evaluation task or an environment"): a toy task declared there alone is read, answered and graded by
`rlhfkit eval gsm8k task=<name>`, its grader deciding every number. The toy task asks for a reply of at most N
characters, which a random model's answers pass or fail whatever they say."""

import json
from pathlib import Path

from rlhfkit.data.records import SkipLog
from rlhfkit.data.tldr import SFTRecord
from rlhfkit.eval.tasks import TASKS, Task

# character limits far below and far above what 6 tokens of a random model write: some answers fit, some do not
LIMITS = [1, 400, 2, 300, 3, 200]


def read_limits(paths: list[str], hf_split: str) -> tuple[list[SFTRecord], SkipLog]:
    """One problem per line `{"limit": N}`: a chat prompt asking for a reply of at most N characters, N its answer."""
    records, log = [], SkipLog()
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            limit = json.loads(line)["limit"]
            messages = json.dumps([{"role": "user", "content": f"Say hello in at most {limit} characters."}])
            records.append(SFTRecord(f"limit-{limit}", {"messages": messages}, "Hi", f"{path}:{number}", "chat",
                                     {"answer": limit}))
    log.kept = len(records)
    return records, log


def fits_the_limit(completion: str, limit: int) -> bool:
    return len(completion) <= limit


def test_a_task_declared_in_tasks_alone_is_evaluated_by_the_accuracy_command(
    tiny_model_dir, tmp_path, monkeypatch
):
    from rlhfkit.cli import main as cli_main

    monkeypatch.setitem(TASKS, "short-reply", Task(read_limits, fits_the_limit))
    problems = tmp_path / "limits.jsonl"
    problems.write_text("".join(json.dumps({"limit": n}) + "\n" for n in LIMITS))
    out = tmp_path / "eval"
    args = ["eval", "gsm8k", "task=short-reply", f"models=base={tiny_model_dir}", f"data={problems}",
            "max_response_length=6", f"out={out}"]
    assert cli_main(args) == 0

    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert [a["answer"] for a in answers] == LIMITS
    right = [fits_the_limit(a["base"], a["answer"]) for a in answers]
    assert [a["base_correct"] for a in answers] == right
    assert 0 < sum(right) < len(LIMITS)  # the grader told answers apart, so a grade written wrong would show
    written = json.loads((out / "accuracy.json").read_text())
    assert written["task"] == "short-reply" and list(written["tables"]) == ["all"]  # no calculator steps to split by
    (base,) = written["tables"]["all"]
    assert base["problems"] == len(LIMITS) and base["greedy_accuracy"] == sum(right) / len(LIMITS)
    assert "Accuracy on short-reply" in (out / "report.html").read_text()
