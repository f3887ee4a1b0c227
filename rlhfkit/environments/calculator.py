"""The GSM8K calculator (Cobbe et al. 2021): GSM8K's reference solutions mark each arithmetic step with
an annotation `<<48/2=24>>24`. When the policy has written `<<48/2=`, its turn pauses, the expression is
evaluated exactly (`arithmetic.calculate`, never Python's eval), and the result and `>>` are inserted;
the policy then goes on writing. An expression the calculator refuses, or a call past `max_calls`, gets
nothing inserted: the policy continues as if there were no calculator, and `env/tool_refused` counts it.
The episode ends at the policy's EOS; its correctness is the reward functions' to judge (`gsm8k`,
`format`), which read the whole text, the calculator's results included."""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

from .arithmetic import Refused, calculate
from .base import Environment, EpisodeStart, Reply

CALL = re.compile(r"<<([^<>=]*)=$")  # an annotation opened and its expression written, up to the "="
ANNOTATION = re.compile(r"<<[^<>=]*=[^<>]*>>")  # a whole annotation, its result written by the policy or inserted


class Gsm8kCalculator(Environment):
    component_names = ("tool_calls", "tool_refused")
    counts = ("max_calls",)

    def __init__(self, start: EpisodeStart, tokenizer: PreTrainedTokenizerBase, max_calls: int = 8):
        super().__init__(start, tokenizer)
        self.max_calls, self.calls, self.refused = max_calls, 0, 0

    def components(self) -> dict[str, float]:
        return {"tool_calls": self.calls, "tool_refused": self.refused}

    def pauses_after(self, turn_text: str) -> bool:
        # the text is decoded at every token: test its last character before the pattern
        return turn_text.endswith("=") and CALL.search(turn_text) is not None

    def respond(self, turn_ids: list[int], turn_text: str, ended_by_eos: bool) -> Reply:
        if ended_by_eos:
            return Reply.end()
        expression = CALL.search(turn_text).group(1)
        if self.calls >= self.max_calls:
            self.refused += 1
            return Reply()
        try:
            result = calculate(expression)
        except Refused:
            self.refused += 1
            return Reply()
        self.calls += 1
        return self.inline(f"{result}>>")
