"""Prompts cut to fit `max_query_length` keep some of their content; a record of which no content fits is
skipped and counted with its line, not the run refused (only a template too long on its own refuses it), at
the cause and through the on-policy stages."""

from __future__ import annotations

import json
import re

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data.examples import tokenize_pairs, tokenize_sft
from rlhfkit.data.formats import HH_ASSISTANT, HH_TURN, QueryTooLong, encode_query
from rlhfkit.data.tldr import Comparison, SFTRecord
from rlhfkit.errors import ConfigError
from rlhfkit.models import load_tokenizer
from rlhfkit.onpolicy import evaluation
from rlhfkit.stages import resolve

from ..support.tiny import PRESETS, cli_args, stage_args

POST = (
    "My roommate keeps eating my food even though we agreed on separate shelves in the fridge. I labelled "
    "everything and talked to him twice, but nothing changed and now I am buying groceries twice a week."
)


WORDS = " ".join(f"word{i}" for i in range(200))


def write_rows(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat(*turns: tuple[str, str]) -> dict[str, str]:
    return {"messages": json.dumps([{"role": role, "content": content} for role, content in turns])}


def kept_before(ending: str):
    """The query ends with `ending` and keeps the end of POST before it."""
    return lambda text: text.endswith(ending) and len(text) > len(ending) + 10 and POST.endswith(text[: -len(ending)])


# (task, fields, max_query_length, what the truncated query text must satisfy)
FITTING = [
    ("text", {"prompt": POST + "\nTL;DR:"}, 16, kept_before("\nTL;DR:")),  # keeps more than "\nTL;DR:" alone
    ("text", {"prompt": "Old context line.\n" + POST + "\nTL;DR:"}, 16, kept_before("\nTL;DR:")),
    ("text", {"prompt": POST + "\n\nTL;DR:"}, 16, kept_before("\n\nTL;DR:")),  # a blank line is no content to keep
    ("text", {"prompt": "Summarize:\n" + WORDS}, 16, lambda text: WORDS.endswith(text)),  # a long last line is content
    ("hh", {"dialogue": f"{HH_TURN} {POST}{HH_ASSISTANT}"}, 16, kept_before(HH_ASSISTANT)),
    ("tldr", {"subreddit": "a", "title": "b", "post": POST}, 30, lambda text: "POST: My roommate" in text),
    (
        "chat",
        chat(("user", WORDS)),
        40,
        lambda text: "word0 word1" in text and text.endswith("<|im_start|>assistant\n"),
    ),
]


@pytest.mark.parametrize(
    ("task", "fields", "limit", "check"), FITTING, ids=[f"{c[0]}-{i}" for i, c in enumerate(FITTING)]
)
def test_a_cut_query_keeps_some_of_its_content_and_fits(tokenizer, task, fields, limit, check):
    query = encode_query(tokenizer, task, fields, limit)
    assert query.truncated and len(query.ids) <= limit
    assert check(query.text), query.text


# (task, fields, max_query_length, error, message): nothing of the content fits
NOT_FITTING = [
    (
        "tldr",
        {"subreddit": "a", "title": WORDS, "post": POST},
        64,
        QueryTooLong,
        "no text of the prompt's post fits in max_query_length=64",
    ),
    (
        "tldr",
        {"subreddit": "a", "title": "b", "post": POST},
        8,
        ConfigError,
        "the tldr query template (every field empty) alone is 23 tokens, longer than max_query_length=8; raise "
        "max_query_length above 23",
    ),
    ("text", {"prompt": "Words here\n" + "? " * 60}, 16, QueryTooLong, "no text of the prompt's prompt fits"),
    (
        "chat",
        chat(("system", WORDS), ("user", "Summarize the rules.")),
        40,
        QueryTooLong,
        "no text of the prompt's last message fits",
    ),
    (
        "chat",
        chat(("user", POST)),
        3,
        ConfigError,
        "the chat template (one empty user turn) alone is 30 tokens, longer than max_query_length=3",
    ),
]


@pytest.mark.parametrize(
    ("task", "fields", "limit", "error", "message"), NOT_FITTING, ids=[f"{c[0]}-{i}" for i, c in enumerate(NOT_FITTING)]
)
def test_a_query_of_which_no_content_fits_is_the_records_error_unless_the_template_alone_is_too_long(
    tokenizer, task, fields, limit, error, message
):
    with pytest.raises(error, match=re.escape(message)) as raised:
        encode_query(tokenizer, task, fields, limit)
    assert type(raised.value) is error  # QueryTooLong skips a record; ConfigError (the template's) refuses the run


def test_records_that_do_not_fit_are_skipped_and_counted_with_their_line(tokenizer):
    long_title = {"subreddit": "a", "title": WORDS, "post": POST}
    fits = {"subreddit": "a", "title": "b", "post": POST}
    records = [SFTRecord("1", fits, "summary", "posts.jsonl:1"), SFTRecord("2", long_title, "summary", "posts.jsonl:2")]
    examples, log = tokenize_sft(records, tokenizer, max_query_length=64, max_response_length=16)
    assert [e.record.where for e in examples] == ["posts.jsonl:1"]
    assert log.to_dict()["by_reason"] == {"query_too_long": 1} and log.examples["query_too_long"] == ["posts.jsonl:2"]
    assert log.kept + log.skipped == len(records)
    pairs = [Comparison(r.prompt_id, "tldr", r.fields, "chosen", "rejected", r.where) for r in records]
    kept_pairs, pair_log = tokenize_pairs(pairs, tokenizer, {"tldr": 64}, 16)
    assert len(kept_pairs) == 1 and pair_log.examples == {"query_too_long": ["posts.jsonl:2"]}


@pytest.fixture(scope="module")
def policy_tokenizer(ppo_dirs):
    return load_tokenizer(str(ppo_dirs["policy"]))


def test_prompt_only_data_cut_to_16_tokens_keeps_each_prompts_end_and_warns_once(
    ppo_dirs, policy_tokenizer, tmp_path, capsys
):
    posts = [json.loads(line)["post"][:300] for line in ppo_dirs["posts"].read_text().splitlines()]
    data = write_rows(tmp_path / "prompts.jsonl", [{"prompt": post + "\nTL;DR:"} for post in posts])
    options = stage_args(
        "grpo", ppo_dirs, tmp_path / "run", data=str(data), prompt_format="prompt-only", max_query_length=16
    )
    cfg = resolve("grpo", PRESETS["grpo"], None, options)
    train, held_out, notes = evaluation.split_posts(cfg.prompt_split, policy_tokenizer)
    assert len(train) + len(held_out) == len(posts)  # nothing lost: every prompt kept some of its text
    for example in train + held_out:
        content = example.query.text.removesuffix("\nTL;DR:")
        assert example.query.text.endswith("\nTL;DR:") and re.search(r"\w", content) and len(example.query.ids) <= 16
        assert example.record.fields["prompt"].removesuffix("\nTL;DR:").endswith(content)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlhfkit: warning: ")]
    assert warnings == [
        f"rlhfkit: warning: {len(train)} of {len(train)} training prompts were cut to fit max_query_length=16 tokens "
        "and lost part of their prompt; raise max_query_length to keep more of it"
    ]


def test_tldr_posts_at_64_tokens_skip_the_posts_whose_title_alone_is_too_long_and_train(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    args = stage_args("grpo", ppo_dirs, out, max_query_length=64, max_steps=1)
    assert cli_main(["grpo", *cli_args(args)]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err and "template alone" not in printed.err
    line = next(line for line in printed.out.splitlines() if line.startswith("query tokenization: "))
    posts = re.escape(str(ppo_dirs["posts"]))
    assert re.search(rf"training kept \d+ prompts, skipped (\d+): query_too_long: \1 \(e\.g\. {posts}:\d+\)", line), (
        line
    )
    sides = re.findall(r"(?:training|held-out) kept (\d+) prompts, skipped (none|\d+)", line)
    read = int(re.search(r"loaded: kept (\d+) prompts", printed.out)[1])
    assert (
        len(sides) == 2
        and sum(int(kept) + (0 if skipped == "none" else int(skipped)) for kept, skipped in sides) == read
    )
    assert (out / "model").is_dir()
