"""The ecosystem's dataset formats (TRL's, https://huggingface.co/docs/trl/dataset_formats; docs/data-formats.md).

| kind              | columns                          | read by                            |
| ----------------- | -------------------------------- | ---------------------------------- |
| prompt-only       | prompt                           | on-policy stages, `rlhfkit generate` |
| prompt-completion | prompt, completion               | SFT                                |
| language-modeling | text (conversational: messages)  | SFT                                |
| preference        | [prompt,] chosen, rejected       | reward model, DPO                  |

Each comes in standard form (strings) or conversational form (lists of `{role, content}` messages,
rendered with the tokenizer's chat template: `formats.CHAT`); the first record decides which, and the
kind, which columns it reads and whether a preference prompt is explicit (`Layout`). The `*_field`
options rename the columns (`FieldNames`).

- A conversational completion, chosen or rejected response is one assistant message: its content is
  the response, encoded as text + EOS after the rendered prompt.
- Preference with an implicit prompt: the prompt is what chosen and rejected share. Strings: their
  common prefix cut back to the last whitespace, so no word is split and the responses start with the
  space as after an explicit prompt. Conversations: every message but the last, an assistant turn.
- Language modelling: a text has no prompt, so the whole text is the completion after an empty query
  (the SFT collator and loss take one; `tokenize_sft` lets such a row use the query's token budget
  too); a conversation's prompt is every message before its final assistant turn.
- Prompt ids are the `text_id` of the prompt, so a split by prompt keeps prompts disjoint; a text
  without a prompt is identified by itself.

Records that cannot be used are skipped and counted in the `SkipLog` by reason, with the column name:
missing_field, non_string, not_messages, empty, not_one_assistant_message, no_final_assistant_turn,
prompt_mismatch, no_common_prompt, empty_response, tie.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ..config.sections import FieldNames
from .formats import CHAT
from .records import Row, SkipLog, Unparsable, has_text, iter_rows, require_fields, unless_lone_surrogate
from .tldr import Comparison, SFTRecord, text_id

PROMPT_ONLY, PROMPT_COMPLETION, LANGUAGE_MODELING, PREFERENCE = (
    "prompt-only",
    "prompt-completion",
    "language-modeling",
    "preference",
)
TEXT = "text"  # formats' task of a plain-text prompt
HUB_SPLIT = "_hub_split"  # added by records.iter_hub: the reader's, not one of the dataset's columns
TRAILING_WORD = re.compile(r"\S*$")


class Skip(Exception):
    """A record that cannot be used; the message is its SkipLog reason."""


@dataclass(frozen=True)
class Layout:
    """How a generic dataset's records are read, decided from its first record."""

    kind: str
    prompt: str | None  # the prompt column; None: implicit (preference) or none (language-modeling text)
    responses: tuple[str, ...]  # the columns after the prompt: (completion,), (chosen, rejected), (text,), ()
    conversational: bool
    reference: str | None = None  # prompt-only: a completion column, read as the reference the evaluations compare with

    @property
    def required(self) -> list[str]:
        return [c for c in (self.prompt, *self.responses) if c is not None]

    @property
    def read(self) -> list[str]:
        """Every column the layout reads; the others are passed on as the record's `columns`."""
        return self.required + ([self.reference] if self.reference else [])

    def describe(self) -> str:
        parts = [self.kind]
        if self.kind == PREFERENCE:
            parts.append("explicit prompt" if self.prompt else "implicit prompt")
        parts.append("conversational" if self.conversational else "standard")
        return ", ".join(parts)


def is_conversation(value: Any) -> bool:
    return isinstance(value, list)


def prompt_only_layout(record: dict, names: FieldNames) -> Layout | None:
    if names.prompt not in record:
        return None
    reference = names.completion if names.completion in record else None
    return Layout(PROMPT_ONLY, names.prompt, (), is_conversation(record[names.prompt]), reference)


def prompt_completion_layout(record: dict, names: FieldNames) -> Layout | None:
    if names.prompt not in record or names.completion not in record:
        return None
    return Layout(PROMPT_COMPLETION, names.prompt, (names.completion,), is_conversation(record[names.prompt]))


def language_modeling_layout(record: dict, names: FieldNames) -> Layout | None:
    column = next((c for c in names.text_columns() if c in record), None)
    return None if column is None else Layout(LANGUAGE_MODELING, None, (column,), is_conversation(record[column]))


def preference_layout(record: dict, names: FieldNames) -> Layout | None:
    if names.chosen not in record or names.rejected not in record:
        return None
    conversational = is_conversation(record[names.chosen])
    # TRL's rule: a prompt column in the other form is a copy of the prompt the responses already hold
    # (HuggingFaceH4/ultrafeedback_binarized: a string beside whole conversations), so the prompt is implicit
    explicit = names.prompt in record and is_conversation(record[names.prompt]) == conversational
    return Layout(PREFERENCE, names.prompt if explicit else None, (names.chosen, names.rejected), conversational)


LAYOUTS = {
    PROMPT_ONLY: prompt_only_layout,
    PROMPT_COMPLETION: prompt_completion_layout,
    LANGUAGE_MODELING: language_modeling_layout,
    PREFERENCE: preference_layout,
}


def layout_for(kind: str, record: dict, names: FieldNames) -> Layout | None:
    """The layout of `kind` for data whose first record is `record`; None when it lacks the kind's columns."""
    return LAYOUTS[kind](record, names)


def kind_columns(kind: str, names: FieldNames) -> str:
    """The columns of `kind`, as an error message lists them."""
    return {
        PROMPT_ONLY: names.prompt,
        PROMPT_COMPLETION: f"{names.prompt}, {names.completion}",
        LANGUAGE_MODELING: " or ".join(names.text_columns()),
        PREFERENCE: f"{names.chosen}, {names.rejected}, optionally {names.prompt}",
    }[kind]


# ---------------------------------------------------------------- one record


def as_messages(value: Any) -> list[dict[str, str]] | None:
    """A conversation as a list of {role, content} with string values (other keys dropped), or None."""
    if not isinstance(value, list) or not value:
        return None
    if not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        return None
    return [{"role": m["role"], "content": m["content"]} for m in value]


def read_value(data: dict, column: str, conversational: bool) -> str | list[dict[str, str]]:
    """A column's string (standard) or messages (conversational), holding some text."""
    if data.get(column) is None:  # absent, or a missing value in a parquet file or hub dataset
        raise Skip(f"missing_field:{column}")
    if conversational:
        value = as_messages(data[column])
        if value is None:
            raise Skip(f"not_messages:{column}")
        texts = [m["content"] for m in value]
    else:
        value = data[column]
        if not isinstance(value, str):
            raise Skip(f"non_string:{column}")
        texts = [value]
    if not any(has_text(t) for t in texts):
        raise Skip(f"empty:{column}")
    return value


def response_text(value: str | list[dict[str, str]], column: str) -> str:
    """A completion, chosen or rejected response: a string as it is, or its one assistant message's content."""
    if isinstance(value, str):
        return value
    if len(value) != 1 or value[0]["role"] != "assistant":
        raise Skip(f"not_one_assistant_message:{column}")
    return value[0]["content"]


def split_final_turn(messages: list[dict[str, str]], column: str) -> tuple[list[dict[str, str]], str]:
    """(every message before the final assistant turn, that turn's content)."""
    if messages[-1]["role"] != "assistant":
        raise Skip(f"no_final_assistant_turn:{column}")
    return messages[:-1], messages[-1]["content"]


def split_common_prefix(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen response, rejected response): the shared prefix, cut back to its last
    whitespace so that no word is split, with trailing whitespace left to the responses."""
    common = os.path.commonprefix([chosen, rejected])
    prompt = common[: TRAILING_WORD.search(common).start()].rstrip()
    if not has_text(prompt):
        raise Skip("no_common_prompt")
    return prompt, chosen[len(prompt) :], rejected[len(prompt) :]


def split_implicit_prompt(chosen: Any, rejected: Any, layout: Layout) -> tuple[str | list[dict[str, str]], str, str]:
    """(prompt, chosen response, rejected response) of a pair whose prompt is what both share."""
    if not layout.conversational:
        return split_common_prefix(chosen, rejected)
    chosen_column, rejected_column = layout.responses
    (prompt, chosen_text), (rejected_prompt, rejected_text) = (
        split_final_turn(chosen, chosen_column),
        split_final_turn(rejected, rejected_column),
    )
    if prompt != rejected_prompt:
        raise Skip("prompt_mismatch")
    if not prompt:
        raise Skip("no_common_prompt")
    return prompt, chosen_text, rejected_text


def prompt_task(prompt: str | list[dict[str, str]]) -> tuple[str, dict[str, str]]:
    """(task, fields) of a prompt: plain text, or messages for the chat template."""
    if isinstance(prompt, str):
        return TEXT, {"prompt": prompt}
    # unescaped: a lone surrogate stays visible to `unless_lone_surrogate`
    return CHAT, {"messages": json.dumps(prompt, ensure_ascii=False)}


def prompt_id(prompt: str | list[dict[str, str]], completion: str) -> str:
    """The prompt's `text_id`; a record without a prompt (language modelling) is identified by its text."""
    if not prompt:
        return text_id(completion)
    return text_id(prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False))


def other_columns(data: dict, layout: Layout) -> dict[str, Any]:
    """The columns the layout does not read: reward functions of on-policy stages take them."""
    return {k: v for k, v in data.items() if k not in layout.read and k != HUB_SPLIT}


def optional_reference(data: dict, layout: Layout) -> str:
    """prompt-only: the reference completion when the record has a usable one, else ""."""
    if layout.reference is None:
        return ""
    try:
        return response_text(read_value(data, layout.reference, layout.conversational), layout.reference)
    except Skip:
        return ""


def prompt_and_completion(data: dict, layout: Layout) -> tuple[str | list[dict[str, str]], str]:
    """(prompt, completion) of a prompt-only, prompt-completion or language-modeling record."""
    if layout.kind == PROMPT_ONLY:
        return read_value(data, layout.prompt, layout.conversational), optional_reference(data, layout)
    [column] = layout.responses
    value = read_value(data, column, layout.conversational)
    if layout.kind == LANGUAGE_MODELING:
        return split_final_turn(value, column) if layout.conversational else ("", value)
    return read_value(data, layout.prompt, layout.conversational), response_text(value, column)


def sft_record(row: Row, layout: Layout) -> SFTRecord:
    prompt, completion = prompt_and_completion(row.data, layout)
    if layout.kind != PROMPT_ONLY and not has_text(completion):
        raise Skip(f"empty:{layout.responses[0]}")
    task, fields = prompt_task(prompt)
    return SFTRecord(
        prompt_id(prompt, completion), fields, completion, row.where, task, other_columns(row.data, layout),
        cut_when_long=True,
    )


def comparison_record(row: Row, layout: Layout) -> Comparison:
    chosen_column, rejected_column = layout.responses
    chosen = read_value(row.data, chosen_column, layout.conversational)
    rejected = read_value(row.data, rejected_column, layout.conversational)
    if layout.prompt is None:
        prompt, chosen_text, rejected_text = split_implicit_prompt(chosen, rejected, layout)
    else:
        prompt = read_value(row.data, layout.prompt, layout.conversational)
        chosen_text, rejected_text = response_text(chosen, chosen_column), response_text(rejected, rejected_column)
    if not has_text(chosen_text) or not has_text(rejected_text):
        raise Skip("empty_response")
    if chosen_text.strip() == rejected_text.strip():
        raise Skip("tie")
    task, fields = prompt_task(prompt)
    return Comparison(
        prompt_id(prompt, ""),
        task,
        fields,
        chosen_text,
        rejected_text,
        row.where,
        split=str(row.data.get(HUB_SPLIT) or ""),
        cut_when_long=True,
    )


def parse_row(row: Row, layout: Layout, log: SkipLog) -> SFTRecord | Comparison | None:
    if isinstance(row.data, Unparsable):
        log.skip(row.data.reason, row.where)
        return None
    if row.first_in_source:  # every file must hold the columns the first one was read with
        require_fields(row, layout.required, layout.describe())
    if not isinstance(row.data, dict):
        log.skip("not_an_object", row.where)
        return None
    try:
        record = comparison_record(row, layout) if layout.kind == PREFERENCE else sft_record(row, layout)
    except Skip as skip:
        log.skip(str(skip), row.where)
        return None
    return unless_lone_surrogate(record, row.where, log)


def read_generic(
    layout: Layout, paths: list[str], hf_split: str = ""
) -> tuple[list[SFTRecord] | list[Comparison], SkipLog]:
    """The records of `paths` in `layout`: `Comparison`s for preference data, `SFTRecord`s otherwise."""
    log = SkipLog()
    records = [r for row in iter_rows(paths, hf_split) if (r := parse_row(row, layout, log)) is not None]
    log.kept = len(records)
    return records, log
