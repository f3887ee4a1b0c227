"""The data cases of the bad-inputs review (2026-11): prompts cut to fit `max_query_length` keep some of
their content or are skipped and counted (case 8); a record that does not fit is skipped, not the run
refused (case 21); a format error names the option that reads the data (case 22); warnings start a line
while a progress bar is on screen and a bad UTF-8 byte is named by its line (cosmetic); the help names
the formats one option away, and no examples left names the length option to raise (--help)."""

from __future__ import annotations

import gzip
import io
import json
import re

import pytest
from tqdm import tqdm

from rlhfkit.cli import main as cli_main
from rlhfkit.data import DataFormatError, load_sft
from rlhfkit.data.examples import tokenize_pairs, tokenize_sft
from rlhfkit.data.formats import HH_ASSISTANT, HH_TURN, QueryTooLong, encode_query
from rlhfkit.data.tldr import Comparison, SFTRecord
from rlhfkit.errors import ConfigError, warn
from rlhfkit.models import load_tokenizer
from rlhfkit.onpolicy import evaluation
from rlhfkit.stages import resolve

from .support.mistakes import one_error_line
from .support.tiny import PRESETS, cli_args, stage_args

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


# ---------------------------------------------------------------- case 8 / 21 at the cause: what truncation keeps


def kept_before(ending: str):
    """The query ends with `ending` and keeps the end of POST before it."""
    return lambda text: text.endswith(ending) and len(text) > len(ending) + 10 and POST.endswith(text[: -len(ending)])


# (task, fields, max_query_length, what the truncated query text must satisfy)
FITTING = [
    ("text", {"prompt": POST + "\nTL;DR:"}, 16, kept_before("\nTL;DR:")),  # the review's "\nTL;DR:" alone no longer
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


# ---------------------------------------------------------------- cases 8 and 21 through the on-policy stages


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
    train, held_out, notes = evaluation.split_posts(cfg, policy_tokenizer)
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


# ---------------------------------------------------------------- case 22: the option that reads the data


def pref_rows(n=8):
    return [
        {"prompt": f"Post {i}\nTL;DR:", "chosen": f" short {i}", "rejected": f" long summary {i}"} for i in range(n)
    ]


def user_turn(i):
    return [{"role": "user", "content": f"Summarize post {i}"}]


def implicit_pref_rows(n=8):
    return [
        {"chosen": f"Post {i}\nTL;DR: short {i}", "rejected": f"Post {i}\nTL;DR: long summary {i}"} for i in range(n)
    ]


def tldr_posts(n=8):
    return [{"subreddit": "tifu", "title": f"Title {i}", "post": POST, "summary": f"Summary {i}"} for i in range(n)]


# a seed format named for data in another: the seed reader's error ends naming the option that reads the data
FORMAT_ERRORS = [  # (stage, the format option, rows, fragment the one error line holds)
    (
        "rm",
        {"data_format": "tldr-comparisons"},
        pref_rows(),
        "field 'info' missing; OpenAI comparison (info, summaries[text, policy], choice, ...) records need: info, "
        "summaries, choice; it looks like preference data (explicit prompt, standard): read it with "
        "data_format=preference (or data_format=auto)",
    ),
    (
        "dpo",
        {"data_format": "hh"},
        implicit_pref_rows(),
        "data_format=hh reads chosen, rejected as whole dialogues starting with \\n\\nHuman:; this record's are not; "
        "it looks like preference data (implicit prompt, standard): read it with data_format=preference (or "
        "data_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"prompt": f"Post {i}\nTL;DR:"} for i in range(8)],
        "it looks like prompt-only data (standard): read it with prompt_format=prompt-only (or prompt_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"prompt": user_turn(i)} for i in range(8)],
        "it looks like prompt-only data (conversational): read it with prompt_format=prompt-only (or "
        "prompt_format=auto)",
    ),
    (
        "ppo",
        {"prompt_format": "gsm8k"},
        tldr_posts(),
        "field 'question' missing; gsm8k records need: question, answer; it looks like tldr-sft data: read it with "
        "prompt_format=tldr-sft (or prompt_format=auto)",
    ),
    (
        "grpo",
        {"prompt_format": "tldr-sft"},
        [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(8)],
        "it looks like gsm8k data: read it with prompt_format=gsm8k (or prompt_format=auto)",
    ),
    (
        "rloo",
        {"prompt_format": "hh"},
        implicit_pref_rows(),
        "prompt_format=hh reads chosen, rejected as whole dialogues starting with \\n\\nHuman:; this record's are "
        "not; it looks like preference data (implicit prompt, standard), which is read by rlhfkit rm, dpo, rm-eval and "
        "judge-eval (data_format=preference)",
    ),
    (
        "sft",
        {"data_format": "tldr-sft"},
        [{"prompt": user_turn(i), "completion": [{"role": "assistant", "content": "ok"}]} for i in range(8)],
        "field 'subreddit' missing; TL;DR SFT (subreddit, title, post, summary) records need: subreddit, title, post, "
        "summary; it looks like prompt-completion data (conversational): read it with data_format=prompt-completion "
        "(or data_format=auto)",
    ),
    (
        "sft",
        {"data_format": "tldr-sft"},
        pref_rows(),
        "it looks like preference data (explicit prompt, standard), which is read by rlhfkit rm, dpo, rm-eval and "
        "judge-eval (data_format=preference)",
    ),
    (
        "sft",
        {},  # auto, the default
        pref_rows(),
        "(see docs/data-formats.md); it looks like preference data (explicit prompt, standard), which is read by "
        "rlhfkit rm, dpo, rm-eval and judge-eval (data_format=preference)",
    ),
]


@pytest.mark.parametrize(
    ("stage", "options", "rows", "fragment"), FORMAT_ERRORS, ids=[f"{c[0]}-{i}" for i, c in enumerate(FORMAT_ERRORS)]
)
def test_data_in_another_format_fails_naming_the_option_that_reads_it(
    ppo_dirs, tmp_path, capsys, stage, options, rows, fragment
):
    data = write_rows(tmp_path / "data.jsonl", rows)
    before = data.read_bytes()
    args = stage_args(stage, ppo_dirs, tmp_path / "run", data=str(data), **options)
    line = one_error_line([stage, *cli_args(args)], capsys)
    assert line.startswith(f"rlhfkit: error: {data}:1: ") and line.endswith(fragment)
    assert data.read_bytes() == before


# ---------------------------------------------------------------- --help as a newcomer


NOTHING_LEFT = [  # (stage, options that let no example in, what is left, the reason, the option to raise)
    ("sft", {"max_response_length": 4}, "training examples", "response_too_long", "max_response_length"),
    ("rm", {"max_response_length": 2}, "training pairs", "response_too_long", "max_response_length"),
    (
        "dpo",
        {"max_query_length": 24},
        "training pairs",
        "query_too_long",
        "max_query_length",
    ),  # the template alone is 23
    ("grpo", {"max_query_length": 24}, "training prompts", "query_too_long", "max_query_length"),
]


@pytest.mark.parametrize(
    ("stage", "options", "what", "reason", "option"), NOTHING_LEFT, ids=[c[0] for c in NOTHING_LEFT]
)
def test_no_examples_left_names_the_reason_and_the_option_to_raise(
    ppo_dirs, tmp_path, capsys, stage, options, what, reason, option
):
    args = stage_args(stage, ppo_dirs, tmp_path / "run", max_steps=1, **options)
    line = one_error_line([stage, *cli_args(args)], capsys)
    assert re.fullmatch(
        rf"rlhfkit: error: no {what} left to train on \(kept 0 {what}, skipped (\d+): {reason}: \1 \(e\.g\. .+\)\); "
        rf"raise {option}",
        line,
    ), line


@pytest.mark.parametrize(
    ("stage", "option"),
    [
        ("sft", "data_format"),
        ("rm", "data_format"),
        ("dpo", "data_format"),
        ("rm-eval", "data_format"),
        ("judge-eval", "data_format"),
        ("grpo", "prompt_format"),
        ("ppo", "prompt_format"),
        ("generate", "prompt_format"),
    ],
)
def test_the_help_of_the_format_option_names_every_other_format(stage, option, capsys):
    assert cli_main([stage, "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.split()[:1] == [option])
    default, choices = re.search(r"default: (\S+)\s+type: \{([^}]*)\}", lines[index + 1]).groups()
    others = [choice for choice in choices.split(",") if choice != default]
    assert len(others) >= 3 and all(choice in lines[index] for choice in others), lines[index]
    assert "one option away" in lines[index]


# ---------------------------------------------------------------- cosmetic: warnings in a log, bad UTF-8


def test_a_warning_printed_while_a_progress_bar_is_on_screen_starts_a_line(capsys):
    bar_output = io.StringIO()  # tqdm's own line, as it goes to a log file: no newline until the bar closes
    with tqdm(total=2, file=bar_output, desc="scoring") as bar:
        bar.update(1)
        warn("reward function 'raises' failed on row 0")
    warn("after the bar")
    err = capsys.readouterr().err
    assert err == "\nrlhfkit: warning: reward function 'raises' failed on row 0\nrlhfkit: warning: after the bar\n"


@pytest.mark.parametrize("name", ["posts.jsonl", "posts.jsonl.gz", "posts.json"])
def test_a_byte_that_is_not_utf8_is_named_by_its_line_and_offset(ppo_dirs, tmp_path, name):
    lines = ppo_dirs["posts"].read_bytes().split(b"\n")[:6]
    if name.endswith(".json"):  # a JSON array, one record a line
        lines = [b"[" + lines[0] + b","] + [line + b"," for line in lines[1:-1]] + [lines[-1] + b"]"]
    lines[3] = lines[3].replace(b"the", b"th\xff\xfe", 1)
    raw = b"\n".join(lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    offset = raw.index(b"\xff")
    with pytest.raises(DataFormatError) as raised:
        load_sft([str(path)])
    assert (
        str(raised.value)
        == f"{path}:4: not UTF-8 text (invalid start byte 0xff at byte {offset} of the file); convert it to UTF-8"
    )
