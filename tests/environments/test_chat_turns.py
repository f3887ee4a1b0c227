"""Multi-turn episodes' token rules (rlhfkit.environments.chat_turns) on the real SmolLM2 tokenizer: the ids
inserted between turns, the template's expected ids with sampled ids spliced in, and templates that cannot be used."""

from __future__ import annotations

import copy

import pytest

from rlhfkit.data.formats import encode_rendered, encode_text, render_chat
from rlhfkit.environments.chat_turns import (
    expected_episode_ids,
    first_mismatch,
    require_append_only,
    turn_suffix,
)
from rlhfkit.errors import UserError

NEWLINE, IM_START, IM_END = 198, 1, 2  # SmolLM2's `\n`, `<|im_start|>`, `<|im_end|>` (its EOS)
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
ANSWERS = ["The capital of France is Paris.", "About 2.1 million people.", "It is the Seine."]
QUESTIONS = ["How many people live there?", "Which river flows through it?"]


def sampled(tokenizer, text: str) -> list[int]:
    """An assistant turn as the policy samples it: its ids, then EOS."""
    return encode_rendered(tokenizer, text) + [tokenizer.eos_token_id]


def prompt_ids(tokenizer) -> list[int]:
    return encode_rendered(tokenizer, render_chat(tokenizer, PROMPT))


def with_template(tokenizer, template: str | None):
    changed = copy.deepcopy(tokenizer)  # the session's tokenizer is shared by other tests
    changed.chat_template = template
    return changed


def test_the_special_tokens_are_the_ones_the_rules_name(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "\u010a"]) == [IM_START, NEWLINE]


@pytest.mark.parametrize("role", ["user", "tool"])
def test_a_turn_suffix_starts_with_the_separator_and_holds_no_system_prompt(tokenizer, role):
    content = "Now divide that by 2."
    suffix = turn_suffix(tokenizer, {"role": role, "content": content})
    by_hand = (
        [NEWLINE, IM_START] + encode_text(tokenizer, role) + [NEWLINE] + encode_text(tokenizer, content)
        + [IM_END, NEWLINE, IM_START] + encode_text(tokenizer, "assistant") + [NEWLINE]
    )  # fmt: skip
    assert suffix == by_hand
    assert suffix.count(IM_START) == 2 and "system" not in tokenizer.decode(suffix)
    # what the pitfalls give: the turn rendered alone has the default system prompt and no leading separator
    alone = encode_rendered(tokenizer, render_chat(tokenizer, [{"role": role, "content": content}]))
    assert alone[0] == IM_START and tokenizer.decode(alone).startswith("<|im_start|>system\nYou are a helpful")


def test_a_turn_suffix_without_the_generation_prompt_ends_at_the_turns_eos(tokenizer):
    message = {"role": "user", "content": "Thanks."}
    header = [NEWLINE, IM_START, *encode_text(tokenizer, "assistant"), NEWLINE]
    without = turn_suffix(tokenizer, message, add_generation_prompt=False)
    assert without[-1] == IM_END and without + header == turn_suffix(tokenizer, message)


def conversation() -> list[dict]:
    """PROMPT, then three answers with two questions between them."""
    messages = list(PROMPT)
    for k, answer in enumerate(ANSWERS):
        messages.append({"role": "assistant", "content": answer})
        if k < len(QUESTIONS):
            messages.append({"role": "user", "content": QUESTIONS[k]})
    return messages


def test_a_spliced_three_turn_episode_is_the_templates_rendering(tokenizer):
    episode = prompt_ids(tokenizer) + sampled(tokenizer, ANSWERS[0])
    for question, answer in zip(QUESTIONS, ANSWERS[1:], strict=True):
        episode += turn_suffix(tokenizer, {"role": "user", "content": question}) + sampled(tokenizer, answer)
    rendered = encode_rendered(tokenizer, render_chat(tokenizer, conversation(), add_generation_prompt=False))
    assert rendered[-2:] == [IM_END, NEWLINE]  # the template's trailing `\n` is not part of the episode
    assert episode == rendered[:-1]
    turns = [(m["role"], sampled(tokenizer, m["content"]) if m["role"] == "assistant" else m["content"])
             for m in conversation()[len(PROMPT):]]  # fmt: skip
    after_prompt = episode[len(prompt_ids(tokenizer)) :]
    assert expected_episode_ids(tokenizer, PROMPT, turns) == after_prompt
    assert first_mismatch(tokenizer, expected_episode_ids(tokenizer, PROMPT, turns), after_prompt) is None


def test_the_pieces_between_assistant_contents_tokenise_alone_as_in_the_whole_rendering(tokenizer):
    # the assumption piece-wise tokenising rests on, on SmolLM2: a piece after an assistant content starts with
    # `<|im_end|>` (special, tokenisation restarts) and a piece before one ends with the header's `\n`
    marks = ["@@A0@@", "@@A1@@"]
    messages = [*PROMPT, {"role": "assistant", "content": marks[0]}, {"role": "user", "content": QUESTIONS[0]},
                {"role": "assistant", "content": marks[1]}]  # fmt: skip
    text = render_chat(tokenizer, messages, add_generation_prompt=False)
    first, rest = text.split(marks[0])
    middle, last = rest.split(marks[1])
    assert first.endswith("assistant\n") and middle.endswith("assistant\n")
    assert middle.startswith("<|im_end|>") and last == "<|im_end|>\n"
    assert encode_rendered(tokenizer, first) == prompt_ids(tokenizer)
    assert encode_rendered(tokenizer, middle) == [IM_END] + turn_suffix(tokenizer, messages[2])
    # whole-text tokenising merges the header's `\n` with content that starts with spaces; splicing keeps both
    content = encode_text(tokenizer, "  x")
    whole = encode_rendered(tokenizer, render_chat(tokenizer, [*PROMPT, {"role": "assistant", "content": "  x"}],
                                                   add_generation_prompt=False))  # fmt: skip
    assert whole[: len(prompt_ids(tokenizer))] != prompt_ids(tokenizer)
    assert expected_episode_ids(tokenizer, PROMPT, [("assistant", content + [IM_END])]) == content + [IM_END]


def test_non_canonical_ids_inside_an_assistant_turn_are_kept(tokenizer):
    # the policy wrote `)` then `=` where SmolLM2 has one `)=` token, and the calculator appended its result's ids
    policy = encode_text(tokenizer, "(3+4") + encode_text(tokenizer, ")") + encode_text(tokenizer, "=")
    tool_result = encode_text(tokenizer, "7>>")
    turn = policy + tool_result + [IM_END]
    retokenised = encode_text(tokenizer, tokenizer.decode(turn[:-1]))
    assert tokenizer.decode(turn[:-1]) == "(3+4)=7>>"
    assert encode_text(tokenizer, ")=") == [36637] and 36637 in retokenised and retokenised != turn[:-1]
    after = turn_suffix(tokenizer, {"role": "user", "content": "And times 2?"})
    turns = [("assistant", turn), ("user", "And times 2?"), ("assistant", turn)]
    assert expected_episode_ids(tokenizer, PROMPT, turns) == turn + after + turn
    # the same text re-tokenised is a different episode, and first_mismatch says where
    mismatch = first_mismatch(tokenizer, expected_episode_ids(tokenizer, PROMPT, turns), retokenised)
    assert mismatch is not None and mismatch.position == len(encode_text(tokenizer, "(3+4"))


def test_a_truncated_last_turn_ends_the_episode_at_its_last_id(tokenizer):
    cut = encode_rendered(tokenizer, "About 2.1 mil")  # no EOS: the length limit stopped it
    turns = [("assistant", sampled(tokenizer, ANSWERS[0])), ("user", QUESTIONS[0]), ("assistant", cut)]
    expected = sampled(tokenizer, ANSWERS[0]) + turn_suffix(tokenizer, {"role": "user", "content": QUESTIONS[0]}) + cut
    assert expected_episode_ids(tokenizer, PROMPT, turns) == expected
    assert expected_episode_ids(tokenizer, PROMPT, [("assistant", [])]) == []


def test_an_episode_ending_with_inserted_turns_ends_with_the_assistant_header(tokenizer):
    turns = [("assistant", sampled(tokenizer, ANSWERS[0])), ("user", QUESTIONS[0])]
    expected = sampled(tokenizer, ANSWERS[0]) + turn_suffix(tokenizer, {"role": "user", "content": QUESTIONS[0]})
    assert expected_episode_ids(tokenizer, PROMPT, turns) == expected


def test_turns_an_episode_cannot_hold_are_refused(tokenizer):
    with pytest.raises(ValueError, match="only the last assistant turn may lack the EOS"):
        expected_episode_ids(tokenizer, PROMPT, [("assistant", [42]), ("user", "more"), ("assistant", [IM_END])])
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        expected_episode_ids(tokenizer, PROMPT, [("user", "more"), ("assistant", [IM_END])])
    with pytest.raises(TypeError, match="sampled ids"):
        expected_episode_ids(tokenizer, PROMPT, [("assistant", "Paris.")])


def test_first_mismatch_reports_the_first_differing_position_with_context(tokenizer):
    ids = encode_rendered(tokenizer, "Paris is a city on the Seine with two million people, museums, bridges, parks.")
    assert len(ids) >= 18  # 10 ids after the changed one at 7, and after the cut at 5
    assert first_mismatch(tokenizer, ids, list(ids)) is None
    assert first_mismatch(tokenizer, [], []) is None
    changed = ids[:7] + [36637] + ids[8:]
    mismatch = first_mismatch(tokenizer, ids, changed)
    assert mismatch.position == 7 and mismatch.expected[0] == ids[7] and mismatch.actual[0] == 36637
    assert len(mismatch.expected) == len(mismatch.actual) == 10
    assert mismatch.context.startswith(f"after {tokenizer.decode(ids[:7])!r}: expected [{ids[7]}:")
    assert "36637:')='" in mismatch.context
    short = first_mismatch(tokenizer, ids, ids[:5])
    assert (short.position, short.actual, short.expected) == (5, [], ids[5:15]) and short.context.endswith("the end")
    longer = first_mismatch(tokenizer, ids, ids + [IM_END])
    assert (longer.position, longer.expected, longer.actual) == (len(ids), [], [IM_END])


def test_smollm2s_template_is_append_only(tokenizer):
    require_append_only(tokenizer)


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    counting = with_template(tokenizer, "{{ messages | length }} messages\n" + tokenizer.chat_template)
    with pytest.raises(UserError, match=r"is not append-only: adding message 2 \(assistant\) changes the ids") as err:
        require_append_only(counting)
    assert "at token 0" in str(err.value) and "set tokenizer.chat_template" in str(err.value)
    with pytest.raises(UserError, match="not append-only"):
        turn_suffix(counting, {"role": "user", "content": "more"})
    with pytest.raises(UserError, match="not append-only"):
        expected_episode_ids(counting, PROMPT, [("assistant", sampled(tokenizer, ANSWERS[0]))])


def test_a_tokenizer_without_a_chat_template_is_refused(tokenizer):
    with pytest.raises(UserError, match="has no chat template"):
        require_append_only(with_template(tokenizer, None))


def test_a_template_that_does_not_close_assistant_turns_with_eos_is_refused(tokenizer):
    plain = with_template(tokenizer, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                                     "{% if add_generation_prompt %}assistant:{% endif %}")  # fmt: skip
    with pytest.raises(UserError, match="does not end an assistant turn with the EOS token"):
        require_append_only(plain)
