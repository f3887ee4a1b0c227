"""SFT on GSM8K's reference solutions (`data_format=gsm8k`): the prompt the on-policy stages give, the solution with
its calculator annotations kept and its `#### N` line written as the prompt asks ("The answer is N.")."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data import AUTO, load_gsm8k, load_prompts, load_sft_data
from rlhfkit.data.examples import tokenize_sft
from rlhfkit.data.gsm8k import CALCULATOR, FINAL_MARK, final_number, sft_solution
from rlhfkit.rewards import answer_format, gsm8k_exact_match, is_correct
from rlhfkit.trainers import sft

from ..support.data import data_file, first_lines
from ..support.mistakes import one_error_line
from ..support.tiny import cli_args, stage_args

# the first training problem of GSM8K, as upstream writes its solution and as SFT trains on it
NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
)


@pytest.fixture(scope="module")
def train_split():
    return [str(data_file("gsm8k", "train.jsonl.gz"))]


def test_the_first_solution_keeps_its_annotations_and_ends_with_the_answer_line():
    assert sft_solution(NATALIA + "#### 72") == NATALIA + "The answer is 72."
    assert sft_solution("#### 1,000") == "The answer is 1000."  # the number as the `answer` column holds it
    with pytest.raises(ValueError, match="ends with `#### N`"):
        sft_solution("no final line")


def test_every_training_solution_converted_keeps_its_steps_and_passes_the_format_and_exact_match_rewards(
    train_split,
):
    records, log = load_sft_data("gsm8k", train_split)
    assert log.kept == len(records) == 7473 and not log.skipped
    completions = [r.summary for r in records]
    solutions = [r.columns["solution"] for r in records]
    assert records[0].summary == NATALIA + "The answer is 72."
    for solution, completion in zip(solutions, completions, strict=True):
        steps, _, _ = solution.rpartition("\n" + FINAL_MARK)
        assert completion == f"{steps}\nThe answer is {final_number(solution)}."
        assert CALCULATOR.findall(completion) == CALCULATOR.findall(solution) and FINAL_MARK not in completion
    assert sum(bool(CALCULATOR.search(c)) for c in completions) > 7000  # the annotations are kept, not stripped
    answers = [r.columns["answer"] for r in records]
    assert answer_format([], completions) == [1.0] * len(records)
    assert gsm8k_exact_match([], completions, answers) == [1.0] * len(records)
    assert all(is_correct(c, final_number(s)) for c, s in zip(completions, solutions, strict=True))


def test_sft_reads_the_prompts_and_columns_the_on_policy_stages_read(train_split, capsys):
    records, _ = load_sft_data(AUTO, train_split)
    assert "data format: gsm8k (detected from columns question, answer)" in capsys.readouterr().out
    prompts, _ = load_prompts("gsm8k", train_split)
    assert records == load_sft_data("gsm8k", train_split)[0] and prompts == load_gsm8k(train_split)[0]
    for record, prompt in zip(records, prompts, strict=True):
        assert (record.prompt_id, record.fields, record.task, record.columns) == (
            prompt.prompt_id,
            prompt.fields,
            prompt.task,
            prompt.columns,
        )
        assert prompt.summary == record.columns["solution"]  # the prompts keep the solution as upstream writes it


def test_an_example_is_the_chat_prompt_then_the_solution_and_eos(tokenizer, train_split):
    records = load_sft_data("gsm8k", train_split)[0][:4]
    examples, log = tokenize_sft(records, tokenizer, 512, 512)
    assert log.kept == 4
    batch = sft.collate_sft(examples, tokenizer.pad_token_id, loss_on_query=False)
    for row, (example, record) in enumerate(zip(examples, records, strict=True)):
        question = json.loads(record.fields["messages"])[0]["content"]
        assert example.query.text.endswith(f"{question}<|im_end|>\n<|im_start|>assistant\n")
        assert example.response[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(example.response[:-1]) == record.summary
        labelled = batch["labels"][row][batch["labels"][row] != -100].tolist()
        assert labelled == example.response  # the loss is on the solution and EOS only


def test_sft_trains_on_a_few_gsm8k_problems_through_the_command_line(ppo_dirs, tmp_path, capsys):
    data = first_lines(tmp_path / "gsm8k.jsonl", 13, "gsm8k", "train.jsonl.gz")
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:9] + lines[10:]))  # the 10th solution is 371 tokens: its answers are 256 at most
    out = tmp_path / "run"
    options = {"validation_posts": 4, "eval_samples": 1, "max_query_length": 256, "max_response_length": 256}
    args = stage_args("sft", ppo_dirs, out, data=str(data), max_steps=2, **options)
    assert cli_main(["sft", *cli_args(args)]) == 0
    printed = capsys.readouterr().out
    assert "data format: gsm8k (detected from columns question, answer)" in printed
    assert "train tokenization: kept 8 examples, skipped none" in printed
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics if "train/loss" in row] == [1, 2]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 1 and all(answer_format([], [s["reference"]]) == [1.0] for s in samples)
    assert all("<<" in s["reference"] and "assistant" in s["prompt"] for s in samples)
    assert (out / "model" / "model.safetensors").is_file()


def test_gsm8k_named_for_other_data_or_other_data_formats_for_gsm8k_fail_naming_the_option(ppo_dirs, tmp_path, capsys):
    gsm8k = first_lines(tmp_path / "gsm8k.jsonl", 12, "gsm8k", "train.jsonl.gz")
    posts_as_gsm8k = stage_args("sft", ppo_dirs, tmp_path / "a", data_format="gsm8k")
    assert one_error_line(["sft", *cli_args(posts_as_gsm8k)], capsys).endswith(
        "field 'question' missing; gsm8k records need: question, answer; it looks like tldr-sft data: read it with "
        "data_format=tldr-sft (or data_format=auto)"
    )
    gsm8k_as_posts = stage_args("sft", ppo_dirs, tmp_path / "b", data=str(gsm8k), data_format="tldr-sft")
    assert one_error_line(["sft", *cli_args(gsm8k_as_posts)], capsys).endswith(
        "it looks like gsm8k data: read it with data_format=gsm8k (or data_format=auto)"
    )
    gsm8k_as_pairs = stage_args("dpo", ppo_dirs, tmp_path / "c", data=str(gsm8k))
    assert one_error_line(["dpo", *cli_args(gsm8k_as_pairs)], capsys).endswith(
        "it looks like gsm8k data, which is read by rlhfkit sft (data_format=gsm8k)"
    )
    assert not any((tmp_path / name).exists() for name in "abc")


def test_gsm8k_named_beside_the_default_data_fails_before_anything_is_read(tmp_path, capsys):
    line = one_error_line(["sft", "data_format=gsm8k", f"output_dir={tmp_path / 'run'}"], capsys)
    assert line == (
        "rlhfkit: error: data_format=gsm8k but data= is left at its default, "
        "vwxyzjn/summarize_from_feedback_tldr_3_filtered (TL;DR posts, tldr-sft): name the data to read with data= "
        "(GSM8K's training problems: ../shared/data/gsm8k/train.jsonl.gz)"
    )
    assert not (tmp_path / "run").exists()
    line = one_error_line(["dpo", "data_format=gsm8k"], capsys)
    assert line.endswith("data_format='gsm8k' is not accepted; choose one of: auto, tldr-comparisons, hh, preference")
