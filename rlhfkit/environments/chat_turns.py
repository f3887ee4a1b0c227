"""Token rules for multi-turn episodes: the ids an environment inserts between assistant turns, and the ids the
chat template says an episode should hold.

An episode is ids and is never re-tokenised from text: the prompt (`encode_rendered(render_chat(messages))`, ending
with the assistant header), the policy's sampled turn ending with EOS, the ids an environment inserts (a user or tool
turn and the next assistant header: `turn_suffix`), the next sampled turn, and so on. A tool result written inside an
assistant turn (the calculator's `24>>` after the policy's `<<48/2=`) is part of that turn's ids.

- The separator: the template writes `<|im_end|>\\n` after every turn, but the policy stops at `<|im_end|>` (EOS), so
  the `\\n` belongs to the inserted ids. Rendering the new turn alone loses it (verl PR #6921).
- The system prompt: SmolLM2's template writes its default system prompt when the first message is not a system
  message, so a new turn rendered alone starts with `<|im_start|>system ...` (verl issue #6501). `turn_suffix`
  renders a dummy conversation with and without the new turn and keeps the difference after the dummy's last EOS
  (TRL's `_get_tool_suffix_ids`): whatever the template writes at the start of a conversation is in both renders.
- Splicing, not re-tokenising: the policy may sample ids that tokenising their text would not give (SmolLM2 has one
  `)=` token; the policy can write `)` then `=`; a tool result's ids follow the policy's as they are). The
  log-probabilities were computed on those ids, so `expected_episode_ids` renders the template with a sentinel in
  place of each assistant content, tokenises the template's text between sentinels, and splices the sampled ids in.
- Append-only: all of this needs a template whose rendering of a conversation is a prefix of its rendering with
  more turns. A template that rewrites earlier turns (drops their reasoning, counts the messages) would change ids
  the policy already conditioned on; `require_append_only` refuses it.
- Boundaries (the assumption that makes piece-wise tokenising exact): each template piece between two assistant
  contents starts with the EOS special token, where tokenisation starts afresh, and ends where a render with the
  generation prompt ends (SmolLM2: `assistant\\n`). Tokenised alone, a piece therefore gives the ids that the
  prompt's encoding and `turn_suffix` give. Tokenising a whole rendered conversation instead can merge the header's
  `\\n` with the content (SmolLM2: `\\n` + `  x` is `ĊĠ Ġx`); splicing does not depend on that boundary.
- Ends: an episode whose last assistant turn is complete ends at its EOS (the template's `\\n` after it is never
  sampled); a truncated last turn ends at its last sampled id.

Limits: the template must close each assistant turn with the tokenizer's EOS (checked) and write assistant content
as given, neither trimming it nor branching on it (not checkable: the sentinels stand in for the content).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

from transformers import PreTrainedTokenizerBase

from ..data.formats import encode_rendered, render_chat, require_chat_template
from ..errors import ConfigError

ASSISTANT = "assistant"
# the new turn is rendered after an assistant turn, as it is inserted after a sampled one
DUMMY = [{"role": "user", "content": "dummy question"}, {"role": ASSISTANT, "content": "dummy answer"}]
# the conversation whose renders `require_append_only` compares: a prompt, two exchanges, and one more user turn
PROBE = [
    {"role": "user", "content": "first question"},
    {"role": ASSISTANT, "content": "first answer"},
    {"role": "user", "content": "second question"},
    {"role": ASSISTANT, "content": "second answer"},
    {"role": "user", "content": "third question"},
]
CONTEXT_TOKENS = 10  # tokens shown on each side of a mismatch


@dataclass
class TokenMismatch:
    position: int  # the first index at which the two lists differ (or where the shorter one ends)
    expected: list[int]  # up to CONTEXT_TOKENS expected ids from `position`
    actual: list[int]  # up to CONTEXT_TOKENS actual ids from `position`
    context: str  # the decoded tokens before `position` and both continuations, for an error line


def turn_suffix(tokenizer: PreTrainedTokenizerBase, message: dict, add_generation_prompt: bool = True) -> list[int]:
    """The ids to insert right after the EOS that ended a sampled assistant turn so that `message` (a user or tool
    turn) follows and, with `add_generation_prompt`, the next assistant header opens. Without it the ids end at the
    message's own EOS (its trailing `\\n` comes with the next inserted ids, as after an assistant turn)."""
    before = through_last_eos(tokenizer, rendered_ids(tokenizer, DUMMY, add_generation_prompt=False))
    after = rendered_ids(tokenizer, [*DUMMY, message], add_generation_prompt)
    require_prefix(tokenizer, before, after, f"a {message['role']} turn after an assistant turn")
    suffix = after[len(before) :]
    if add_generation_prompt or tokenizer.eos_token_id not in suffix:
        return suffix
    return through_last_eos(tokenizer, suffix)


def require_append_only(tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse a tokenizer whose chat template rewrites earlier turns when a turn is added: each state an episode
    passes through (the prompt with its assistant header, each assistant turn through its EOS, the next user turn
    with the header) must be a prefix of the next, in ids."""
    require_chat_template(tokenizer)
    states = list(episode_states(tokenizer, PROBE))
    for k, (shorter, longer) in enumerate(pairwise(states), start=2):
        require_prefix(tokenizer, shorter, longer, f"message {k} ({PROBE[k - 1]['role']})")


def expected_episode_ids(
    tokenizer: PreTrainedTokenizerBase, prompt_messages: list[dict], turns: list[tuple[str, list[int] | str]]
) -> list[int]:
    """The ids after the prompt that the chat template gives for `prompt_messages` followed by `turns`, with each
    assistant turn's sampled ids (ending with EOS unless truncated) spliced in as they are. An episode ends at its
    last assistant turn's EOS, or its last id when truncated, or with the assistant header after inserted turns."""
    if not turns:
        return []
    check_turns(tokenizer, turns)
    sentinels = {i: sentinel(i) for i, (role, _) in enumerate(turns) if role == ASSISTANT}
    added = [{"role": role, "content": sentinels.get(i, content)} for i, (role, content) in enumerate(turns)]
    text = render_chat(tokenizer, prompt_messages + added, add_generation_prompt=turns[-1][0] != ASSISTANT)
    pieces = split_at(tokenizer, text, list(sentinels.values()))
    contents = [turns[i][1] for i in sentinels]
    ids = encode_rendered(tokenizer, pieces[0])
    for k, (content, piece) in enumerate(zip(contents, pieces[1:], strict=True)):
        ends_episode = k == len(contents) - 1 and turns[-1][0] == ASSISTANT
        ids += splice(tokenizer, content, encode_rendered(tokenizer, piece), ends_episode)
    prompt = rendered_ids(tokenizer, prompt_messages, add_generation_prompt=True)
    require_prefix(tokenizer, prompt, ids, "the episode's first assistant turn")
    return ids[len(prompt) :]


def first_mismatch(tokenizer: PreTrainedTokenizerBase, expected: list[int], actual: list[int]) -> TokenMismatch | None:
    """Where `actual` first departs from `expected` (a differing id, or one list ending early); None when equal."""
    shorter = min(len(expected), len(actual))
    position = next((i for i in range(shorter) if expected[i] != actual[i]), shorter)
    if position == len(expected) == len(actual):
        return None
    window = slice(position, position + CONTEXT_TOKENS)
    before = tokenizer.decode(expected[max(0, position - CONTEXT_TOKENS) : position])
    where = f"after {before!r}" if position else "at the start"
    context = f"{where}: expected {shown(tokenizer, expected[window])}, got {shown(tokenizer, actual[window])}"
    return TokenMismatch(position, expected[window], actual[window], context)


def shown(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Each id with its own text: two ids whose joined text is one token's (`)` `=` against `)=`) decode alike."""
    return "[" + ", ".join(f"{i}:{tokenizer.decode([i])!r}" for i in ids) + "]" if ids else "the end"


def rendered_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return encode_rendered(tokenizer, render_chat(tokenizer, messages, add_generation_prompt))


def through_last_eos(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    """`ids` up to and including their last EOS: the policy stops there, so what the template writes after the end
    of a turn (SmolLM2: `\\n`) is never sampled and comes with the ids inserted next."""
    eos = tokenizer.eos_token_id
    if eos not in ids:
        raise ConfigError(
            f"the chat template of {name(tokenizer)!r} does not end an assistant turn with the EOS token "
            f"{tokenizer.eos_token!r}, where sampling stops: multi-turn episodes need a template that does; "
            "set tokenizer.chat_template to one, or the tokenizer's eos_token to the template's end-of-turn token"
        )
    return ids[: len(ids) - ids[::-1].index(eos)]


def episode_states(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> Iterator[list[int]]:
    """The ids an episode holds after each message: after a user turn the render with the assistant header (what
    the policy continues), after an assistant turn the render through that turn's EOS."""
    for k, message in enumerate(messages, start=1):
        if message["role"] == ASSISTANT:
            yield through_last_eos(tokenizer, rendered_ids(tokenizer, messages[:k], add_generation_prompt=False))
        else:
            yield rendered_ids(tokenizer, messages[:k], add_generation_prompt=True)


def require_prefix(tokenizer: PreTrainedTokenizerBase, shorter: list[int], longer: list[int], added: str) -> None:
    """The template is append-only here: the ids before `added` are unchanged by it."""
    mismatch = first_mismatch(tokenizer, shorter, longer[: len(shorter)])
    if mismatch is not None:
        raise ConfigError(
            f"the chat template of {name(tokenizer)!r} is not append-only: adding {added} changes the ids before "
            f"it at token {mismatch.position} ({mismatch.context}); multi-turn episodes keep the ids the policy "
            "was given and need a template that only appends: use a model whose template does not rewrite earlier "
            "turns, or set tokenizer.chat_template to one that does not"
        )


def check_turns(tokenizer: PreTrainedTokenizerBase, turns: list[tuple[str, list[int] | str]]) -> None:
    """Turns as an episode holds them: the prompt ends with the assistant header, so an assistant turn comes first;
    only the last assistant turn may lack its EOS (a truncated one: the template would close it, the episode did
    not)."""
    if turns[0][0] != ASSISTANT:
        raise ValueError(f"an episode starts with an assistant turn (the prompt ends with its header): {turns[0][0]!r}")
    last_assistant = max(i for i, (role, _) in enumerate(turns) if role == ASSISTANT)
    for i, (role, content) in enumerate(turns):
        if role == ASSISTANT and not (isinstance(content, list) and all(isinstance(t, int) for t in content)):
            raise TypeError(f"turn {i}: an assistant turn is its sampled ids (a list of ints), not {type(content)}")
        if role != ASSISTANT and not isinstance(content, str):
            raise TypeError(f"turn {i}: a {role} turn is text, not {type(content)}")
        if role == ASSISTANT and i != last_assistant and content[-1:] != [tokenizer.eos_token_id]:
            raise ValueError(f"turn {i}: only the last assistant turn may lack the EOS that ends it")


def sentinel(index: int) -> str:
    """A string no content holds (random), with no whitespace for a template to trim."""
    return f"@@rlhfkit-assistant-{index}-{secrets.token_hex(8)}@@"


def split_at(tokenizer: PreTrainedTokenizerBase, text: str, sentinels: list[str]) -> list[str]:
    """The template's text around the sentinels: one more piece than sentinels."""
    pieces = []
    for mark in sentinels:
        if text.count(mark) != 1:
            raise ConfigError(
                f"the chat template of {name(tokenizer)!r} does not write an assistant message's content once and "
                "as given, so sampled ids cannot be spliced into its rendering: set tokenizer.chat_template to one "
                "that does"
            )
        piece, text = text.split(mark)
        pieces.append(piece)
    return [*pieces, text]


def splice(tokenizer: PreTrainedTokenizerBase, content: list[int], piece: list[int], ends_episode: bool) -> list[int]:
    """A sampled assistant turn followed by the template's ids up to the next assistant content. The template
    writes content + EOS; the sampled ids already end with EOS, which must be the template's."""
    eos = tokenizer.eos_token_id
    if content[-1:] != [eos]:
        return list(content)  # truncated: the last turn (check_turns), and the episode ends at its last id
    if piece[:1] != [eos]:
        raise ConfigError(
            f"the chat template of {name(tokenizer)!r} does not close an assistant turn with the EOS token "
            f"{tokenizer.eos_token!r} right after its content (it writes {tokenizer.decode(piece[:5])!r}): "
            "multi-turn episodes need a template that does; set tokenizer.chat_template to one"
        )
    return list(content) if ends_episode else content[:-1] + piece


def name(tokenizer: PreTrainedTokenizerBase) -> str:
    return getattr(tokenizer, "name_or_path", "") or "the tokenizer"
