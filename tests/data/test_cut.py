"""Completions longer than max_response_length: SFT and DPO cut free text as TRL's trainers do (its first tokens,
without the EOS), TL;DR summaries and GSM8K solutions are skipped, reward models always skip (Detail 12)."""

import json

from rlhfkit.cli import main as cli_main
from rlhfkit.data import load_pairs, load_sft_data
from rlhfkit.data.examples import fitted_completion, query_limits, tokenize_pairs, tokenize_sft
from rlhfkit.data.formats import encode_completion
from rlhfkit.data.tldr import SFTRecord

from ..support.data import first_lines
from ..support.tiny import cli_args, stage_args

LONG = " ".join(f"word{i}" for i in range(60))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_fitting_completion_is_kept_whole_and_a_long_one_cut_from_the_right_or_skipped():
    assert fitted_completion([1, 2, 3], 3, cut=True) == [1, 2, 3]
    assert fitted_completion([1, 2, 3, 9], 3, cut=True) == [1, 2, 3]  # the EOS (9) goes with the cut
    assert fitted_completion([1, 2, 3, 9], 3, cut=False) is None


def test_sft_cuts_a_long_conversational_completion_and_counts_it(tokenizer, tmp_path):
    messages = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": LONG}]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages}])
    records, _ = load_sft_data("auto", [str(data)])
    examples, log = tokenize_sft(records, tokenizer, 64, 16, cut_long=True)
    whole = encode_completion(tokenizer, LONG, records[0].task)
    assert [e.response for e in examples] == [whole[:16]] and whole[15] != tokenizer.eos_token_id
    assert log.cut == 1 and log.summary("examples") == (
        "kept 1 examples (1 cut to fit max_response_length, without their EOS), skipped none"
    )
    assert log.to_dict()["cut"] == 1


def test_a_text_without_prompt_is_cut_to_the_query_and_response_budgets_together(tokenizer, tmp_path):
    data = write_jsonl(tmp_path / "lm.jsonl", [{"text": LONG}])
    records, _ = load_sft_data("language-modeling", [str(data)])
    examples, log = tokenize_sft(records, tokenizer, 8, 16, cut_long=True)
    assert len(examples[0].response) == 24 and log.cut == 1


def test_tldr_summaries_and_gsm8k_solutions_stay_whole_or_are_skipped(tokenizer, tmp_path):
    fields = {"subreddit": "test", "title": "A title", "post": "A post."}
    tldr = SFTRecord("p1", fields, LONG, "posts.jsonl:1")
    examples, log = tokenize_sft([tldr], tokenizer, 128, 16, cut_long=True)
    assert not examples and log.counts == {"response_too_long": 1} and log.cut == 0
    gsm8k, _ = load_sft_data("gsm8k", [str(first_lines(tmp_path / "gsm8k.jsonl", 3, "gsm8k", "train.jsonl.gz"))])
    examples, log = tokenize_sft(gsm8k, tokenizer, 256, 16, cut_long=True)  # the answer is the solution's last line
    assert not examples and log.counts == {"response_too_long": 3}


def test_stages_that_read_the_eos_never_cut(tokenizer, tmp_path):
    """A reward model's score is read at the EOS (Detail 12): without cut_long, free text is skipped too."""
    data = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Tell me a story.", "completion": LONG}])
    records, _ = load_sft_data("auto", [str(data)])
    examples, log = tokenize_sft(records, tokenizer, 64, 16)
    assert not examples and log.counts == {"response_too_long": 1}


def preference_rows():
    return [
        {"prompt": "Tell me a story.", "chosen": LONG, "rejected": " A short one."},
        {"prompt": "Tell me another.", "chosen": LONG + " the end", "rejected": LONG + " no end"},
    ]


def test_dpo_pairs_cut_long_responses_and_skip_pairs_the_cut_made_equal(tokenizer, tmp_path):
    records, _ = load_pairs("auto", [str(write_jsonl(tmp_path / "pairs.jsonl", preference_rows()))])
    examples, log = tokenize_pairs(records, tokenizer, query_limits(64, 64), 16, cut_long=True)
    [pair] = examples
    assert len(pair.chosen) == 16 and pair.rejected[-1] == tokenizer.eos_token_id
    assert pair.response_lengths() == (16, len(pair.rejected) - 1)  # a cut response has no EOS to leave out
    assert log.cut == 1 and log.counts == {"tie_after_cut": 1}


def test_reward_model_pairs_are_skipped_not_cut(tokenizer, tmp_path):
    records, _ = load_pairs("auto", [str(write_jsonl(tmp_path / "pairs.jsonl", preference_rows()))])
    examples, log = tokenize_pairs(records, tokenizer, query_limits(64, 64), 16)
    assert not examples and log.counts == {"response_too_long": 2}


def test_hh_responses_are_cut_and_tldr_comparisons_skipped(tokenizer, tmp_path):
    hh = {"chosen": f"\n\nHuman: Tell me a story.\n\nAssistant: {LONG}",
          "rejected": "\n\nHuman: Tell me a story.\n\nAssistant: No."}
    records, _ = load_pairs("hh", [str(write_jsonl(tmp_path / "hh.jsonl", [hh]))])
    assert len(tokenize_pairs(records, tokenizer, query_limits(64, 64), 16, cut_long=True)[0]) == 1
    tldr = {"info": {"id": "t1", "post": "A post.", "title": "T", "subreddit": "s"},
            "summaries": [{"text": LONG, "policy": "a"}, {"text": " short", "policy": "b"}], "choice": 0}
    records, _ = load_pairs("tldr-comparisons", [str(write_jsonl(tmp_path / "tldr.jsonl", [tldr]))])
    examples, log = tokenize_pairs(records, tokenizer, query_limits(128, 128), 16, cut_long=True)
    assert not examples and log.counts == {"response_too_long": 1}


def test_sft_run_trains_on_long_conversations_it_used_to_drop(ppo_dirs, tmp_path, capsys):
    """The reviewer's Capybara-style case: multi-turn conversations whose last answer passes max_response_length."""
    rows = []
    for i in range(8):
        turns = [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
        last = LONG if i % 2 else f"Short answer {i}."
        turns += [{"role": "user", "content": "More?"}, {"role": "assistant", "content": last}]
        rows.append({"messages": turns})
    data = write_jsonl(tmp_path / "capybara.jsonl", rows)
    out = tmp_path / "run"
    options = {"validation_posts": 2, "eval_samples": 0, "max_query_length": 128, "max_response_length": 16}
    args = stage_args("sft", ppo_dirs, out, data=str(data), max_steps=1, **options)
    assert cli_main(["sft", *cli_args(args)]) == 0
    printed = capsys.readouterr().out
    train_line = next(line for line in printed.splitlines() if line.startswith("train tokenization:"))
    assert "kept 6 examples (" in train_line and "cut to fit max_response_length" in train_line
