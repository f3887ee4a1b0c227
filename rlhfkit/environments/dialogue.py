"""HH-RLHF dialogues as episodes: the human's turns are replayed and the policy writes every assistant
turn. The episode's prompt is the dialogue's first human turn as a chat message; after each of the
policy's turns (ended by its EOS) the next human turn follows as a user message, until
`max_human_turns` human turns have been given or the dialogue has no more.

Scoring is at the end: the reward model reads the whole dialogue, every policy turn and every human turn,
at the episode's last token, as it reads a single response at its EOS (Detail 12). HH's preference labels
compare whole dialogues, which is what its reward models learn to score. A caveat the report repeats:
the later human turns were written in reply to the dataset's assistant turns, not to the policy's, so
they can read oddly after what the policy said."""

from __future__ import annotations

import dataclasses
import json

from transformers import PreTrainedTokenizerBase

from ..data.formats import CHAT
from ..data.hh import human_turns
from ..errors import UserError
from .base import Environment, EpisodeStart, Reply

TURNS_COLUMN = "human_turns"


class HHDialogue(Environment):
    counts = ("max_human_turns",)

    def __init__(self, start: EpisodeStart, tokenizer: PreTrainedTokenizerBase, max_human_turns: int = 3):
        super().__init__(start, tokenizer)
        turns = start.columns.get(TURNS_COLUMN)
        if not isinstance(turns, list):
            raise UserError(
                f"environment hh-dialogue needs the {TURNS_COLUMN!r} column its episode_record writes: "
                "give HH-RLHF data (prompt_format=hh)"
            )
        self.waiting = list(turns[1:max_human_turns])

    @classmethod
    def episode_record(cls, record):
        """An HH prompt (the dialogue up to its last "Assistant:") as a chat of its first human turn, the
        human turns kept in the `human_turns` column."""
        turns = human_turns(record.fields.get("dialogue", ""))
        if not turns:
            return record
        messages = json.dumps([{"role": "user", "content": turns[0]}])
        return dataclasses.replace(
            record, fields={"messages": messages}, task=CHAT, columns={**record.columns, TURNS_COLUMN: turns}
        )

    def respond(self, turn_ids: list[int], turn_text: str, ended_by_eos: bool) -> Reply:
        if not self.waiting:
            return Reply.end()
        return self.message("user", self.waiting.pop(0))
