"""What an environment is: the other side of a multi-turn episode (docs/environments.md).

An episode starts from a dataset record's prompt. The policy samples a turn; the turn stops at the
policy's EOS or where the environment asks it to pause (`pauses_after`: the calculator pauses on
`<<48/2=`). The environment then answers (`respond`) with a `Reply`:

    ids inside the turn       a tool result the policy continues after (`Reply.inline`: "24>>")
    a new message             a user or tool turn, opened after the policy's EOS (`Reply.message`:
                              the chat template's separator, the message and the next assistant header)
    done                      the end of the episode, with an optional reward

The episode is kept as the ids that were sampled and inserted, never re-tokenised from text, and only the
sampled ids are trained on (`RolloutBatch.policy_mask`). An environment must be a function of its record,
its seed and the tokens it has seen: that is what makes a resumed run and a run split across processes
sample exactly the same episodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from .chat_turns import turn_suffix


@dataclass(frozen=True)
class EpisodeStart:
    """What an environment is built from: the record's prompt as the reward functions see it (a chat's
    messages, or the query's text), its dataset columns, and a seed of its own."""

    prompt: list[dict] | str
    columns: dict[str, Any]
    seed: int


@dataclass
class Reply:
    """An environment's answer to a turn. `ids` are inserted as they are; `message` is the chat message
    they open (None: text inside the policy's turn); with `done` the episode ends here."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    message: dict | None = None
    done: bool = False
    reward: float | None = None  # counted where the environment declares `has_reward`

    @classmethod
    def end(cls, reward: float | None = None) -> Reply:
        return cls(done=True, reward=reward)


class Environment:
    """One episode's environment. Subclasses implement `respond`, and may pause turns (`pauses_after`),
    rewrite the dataset record into the episode's prompt (`episode_record`), and declare what they report:
    `component_names` (what `components` returns at the episode's end, each logged as env/<name>) and
    `has_reward` (the `environment` reward component), and name the constructor's arguments that count
    something (`counts`: refused below 0 before anything loads). Built once per episode as
    `Class(start, tokenizer, **environment_args)`, whose values are checked against the constructor's
    annotations first."""

    component_names: tuple[str, ...] = ()
    has_reward: bool = False
    counts: tuple[str, ...] = ()

    def __init__(self, start: EpisodeStart, tokenizer: PreTrainedTokenizerBase):
        self.start, self.tokenizer = start, tokenizer

    def pauses_after(self, turn_text: str) -> bool:
        """Whether the policy's turn, whose text since the last insertion is `turn_text`, stops here for
        `respond` (checked after every sampled token, only in classes that override it)."""
        return False

    def respond(self, turn_ids: list[int], turn_text: str, ended_by_eos: bool) -> Reply:
        """The answer to the policy's turn (its ids and text since the last insertion), which ended with
        the policy's EOS or, when not `ended_by_eos`, where `pauses_after` said. After an EOS the reply
        must end the episode or open a new message."""
        raise NotImplementedError

    def components(self) -> dict[str, float]:
        """What the episode's end reports, by name (`component_names`), however it ended: a truncated
        episode's too."""
        return {}

    @classmethod
    def episode_record(cls, record):
        """The dataset record as this environment's episodes start from it (default: unchanged)."""
        return record

    def inline(self, text: str) -> Reply:
        """`text` inserted inside the policy's turn, tokenised on its own."""
        return Reply(self.tokenizer.encode(text, add_special_tokens=False), text)

    def message(self, role: str, content: str) -> Reply:
        """A new `role` message after the policy's EOS, and the next assistant header, as the chat template
        renders them."""
        message = {"role": role, "content": content}
        return Reply(turn_suffix(self.tokenizer, message), content, message)


def overrides(environment: type, method: str) -> bool:
    return getattr(environment, method) is not getattr(Environment, method)
