"""GSM8K (Cobbe et al. 2021) as prompts with a verifiable answer.

A record is a grade-school word problem (`question`) and a worked solution (`answer`) whose last line
is `#### <number>`; the solution marks each arithmetic step with a calculator annotation `<<48/2=24>>`.
The prompt is the question as one user message rendered with the model's chat template, followed by
`INSTRUCTION`, which asks for the final line the answer-format reward checks. The reference number is
kept as the `answer` column that the exact-match reward reads.

SFT trains on the reference solution in the form the prompt asks for (`sft_solution`): its calculator
annotations kept, its last line `#### N` written as `The answer is N.`, the line the `format` reward checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from .records import SkipLog, has_text, iter_rows, require_fields
from .tldr import SFTRecord, text_id

GSM8K_FIELDS = ["question", "answer"]
INSTRUCTION = 'Solve it step by step, then end with "The answer is N." where N is the final number.'
FINAL_MARK = "####"
CALCULATOR = re.compile(r"<<[^>]*>>")


def final_number(solution: str) -> str | None:
    """The reference answer after the solution's last `####`, without thousands separators."""
    if FINAL_MARK not in solution:
        return None
    number = solution.rsplit(FINAL_MARK, 1)[1].strip().replace(",", "")
    return number or None


def calculator_steps(solution: str) -> int:
    """Calculator annotations in a reference solution: a measure of how many steps it takes."""
    return len(CALCULATOR.findall(solution))


def sft_solution(solution: str) -> str:
    """A reference solution as SFT trains on it: its steps as they are, calculator annotations included, and
    its last line `#### N` replaced by `The answer is N.` (N as `final_number` gives it), the line INSTRUCTION
    asks for."""
    number = final_number(solution)
    if number is None:
        raise ValueError(f"a GSM8K solution ends with `{FINAL_MARK} N`; this one does not: {solution[-80:]!r}")
    steps = solution.rsplit(FINAL_MARK, 1)[0].rstrip()
    return "\n".join(filter(None, [steps, f"The answer is {number}."]))


def gsm8k_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question.strip()}\n\n{INSTRUCTION}"}]


def load_gsm8k(paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """GSM8K problems as conversational prompts; the reference solution is the record's reference
    completion and its final number the `answer` column."""
    return read_gsm8k(paths, hf_split, lambda solution: solution)


def load_gsm8k_sft(paths: list[str], hf_split: str = "") -> tuple[list[SFTRecord], SkipLog]:
    """GSM8K problems as SFT examples: the same prompts and columns as `load_gsm8k`, the completion the
    reference solution as `sft_solution` writes it."""
    return read_gsm8k(paths, hf_split, sft_solution)


def read_gsm8k(paths: list[str], hf_split: str, completion: Callable[[str], str]) -> tuple[list[SFTRecord], SkipLog]:
    """GSM8K records as conversational prompts with `completion(solution)` as the reference completion."""
    log, records = SkipLog(), []
    for row in iter_rows(paths, hf_split):
        if row.first_in_source:
            require_fields(row, GSM8K_FIELDS, "gsm8k")
        data = row.data
        if not isinstance(data, dict) or not has_text(data.get("question")):
            log.skip("no_question", row.where)
            continue
        solution = data.get("answer")
        number = final_number(solution) if isinstance(solution, str) else None
        if number is None:
            log.skip("no_final_answer", row.where)
            continue
        messages = json.dumps(gsm8k_messages(data["question"]))
        columns = {"answer": number, "solution": solution, "calculator_steps": calculator_steps(solution)}
        records.append(
            SFTRecord(
                text_id(data["question"]), {"messages": messages}, completion(solution), row.where, "chat", columns
            )
        )
    log.kept = len(records)
    return records, log
