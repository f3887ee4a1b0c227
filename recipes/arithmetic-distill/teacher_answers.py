"""The teacher's greedy answers to the training problems as SFT data (off-policy distillation): each problem's
prompt as GSM8K's chat prompt, the teacher's answer as the assistant turn, from `rlhfkit eval gsm8k`'s answers.jsonl.

Usage: python recipes/arithmetic-distill/teacher_answers.py ANSWERS.jsonl TRAIN.jsonl OUT.jsonl [POLICY]
"""

import json
import sys
from pathlib import Path

from rlhfkit.data.gsm8k import gsm8k_messages


def main(answers_path: str, train_path: str, out_path: str, policy: str = "teacher") -> None:
    problems = [json.loads(line) for line in Path(train_path).read_text().splitlines() if line.strip()]
    answers = [json.loads(line) for line in Path(answers_path).read_text().splitlines() if line.strip()]
    rows = []
    for answer in answers:
        line = int(answer["where"].rsplit(":", 1)[1])  # the problem's line in TRAIN.jsonl, 1-based
        rows.append({"prompt": gsm8k_messages(problems[line - 1]["question"]),
                     "completion": [{"role": "assistant", "content": answer[policy]}]})
    Path(out_path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    right = sum(answer[f"{policy}_correct"] for answer in answers)
    print(f"{len(rows)} teacher answers ({right} right) written to {out_path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
