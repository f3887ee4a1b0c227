"""The ecosystem's dataset formats (docs/data-formats.md) through the stages that read them, on the tiny
model: prompt-only, prompt-completion, language modelling, preference with an explicit or implicit
prompt, each standard (strings) and conversational (messages). The records are real TL;DR posts,
summaries and human comparisons, rewritten into each format."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data import AUTO, FieldNames, load_pairs, load_prompts, load_sft_data
from rlhfkit.data.examples import tokenize_sft
from rlhfkit.data.generic import split_common_prefix
from rlhfkit.data.split import split_by_prompt, split_comparisons
from rlhfkit.data.tldr import load_comparisons, load_sft
from rlhfkit.onpolicy import evaluation
from rlhfkit.stages import STAGES, resolve
from rlhfkit.trainers import dpo, reward, sft

from ..support.data import data_file
from ..support.launches import run_in_this_process
from ..support.tiny import PRESETS, cli_args, stage_args

FORMS = ["standard", "conversational"]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def write_rows(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def posts(ppo_dirs) -> list[tuple[str, str]]:
    """(post, summary) of 16 real TL;DR posts, cut to their first 300 characters and the summaries to their first
    8 words, so that a few tokens answer them and the runs stay short."""
    records, _ = load_sft([str(ppo_dirs["posts"])])
    return [(r.fields["post"][:300], " ".join(r.summary.split()[:8])) for r in records[:16]]


@pytest.fixture(scope="module")
def pairs(ppo_dirs) -> list[tuple[str, str, str]]:
    """(post, chosen summary, rejected summary) of 16 real TL;DR human comparisons."""
    records, _ = load_comparisons([str(ppo_dirs["pairs"])])
    return [(r.fields["post"][:300], r.chosen.strip(), r.rejected.strip()) for r in records[:16]]


def query(post: str) -> str:
    return f"{post}\n\nTL;DR:"


def prompt_completion_rows(posts, form: str) -> list[dict]:
    if form == "standard":
        return [{"prompt": query(p), "completion": " " + s} for p, s in posts]
    return [{"prompt": user(p), "completion": assistant(s)} for p, s in posts]


def language_modeling_rows(posts, form: str) -> list[dict]:
    if form == "standard":
        return [{"text": f"{query(p)} {s}"} for p, s in posts]
    return [{"messages": user(p) + assistant(s)} for p, s in posts]


def preference_rows(pairs, form: str, prompt: str) -> list[dict]:
    if prompt == "explicit":
        if form == "standard":
            return [{"prompt": query(p), "chosen": " " + c, "rejected": " " + r} for p, c, r in pairs]
        return [{"prompt": user(p), "chosen": assistant(c), "rejected": assistant(r)} for p, c, r in pairs]
    if form == "standard":
        return [{"chosen": f"{query(p)} {c}", "rejected": f"{query(p)} {r}"} for p, c, r in pairs]
    return [{"chosen": user(p) + assistant(c), "rejected": user(p) + assistant(r)} for p, c, r in pairs]


def run_stage(stage: str, module, ppo_dirs, out, **options) -> None:
    cfg = resolve(stage, PRESETS[stage], None, stage_args(stage, ppo_dirs, out, max_steps=1, **options))
    assert module.run(cfg) == 0
    assert (out / "model").is_dir()


# ---------------------------------------------------------------- each format through its stages


@pytest.mark.parametrize("form", FORMS)
def test_prompt_completion_trains_sft_and_answers_held_out_prompts(form, posts, ppo_dirs, tmp_path, capsys):
    data = write_rows(tmp_path / "data.jsonl", prompt_completion_rows(posts, form))
    run_stage(
        "sft",
        sft,
        ppo_dirs,
        tmp_path / "run",
        data=str(data),
        data_format="auto",
        validation_posts=4,
        eval_samples=1,
        max_response_length=24,
    )
    assert (
        f"data format: prompt-completion, {form} (detected from columns prompt, completion)" in capsys.readouterr().out
    )
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert {"prompt", "reference", "base", "sft"} <= set(sample) and "post" not in sample
    assert sample["reference"] in {s for _, s in posts}
    if form == "conversational":  # the prompt the model read is the chat template's, with its generation prompt
        assert sample["prompt"].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("form", FORMS)
def test_language_modeling_trains_sft_on_the_whole_text_or_the_final_assistant_turn(
    form, posts, ppo_dirs, tmp_path, capsys
):
    data = write_rows(tmp_path / "data.jsonl", language_modeling_rows(posts, form))
    run_stage(
        "sft",
        sft,
        ppo_dirs,
        tmp_path / "run",
        data=str(data),
        data_format="language-modeling",
        validation_posts=4,
        eval_samples=1,
        max_response_length=24,
    )
    column = "text" if form == "standard" else "messages"
    assert (
        f"data format: language-modeling, {form} (data_format=language-modeling, columns {column})"
        in capsys.readouterr().out
    )
    assert "val/loss" in json.loads((tmp_path / "run" / "eval.json").read_text())
    # a text has no prompt to answer; a conversation's prompt is every turn before its final assistant turn
    assert (tmp_path / "run" / "samples.jsonl").exists() == (form == "conversational")


def test_language_modeling_text_is_all_completion_within_the_query_and_response_budget(posts, tokenizer, tmp_path):
    data = write_rows(tmp_path / "data.jsonl", language_modeling_rows(posts, "standard"))
    records, _ = load_sft_data("auto", [str(data)])
    assert records[0].fields == {"prompt": ""} and records[0].summary == f"{query(posts[0][0])} {posts[0][1]}"
    assert len({r.prompt_id for r in records}) == len(records)  # no prompt: each text is its own unit of the split
    examples, _ = tokenize_sft(records, tokenizer, max_query_length=128, max_response_length=16)
    assert len(examples) == len(records) and all(
        e.query.ids == [] and 16 < len(e.response) <= 128 + 16 for e in examples
    )
    _, log = tokenize_sft(records, tokenizer, max_query_length=8, max_response_length=16)
    assert log.counts == {"response_too_long": len(records)}


# each stage reads both forms and both kinds of prompt; every variant runs through one of them (to keep this file short)
@pytest.mark.parametrize(
    ("form", "prompt", "stage"),
    [
        ("standard", "explicit", "rm"),
        ("conversational", "implicit", "rm"),
        ("conversational", "explicit", "dpo"),
        ("standard", "implicit", "dpo"),
    ],
)
def test_preference_trains_the_reward_model_and_dpo(form, prompt, stage, pairs, ppo_dirs, tmp_path, capsys):
    data = write_rows(tmp_path / "data.jsonl", preference_rows(pairs, form, prompt))
    extra = {"eval_samples": 0} if stage == "dpo" else {}
    run_stage(
        stage,
        {"rm": reward, "dpo": dpo}[stage],
        ppo_dirs,
        tmp_path / "run",
        data=str(data),
        data_format="auto",
        max_response_length=64,
        **extra,
    )
    columns = "prompt, chosen, rejected" if prompt == "explicit" else "chosen, rejected"
    assert (
        f"data format: preference, {prompt} prompt, {form} (detected from columns {columns})" in capsys.readouterr().out
    )
    evaluation_json = json.loads((tmp_path / "run" / "rm_eval" / "rm_eval.json").read_text())
    assert evaluation_json["pairs"] > 0 and evaluation_json["breakdown"]["task"].keys() == {
        "text" if form == "standard" else "chat"
    }
    assert not (tmp_path / "run" / "rm_eval" / "probes.md").exists()  # the TL;DR probes are for TL;DR data only


@pytest.mark.parametrize("form", FORMS)
def test_prompt_only_feeds_generate_and_the_on_policy_stages(form, posts, ppo_dirs, tmp_path, capsys):
    prompts = [{"prompt": query(p) if form == "standard" else user(p), "topic": "reddit"} for p, _ in posts]
    data = write_rows(tmp_path / "data.jsonl", prompts)
    out = tmp_path / "samples.jsonl"
    assert (
        cli_main(
            [
                "generate",
                f"model={ppo_dirs['policy']}",
                f"data={data}",
                "prompt_format=prompt-only",
                "split=all",
                "num_samples=2",
                "max_new_tokens=4",
                "temperature=0",
                f"out={out}",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["reference"] == ""
    cfg = resolve(
        "grpo",
        PRESETS["grpo"],
        None,
        stage_args("grpo", ppo_dirs, tmp_path / "run", data=str(data), prompt_format="auto"),
    )
    train, held_out, _ = evaluation.split_posts(cfg.prompt_split, tokenizer_of(ppo_dirs))
    assert len(held_out) == 8 and {e.record.task for e in train} == {"text" if form == "standard" else "chat"}
    assert all(
        e.record.columns == {"topic": "reddit"} for e in train
    )  # every other column reaches the reward functions
    assert f"data format: prompt-only, {form} (detected from columns prompt)" in capsys.readouterr().out


def test_trl_conversational_prompts_train_grpo_with_no_format_option(posts, ppo_dirs, tmp_path, capsys):
    data = write_rows(tmp_path / "data.jsonl", [{"prompt": user(p)} for p, _ in posts])
    args = stage_args("grpo", ppo_dirs, tmp_path / "run", data=str(data), max_steps=1, validation_posts=4)
    run = run_in_this_process("grpo", args)
    assert "data format: prompt-only, conversational (detected from columns prompt)" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]


def tokenizer_of(ppo_dirs):
    from rlhfkit.models import load_tokenizer

    return load_tokenizer(str(ppo_dirs["policy"]))


def test_a_completion_column_beside_the_prompt_is_the_reference_of_prompt_only_data(posts, tmp_path):
    data = write_rows(tmp_path / "data.jsonl", prompt_completion_rows(posts, "conversational"))
    records, _ = load_prompts("auto", [str(data)])
    assert [r.summary for r in records] == [s for _, s in posts] and all(r.columns == {} for r in records)


# ---------------------------------------------------------------- reading: prompts, skips, mapping, errors


def test_implicit_prompt_is_the_common_prefix_cut_back_to_a_word_boundary():
    assert split_common_prefix("Q: colour? A: The sky is blue.", "Q: colour? A: The sky is bright.") == (
        "Q: colour? A: The sky is",
        " blue.",
        " bright.",
    )
    assert split_common_prefix("Answer:\n\nyes", "Answer:\n\nno") == ("Answer:", "\n\nyes", "\n\nno")
    assert split_common_prefix("It is yes", "It is yesterday") == ("It is", " yes", " yesterday")


def test_a_string_prompt_beside_whole_conversations_is_a_copy_and_the_prompt_stays_implicit(tmp_path):
    row = {
        "prompt": "Why is the sky blue?",
        "chosen": user("Why is the sky blue?") + assistant("Rayleigh scattering."),
        "rejected": user("Why is the sky blue?") + assistant("Paint."),
        "score_chosen": 8.0,
    }  # as ultrafeedback_binarized
    [record], _ = load_pairs("auto", [str(write_rows(tmp_path / "data.jsonl", [row]))])
    assert (record.task, json.loads(record.fields["messages"])) == ("chat", user("Why is the sky blue?"))
    assert (record.chosen, record.rejected) == ("Rayleigh scattering.", "Paint.")


def test_the_prompt_id_keeps_every_record_of_a_prompt_on_one_side_of_the_split(pairs, tmp_path):
    rows = preference_rows(pairs, "conversational", "implicit")
    twice = rows + [{"chosen": r["chosen"], "rejected": r["chosen"][:-1] + assistant("another reply")} for r in rows]
    records, _ = load_pairs("preference", [str(write_rows(tmp_path / "data.jsonl", twice))])
    assert len(records) == 2 * len(rows) and len({r.prompt_id for r in records}) == len({post for post, _, _ in pairs})
    train, validation = split_by_prompt(records, lambda r: r.prompt_id, validation_fraction=0.25, seed=1)
    assert not {r.prompt_id for r in train} & {r.prompt_id for r in validation}


def test_unusable_records_are_skipped_and_counted_by_reason_with_their_line(tmp_path):
    good = {
        "prompt": user("Why is the sky blue?"),
        "chosen": assistant("Rayleigh scattering."),
        "rejected": assistant("Paint."),
    }
    bad = [
        {"chosen": good["chosen"], "rejected": good["rejected"]},  # missing_field:prompt
        good | {"prompt": None},  # missing_field:prompt (a missing value, as parquet stores one)
        good | {"chosen": "Rayleigh scattering."},  # not_messages:chosen (a string in conversational data)
        good | {"rejected": [{"role": "assistant", "content": 3}]},  # not_messages:rejected
        good | {"prompt": user("  *  ")},  # empty:prompt
        good | {"chosen": user("Rayleigh scattering.")},  # not_one_assistant_message:chosen
        good | {"rejected": good["chosen"]},  # tie
        "not an object",  # not_an_object
    ]
    path = write_rows(tmp_path / "data.jsonl", [good, *bad])
    records, log = load_pairs("auto", [str(path)])
    assert len(records) == log.kept == 1
    assert log.counts == {
        "missing_field:prompt": 2,
        "not_messages:chosen": 1,
        "not_messages:rejected": 1,
        "empty:prompt": 1,
        "not_one_assistant_message:chosen": 1,
        "tie": 1,
        "not_an_object": 1,
    }
    assert log.examples["tie"] == [f"{path}:8"]


def test_implicit_prompts_that_differ_or_are_missing_are_skipped(tmp_path):
    rows = [
        {
            "chosen": user("Hi") + assistant("Hello!"),
            "rejected": user("Hey") + assistant("Go away."),
        },  # prompt_mismatch
        {"chosen": user("Hi") + assistant("Hello!"), "rejected": user("Hi")},  # no_final_assistant_turn:rejected
        {"chosen": assistant("Hello!"), "rejected": assistant("Go away.")},  # no_common_prompt
    ]
    _, log = load_pairs("preference", [str(write_rows(tmp_path / "chat.jsonl", rows))])
    assert log.counts == {"prompt_mismatch": 1, "no_final_assistant_turn:rejected": 1, "no_common_prompt": 1}
    _, log = load_pairs(
        "preference", [str(write_rows(tmp_path / "text.jsonl", [{"chosen": "Yes!", "rejected": "Yes?"}]))]
    )
    assert log.counts == {"no_common_prompt": 1}


def test_field_options_map_other_column_names_in_every_stage(pairs, posts, tmp_path):
    renamed = [{"question": query(p), "better": c, "worse": r} for p, c, r in pairs]
    data = write_rows(tmp_path / "pairs.jsonl", renamed)
    cfg = resolve(
        "rm",
        PRESETS["rm"],
        None,
        {
            "data": str(data),
            "data_format": "auto",
            "prompt_field": "question",
            "chosen_field": "better",
            "rejected_field": "worse",
            "validation_fraction": 0.25,
        },
    )
    train, validation, _ = split_comparisons(cfg.pair_selection)
    assert len(train) + len(validation) == len(pairs) and train[0].fields["prompt"].endswith("TL;DR:")
    names = resolve("sft", PRESETS["sft"], None, {"prompt_field": "question", "completion_field": "answer"}).fields
    assert names == FieldNames(prompt="question", completion="answer")
    sft_data = write_rows(tmp_path / "sft.jsonl", [{"question": query(p), "answer": s} for p, s in posts])
    records, _ = load_sft_data("prompt-completion", [str(sft_data)], names=names)
    assert len(records) == len(posts) and records[0].summary == posts[0][1]
    texts = write_rows(tmp_path / "texts.jsonl", [{"body": query(p)} for p, _ in posts])
    records, _ = load_sft_data("auto", [str(texts)], names=FieldNames(text="body"))
    assert records[0].summary == query(posts[0][0])


def test_data_in_no_known_format_fails_in_one_line_naming_its_columns(ppo_dirs, tmp_path, capsys):
    data = write_rows(tmp_path / "data.jsonl", [{"question_text": "Why?", "label": 1}])
    assert (
        cli_main(
            ["rm", f"model={ppo_dirs['policy']}", f"data={data}", "data_format=auto", f"output_dir={tmp_path / 'run'}"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(
        f"rlhfkit: error: {data}:1: no comparison data format has the columns question_text, label; accepted: "
    )
    assert (
        "preference (chosen, rejected, optionally prompt)" in err
        and "tldr-comparisons (info, summaries, choice)" in err
    )


def test_a_named_generic_format_without_its_columns_fails_in_one_line(posts, tmp_path):
    data = write_rows(tmp_path / "data.jsonl", language_modeling_rows(posts, "standard"))
    with pytest.raises(
        ValueError,
        match=r"data_format=prompt-completion reads the columns prompt, completion; the data has text; "
        r"it looks like language-modeling data \(standard\): read it with data_format=language-modeling",
    ):
        load_sft_data("prompt-completion", [str(data)])


def test_conversational_data_and_a_tokenizer_without_chat_template_fail_in_one_line(posts, ppo_dirs, tmp_path, capsys):
    model = shutil.copytree(ppo_dirs["policy"], tmp_path / "plain")
    (model / "chat_template.jinja").unlink()
    data = write_rows(tmp_path / "data.jsonl", prompt_completion_rows(posts, "conversational"))
    args = stage_args("sft", {"policy": model, "posts": data}, tmp_path / "run", data_format="auto", max_steps=1)
    assert cli_main(["sft", *[f"{k}={v}" for k, v in args.items()]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no chat template" in err and "Traceback" not in err


def test_the_seeds_formats_are_detected_too(ppo_dirs, capsys):
    records, _ = load_sft_data("auto", [str(ppo_dirs["posts"])])
    pairs, _ = load_pairs("auto", [str(ppo_dirs["pairs"])])
    assert records[0].task == "tldr" and pairs[0].task == "tldr"
    out = capsys.readouterr().out
    assert "data format: tldr-sft (detected from columns subreddit, title, post, summary)" in out
    assert "data format: tldr-comparisons (detected from columns info, summaries, choice)" in out


# ---------------------------------------------------------------- auto, the default of every format option


def test_every_format_option_defaults_to_auto():
    defaults = {
        (name, field.name): field.default
        for name, stage in STAGES.items()
        if stage.config
        for field in dataclasses.fields(stage.config)
        if field.name in ("data_format", "prompt_format")
    }
    commands = {"sft", "rm", "dpo", "ppo", "grpo", "rloo", "reinforce", "generate", "rm-eval", "judge-eval"}
    assert commands <= {name for name, _ in defaults} and set(defaults.values()) == {AUTO}, defaults


@pytest.mark.parametrize("form", FORMS)
def test_trl_preference_data_trains_the_reward_model_with_no_format_option(form, pairs, ppo_dirs, tmp_path, capsys):
    data = write_rows(tmp_path / "data.jsonl", preference_rows(pairs, form, "explicit"))
    args = stage_args("rm", ppo_dirs, tmp_path / "run", data=str(data), max_steps=1, max_response_length=64)
    assert cli_main(["rm", *cli_args(args)]) == 0  # no preset: the tldr-rm preset names data_format=tldr-comparisons
    out = capsys.readouterr().out
    assert f"data format: preference, explicit prompt, {form} (detected from columns prompt, chosen, rejected)" in out
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(row["step"] == 1 and "train/loss" in row for row in metrics) and (tmp_path / "run" / "model").is_dir()


SHIPPED = {  # each seed format of the shipped data, with the files and what reads them
    "tldr-sft": ([("tldr-sft-sample", "tldr_sft_sample.jsonl.gz")], (load_sft_data, load_prompts)),
    "tldr-comparisons": (
        [("summarize-from-feedback-comparisons", f"batch{n}.jsonl.gz") for n in (13, 18)],  # the quick start's
        (load_pairs,),
    ),
    "hh": ([("hh-rlhf", "harmless-base", "test.jsonl.gz")], (load_pairs, load_prompts)),
    "gsm8k": ([("gsm8k", "test.jsonl.gz")], (load_sft_data, load_prompts)),
}


@pytest.mark.parametrize(
    ("name", "load"),
    [pytest.param(name, load, id=f"{name}-{load.__name__}") for name, (_, loads) in SHIPPED.items() for load in loads],
)
def test_the_default_reads_the_shipped_data_as_its_format_named_does(name, load, capsys):
    paths = [str(data_file(*parts)) for parts in SHIPPED[name][0]]
    records, log = load(AUTO, paths)
    assert f"data format: {name} (detected from columns " in capsys.readouterr().out
    assert (records, log) == load(name, paths) and log.kept > 0
