"""Query and completion formatting (Details 2-3).

- Detail 2: the query template, and truncation that drops the post's last paragraph (at `\\n`)
  until the query fits; only a single paragraph that is still too long is cut by tokens, and
  that is reported (`QueryTokens.token_cut`).
- Detail 3: a completion is a leading space, the text, then EOS; no trailing space after `TL;DR:`.

Data in the ecosystem's generic formats uses two more tasks. `text`: the prompt string as it is,
truncated by dropping its earliest lines; `chat`: a list of `{role, content}` messages rendered with
the tokenizer's chat template and its generation prompt, truncated by dropping its earliest turns.
Their completions are the text as it is, then EOS: no space is added, since neither prompt ends in a
marker like `TL;DR:` (in a chat template the assistant's turn ends with the EOS token itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError

# Detail 2: the query template of Stiennon et al. 2020 (no trailing space after "TL;DR:").
TLDR_TEMPLATE = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
CNNDM_TEMPLATE = "Article:\n{article}\n\nTL;DR:"
HH_TURN = "\n\nHuman:"
HH_ASSISTANT = "\n\nAssistant:"


@dataclass(frozen=True)
class QueryFormat:
    template: str
    truncate_field: str
    separator: str  # truncation drops text after the last separator (`keep="head"`) or before the first
    keep: str  # "head" keeps the start of the field (posts), "tail" keeps the end (dialogues)


QUERY_FORMATS = {
    "tldr": QueryFormat(TLDR_TEMPLATE, "post", "\n", "head"),
    "cnndm": QueryFormat(CNNDM_TEMPLATE, "article", "\n", "head"),
    "hh": QueryFormat("{dialogue}", "dialogue", HH_TURN, "tail"),
    "text": QueryFormat("{prompt}", "prompt", "\n", "tail"),
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


def drop_one_paragraph(text: str, fmt: QueryFormat) -> str | None:
    """The text less its last paragraph (head) or its first turn (tail); None when only one is left."""
    if fmt.keep == "head":
        index = text.rstrip().rfind(fmt.separator)
        return text[:index].rstrip() if index > 0 else None
    index = text.find(fmt.separator, len(fmt.separator))
    return text[index:] if index > 0 else None


def cut_by_tokens(tokenizer: PreTrainedTokenizerBase, task: str, fields: dict[str, str], max_length: int) -> dict[str, str]:
    """Fallback for one paragraph that alone is too long: cut its tokens until the query fits."""
    fmt = QUERY_FORMATS[task]
    text = fields[fmt.truncate_field]
    ids = encode_text(tokenizer, text)
    excess = len(encode_text(tokenizer, format_query(task, fields))) - max_length
    keep = max(len(ids) - excess, 0)
    while True:
        kept = ids[:keep] if fmt.keep == "head" else ids[len(ids) - keep :]
        trial = {**fields, fmt.truncate_field: tokenizer.decode(kept)}
        if len(encode_text(tokenizer, format_query(task, trial))) <= max_length or keep == 0:
            return trial
        keep -= 1


def encode_query(tokenizer: PreTrainedTokenizerBase, task: str, fields: dict[str, str], max_length: int) -> QueryTokens:
    """Detail 2: format the query and truncate at paragraph boundaries until it fits `max_length` tokens."""
    if task == CHAT:
        return encode_chat_query(tokenizer, json.loads(fields["messages"]), max_length)
    fmt = QUERY_FORMATS[task]
    fields = dict(fields)
    ids = encode_text(tokenizer, format_query(task, fields))
    original_length, dropped, token_cut = len(ids), 0, False
    while len(ids) > max_length:
        shorter = drop_one_paragraph(fields[fmt.truncate_field], fmt)
        if shorter is None:
            fields = cut_by_tokens(tokenizer, task, fields, max_length)
            token_cut = True
        else:
            fields[fmt.truncate_field] = shorter
            dropped += 1
        ids = encode_text(tokenizer, format_query(task, fields))
        if token_cut and len(ids) > max_length:
            raise ConfigError(f"the {task} template alone is longer than max_query_length={max_length} tokens; raise it")
    return QueryTokens(ids, format_query(task, fields), original_length, dropped, token_cut)


def require_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the data is conversational (lists of {{role, content}} messages) but the tokenizer "
                          f"{getattr(tokenizer, 'name_or_path', '')!r} has no chat template: use a model whose tokenizer has one "
                          "(an instruct model), or give the data as plain text")


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
        last = messages[-1]
        content = encode_text(tokenizer, last["content"])
        keep = max(len(content) - (len(ids) - max_length), 0)
        while True:
            trial = messages[:-1] + [{**last, "content": tokenizer.decode(content[:keep])}]
            ids = encode_rendered(tokenizer, render_chat(tokenizer, trial))
            if len(ids) <= max_length or keep == 0:
                break
            keep -= 1
        if len(ids) > max_length:
            raise ConfigError(f"the chat template alone is longer than max_query_length={max_length} tokens; raise it")
        messages, token_cut = trial, True
    return QueryTokens(ids, render_chat(tokenizer, messages), original_length, dropped, token_cut)


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
