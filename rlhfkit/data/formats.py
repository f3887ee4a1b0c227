"""Query and completion formatting (Details 2-3).

- Detail 2: the query template, and truncation that drops the post's last paragraph (at `\\n`)
  until the query fits; only a single paragraph that is still too long is cut by tokens, and
  that is reported (`QueryTokens.token_cut`). A query keeps some text of its post: a record of which
  none fits is skipped (`QueryTooLong`), and only a template that alone is too long fails the run.
- Detail 3: a completion is a leading space, the text, then EOS; no trailing space after `TL;DR:`.

Data in the ecosystem's generic formats uses two more tasks. `text`: the prompt string as it is,
truncated by dropping its earliest lines, keeping its last line (the question, or a cue such as
`TL;DR:`) whole; `chat`: a list of `{role, content}` messages rendered with the tokenizer's chat
template and its generation prompt, truncated by dropping its earliest turns, then cutting the last.
Their completions are the text as it is, then EOS: no space is added, since neither prompt ends in a
marker like `TL;DR:` (in a chat template the assistant's turn ends with the EOS token itself).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError, DataFormatError, UserError
from .records import has_text

# Detail 2: the query template of Stiennon et al. 2020 (no trailing space after "TL;DR:").
TLDR_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
CNNDM_TEMPLATE = "Article:\n{article}\n\nTL;DR:"
HH_TURN = "\n\nHuman:"
HH_ASSISTANT = "\n\nAssistant:"


class QueryTooLong(DataFormatError):
    """A prompt of which no text fits in max_query_length beside the rest of its query: the tokenizers
    skip its record (`query_too_long`); where one prompt is asked for, it is the error."""


@dataclass(frozen=True)
class QueryFormat:
    template: str
    truncate_field: str
    separator: str  # truncation drops text after the last separator (`keep="head"`) or before the first
    keep: str  # "head" keeps the start of the field (posts), "tail" keeps the end (dialogues)
    ending: str = ""  # the field's ending starts at its last one of these: it asks for the completion (`split_ending`)


QUERY_FORMATS = {
    "tldr": QueryFormat(TLDR_TEMPLATE, "post", "\n", "head"),
    "cnndm": QueryFormat(CNNDM_TEMPLATE, "article", "\n", "head"),
    "hh": QueryFormat("{dialogue}", "dialogue", HH_TURN, "tail", HH_ASSISTANT),
    "text": QueryFormat("{prompt}", "prompt", "\n", "tail", "\n"),
}
CHAT = "chat"  # fields {"messages": JSON list of {role, content}}, rendered by the chat template
SPACED_TASKS = ("tldr", "cnndm", "hh")  # Detail 3: completions after these prompts start with a space


@dataclass
class QueryTokens:
    ids: list[int]
    text: str
    original_length: int  # tokens before truncation
    paragraphs_dropped: int
    token_cut: bool  # a single paragraph was still too long and was cut by tokens

    @property
    def truncated(self) -> bool:
        return self.paragraphs_dropped > 0 or self.token_cut


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Plain text to ids; special-token strings inside user text (e.g. a literal `[PAD]`) stay text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def format_query(task: str, fields: dict[str, str]) -> str:
    return QUERY_FORMATS[task].template.format(**fields)


def has_content(text: str, fmt: QueryFormat) -> bool:
    """Some text besides the format's separators (a dialogue's `\\n\\nHuman:` is no content)."""
    return has_text(text.replace(fmt.separator, ""))


def drop_one_paragraph(text: str, fmt: QueryFormat) -> str | None:
    """The text less its last paragraph (head) or its first turn (tail); None when only one is left."""
    if fmt.keep == "head":
        index = text.rstrip().rfind(fmt.separator)
        return text[:index].rstrip() if index > 0 else None
    index = text.find(fmt.separator, len(fmt.separator))
    return text[index:] if index > 0 and has_content(text[index:], fmt) else None


def split_ending(fmt: QueryFormat, text: str) -> tuple[str, str]:
    """(content, ending) of a truncated field: a prompt's last line (`...\\nTL;DR:`, a question), a dialogue's
    last `\\n\\nAssistant:` turn. Truncation cuts the content and keeps the ending whole, so that it cannot
    drop the content and leave the ending alone; a field with no text before an ending is all content."""
    index = text.rstrip().rfind(fmt.ending) if fmt.ending else -1
    if index < 0 or not has_text(text[:index]):
        return text, ""
    return text[:index], text[index:]


@dataclass(frozen=True)
class QueryParts:
    """A query's template fields, with the field that truncation cuts split into its content and its ending."""

    task: str
    fields: dict[str, str]
    ending: str

    @property
    def format(self) -> QueryFormat:
        return QUERY_FORMATS[self.task]

    def text(self, content: str) -> str:
        return format_query(self.task, {**self.fields, self.format.truncate_field: content + self.ending})

    def length(self, tokenizer: PreTrainedTokenizerBase, content: str) -> int:
        return len(encode_text(tokenizer, self.text(content)))


def cut_by_tokens(tokenizer: PreTrainedTokenizerBase, parts: QueryParts, content: str, max_length: int) -> str:
    """Fallback for one paragraph that alone is too long: its first (head) or last (tail) tokens, as many
    as fit ("" when none do)."""
    ids = encode_text(tokenizer, content)
    keep = max(len(ids) - (parts.length(tokenizer, content) - max_length), 0)
    while True:
        kept = tokenizer.decode(ids[:keep] if parts.format.keep == "head" else ids[len(ids) - keep :])
        if parts.length(tokenizer, kept) <= max_length or keep == 0:
            return kept
        keep -= 1


def rest_and_content(
    tokenizer: PreTrainedTokenizerBase, task: str, fields: dict[str, str], max_length: int
) -> tuple[QueryParts, str]:
    """(the rest of the query, the content that truncation cuts): the field's ending stays whole, unless
    it does not fit even alone; then it is no cue but content (a long last line)."""
    field = QUERY_FORMATS[task].truncate_field
    content, ending = split_ending(QUERY_FORMATS[task], fields[field])
    parts = QueryParts(task, fields, ending)
    if ending and parts.length(tokenizer, "") > max_length:
        return QueryParts(task, fields, ""), fields[field]
    return parts, content


def fit_content(
    tokenizer: PreTrainedTokenizerBase, parts: QueryParts, content: str, max_length: int
) -> tuple[str, int, bool] | None:
    """Detail 2 on `content`: (the query, paragraphs dropped, whether one was cut by tokens) when some text
    of the content fits beside the rest of the query; None when none does."""
    fmt, dropped = parts.format, 0
    while parts.length(tokenizer, content) > max_length and (shorter := drop_one_paragraph(content, fmt)) is not None:
        content, dropped = shorter, dropped + 1
    token_cut = parts.length(tokenizer, content) > max_length
    if token_cut:
        content = cut_by_tokens(tokenizer, parts, content, max_length)
    if parts.length(tokenizer, content) > max_length or not has_content(content, fmt):
        return None
    return parts.text(content), dropped, token_cut


def too_long(tokenizer: PreTrainedTokenizerBase, task: str, max_length: int) -> UserError:
    """`too_long_error` of a query in `task`'s template, measured with every field empty."""
    names = [name for _, name, _, _ in string.Formatter().parse(QUERY_FORMATS[task].template) if name]
    alone = len(encode_text(tokenizer, format_query(task, dict.fromkeys(names, ""))))
    return too_long_error(
        f"{task} query template (every field empty)", alone, QUERY_FORMATS[task].truncate_field, max_length
    )


def too_long_error(template: str, alone: int, content: str, max_length: int) -> UserError:
    """The error of a query that no truncation fits: the run's, when the template alone (`alone` tokens) is
    longer than `max_length`; else the record's, which the tokenizers skip."""
    if alone > max_length:
        return ConfigError(
            f"the {template} alone is {alone} tokens, longer than max_query_length={max_length}; "
            f"raise max_query_length above {alone}"
        )
    return QueryTooLong(
        f"no text of the prompt's {content} fits in max_query_length={max_length} tokens beside the rest of its "
        "query; raise max_query_length"
    )


def encode_query(tokenizer: PreTrainedTokenizerBase, task: str, fields: dict[str, str], max_length: int) -> QueryTokens:
    """Detail 2: format the query and truncate at paragraph boundaries until it fits `max_length` tokens,
    keeping some of its content: a query that cannot is `too_long`."""
    if task == CHAT:
        return encode_chat_query(tokenizer, json.loads(fields["messages"]), max_length)
    text = format_query(task, fields)
    ids = encode_text(tokenizer, text)
    if len(ids) <= max_length:
        return QueryTokens(ids, text, len(ids), 0, False)
    fitted = fit_content(tokenizer, *rest_and_content(tokenizer, task, fields, max_length), max_length)
    if fitted is None:
        raise too_long(tokenizer, task, max_length)
    truncated, dropped, token_cut = fitted
    return QueryTokens(encode_text(tokenizer, truncated), truncated, len(ids), dropped, token_cut)


def require_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"the data is conversational (lists of {{role, content}} messages) but the tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '')!r} has no chat template: use a model whose tokenizer has one "
            "(an instruct model), or give the data as plain text"
        )


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Messages as the model's chat template writes them, ending (for a prompt) with the header of
    the assistant's turn that the completion continues."""
    require_chat_template(tokenizer)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def encode_rendered(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A rendered chat to ids: the template's own special tokens (`<|im_start|>`) are read as such."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_chat_query(tokenizer: PreTrainedTokenizerBase, messages: list[dict], max_length: int) -> QueryTokens:
    """A conversation rendered with the generation prompt; while too long, its earliest turn after
    any system message is dropped; a last turn that alone is too long is cut to its first tokens."""
    ids = encode_rendered(tokenizer, render_chat(tokenizer, messages))
    original_length, dropped, token_cut = len(ids), 0, False
    system = 1 if messages and messages[0].get("role") == "system" else 0
    while len(ids) > max_length and len(messages) > system + 1:
        messages = messages[:system] + messages[system + 1 :]
        dropped += 1
        ids = encode_rendered(tokenizer, render_chat(tokenizer, messages))
    if len(ids) > max_length:
        messages, token_cut = cut_last_turn(tokenizer, messages, max_length), True
        ids = encode_rendered(tokenizer, render_chat(tokenizer, messages))
    return QueryTokens(ids, render_chat(tokenizer, messages), original_length, dropped, token_cut)


def cut_last_turn(tokenizer: PreTrainedTokenizerBase, messages: list[dict], max_length: int) -> list[dict]:
    """The messages with the last one's content cut to its first tokens, as many as fit; a conversation
    of which no text of that content fits is `chat_too_long`."""
    last = messages[-1]
    content = encode_text(tokenizer, last["content"])
    excess = len(encode_rendered(tokenizer, render_chat(tokenizer, messages))) - max_length
    for keep in range(max(len(content) - excess, 0), 0, -1):
        trial = messages[:-1] + [{**last, "content": tokenizer.decode(content[:keep])}]
        if len(encode_rendered(tokenizer, render_chat(tokenizer, trial))) <= max_length:
            if has_text(trial[-1]["content"]):  # fewer tokens would not hold any more text
                return trial
            break
    raise chat_too_long(tokenizer, max_length)


def chat_too_long(tokenizer: PreTrainedTokenizerBase, max_length: int) -> UserError:
    """`too_long_error` of a conversation, whose template alone is one user turn with no content."""
    alone = len(encode_rendered(tokenizer, render_chat(tokenizer, [{"role": "user", "content": ""}])))
    return too_long_error("chat template (one empty user turn)", alone, "last message", max_length)


def completion_text(text: str) -> str:
    """Detail 3: exactly one leading space, so the query can end in `TL;DR:` with no trailing space.

    Upstream summaries already start with a space and the reference code added another; we
    normalise to one.
    """
    return " " + text.strip()


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str, task: str = "tldr") -> list[int]:
    """Detail 3: leading space + text + EOS after the seeds' prompts; text + EOS after generic ones."""
    body = completion_text(text) if task in SPACED_TASKS else text
    return encode_text(tokenizer, body) + [tokenizer.eos_token_id]
