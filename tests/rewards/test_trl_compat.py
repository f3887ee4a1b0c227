"""Reward functions written for TRL run unchanged: called by keyword as TRL's GRPOTrainer and
RLOOTrainer call them, with `completion_ids`, the columns a function names required by name, and, after
conversational prompts, the prompt's messages and each completion as one assistant message."""

import re

import pytest
import torch

from rlhfkit.onpolicy.scoring import rollout_columns
from rlhfkit.rewards import (
    ROLLOUT_COLUMNS,
    RewardFunctions,
    answer_format,
    gsm8k_exact_match,
    required_columns,
    text_of,
)
from rlhfkit.rollout import RolloutBatch

from ..support.tiny import TINY


# TRL's documentation, GRPO Trainer, "Using a custom reward function", Example 2: Reward completions with a
# specific format (https://huggingface.co/docs/trl/v1.9.0/en/grpo_trainer; the same text since v0.20.0), copied
# unchanged: it reads each completion as a list of messages, the form TRL gives after conversational prompts.
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


# TRL's GRPO quick start (docs v0.15.0 to v0.20.0, grpo_trainer): no `prompts` parameter
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def scored(fn, prompts, texts, columns=None) -> list[float]:
    functions = RewardFunctions([fn.__name__], [fn])
    [scores] = functions.score(prompts, texts, columns or {}, [f"d:{i + 1}" for i in range(len(texts))])
    assert functions.take_errors() == []
    return scores


def test_functions_are_called_by_keyword_so_they_may_name_only_what_they_read():
    assert scored(reward_len, ["p", "p"], ["x" * 20, "x" * 5]) == [0.0, -15.0]

    def keyword_only(*, completions, prompts):  # a positional call could not reach it
        return [float(len(p) + len(c)) for p, c in zip(prompts, completions, strict=True)]

    assert scored(keyword_only, ["ab", "c"], ["d", "efg"], {"unused": [0, 0]}) == [3.0, 4.0]

    def ids_only(completion_ids):  # no **kwargs: passed only what it names
        return [float(len(ids)) for ids in completion_ids]

    assert scored(ids_only, ["p", "p"], ["a", "b"], {"completion_ids": [[1, 2, 0], [3]], "answer": [1, 2]}) == [3, 1]


def test_a_record_column_named_like_an_argument_gives_way_to_it():
    def echo(prompts, completions, **kwargs):
        return [float(p == "p" and c == "c") for p, c in zip(prompts, completions, strict=True)]

    assert scored(echo, ["p"], ["c"], {"prompts": ["column"], "completions": ["column"]}) == [1.0]


def test_required_columns_are_the_parameters_without_a_default_by_name():
    def trl_reference(completions, ground_truth, **kwargs):  # TRL's Example 3: the column is its 2nd parameter
        return [0.0] * len(completions)

    def any_order(completion_ids, solution, prompts, completions, has_eos, task=None):
        return [0.0] * len(completions)

    assert required_columns(trl_reference) == ["ground_truth"]
    assert required_columns(any_order) == ["solution"]
    assert required_columns(format_reward_func) == [] and required_columns(reward_len) == []
    functions = RewardFunctions(["trl_reference"], [trl_reference])
    with pytest.raises(Exception, match=r"trl_reference reads the column 'ground_truth', which 1 of 1 prompts lack"):
        functions.check_columns([{"solution": "3"}], ["d:1"])


def test_conversational_prompts_give_their_messages_and_each_completion_as_one_assistant_message():
    conversation = [{"role": "user", "content": "What is 2 + 3?"}]
    seen = {}

    def recording(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    scored(recording, [conversation, "plain text"], ["<think>x</think><answer>5</answer>", "5"])
    assert seen["prompts"] == [conversation, "plain text"]
    assert seen["completions"] == [[{"role": "assistant", "content": "<think>x</think><answer>5</answer>"}], "5"]
    assert scored(format_reward_func, [conversation] * 2, ["<think>x</think><answer>5</answer>", "5"]) == [1.0, 0.0]


def test_built_in_functions_read_a_completion_in_either_form():
    as_text, as_message = "So the answer is 5.", [{"role": "assistant", "content": "So the answer is 5."}]
    assert text_of(as_text) == text_of(as_message) == as_text
    assert gsm8k_exact_match(prompts=[], completions=[as_text, as_message], answer=["5", "5"]) == [1.0, 1.0]
    assert answer_format(prompts=[], completions=[as_text, as_message]) == [1.0, 1.0]


def test_completion_ids_are_the_sampled_tokens_up_to_and_with_eos_as_trl_passes_them():
    eos, pad = 2, 0
    responses = torch.tensor([[5, 6, eos, pad], [7, 8, 9, 10], [eos, pad, pad, pad]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    has_eos = torch.tensor([True, False, True])
    batch = RolloutBatch(
        torch.arange(3), torch.ones(3, 2, dtype=torch.long), torch.ones(3, 2), responses, mask, has_eos
    )
    rollout = rollout_columns(batch, max_length=4)
    assert list(rollout) == list(ROLLOUT_COLUMNS)
    assert rollout["completion_ids"] == [[5, 6, eos], [7, 8, 9, 10], [eos]]
    assert rollout["completion_lengths"] == [3, 4, 1] and rollout["has_eos"] == [True, False, True]
    assert rollout["max_completion_length"] == 4


def test_a_trl_reward_function_and_trl_conversational_prompts_run_unchanged_through_the_python_api(
    tiny_model_dir, tmp_path, monkeypatch
):
    import datasets

    import rlhfkit
    from rlhfkit.models import load_policy

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))  # where the API writes in-memory data
    questions = [f"What is {a} + {a + 1}?" for a in range(12)]
    # TRL's conversational prompt-only format, with a column beside the prompt as TRL's datasets have
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}], "solution": str(2 * a + 1)} for a, q in enumerate(questions)]
    )
    received = []

    def token_count(prompts, completions, completion_ids, **kwargs):  # TRL's Example 1, recording its arguments
        received.append({"prompts": prompts, "completions": completions, "ids": completion_ids} | kwargs)
        return [float(len(ids)) for ids in completion_ids]

    model, tokenizer = load_policy(str(tiny_model_dir))
    options = TINY["grpo"] | {"validation_posts": 4, "output_dir": str(tmp_path / "run")}
    result = rlhfkit.grpo(
        model=model,
        tokenizer=tokenizer,
        data=dataset,
        reward_functions=[format_reward_func, token_count],
        prompt_format="auto",
        eos_trick=False,
        **options,
    )
    metrics = result.metrics
    assert list(metrics["step"]) == [1, 2]
    assert {"rewards/format_reward_func", "rewards/token_count"} <= set(metrics.columns)
    assert list(metrics["rewards/format_reward_func_errors"]) == [0, 0]  # a string completion would fail every row
    assert len(received) == 2
    for call in received:
        assert [p[0]["content"] for p in call["prompts"]] == [questions[int(s) // 2] for s in call["solution"]]
        assert all(p in dataset["prompt"] for p in call["prompts"])
        assert {(len(c), c[0]["role"], type(c[0]["content"])) for c in call["completions"]} == {(1, "assistant", str)}
        assert [len(ids) for ids in call["ids"]] == call["completion_lengths"]
        ended = [ids for ids, eos in zip(call["ids"], call["has_eos"], strict=True) if eos]
        assert all(ids[-1] == tokenizer.eos_token_id for ids in ended)


@pytest.mark.parametrize(
    ("config", "trl_name", "ours"),
    [("GRPOConfig", "num_generations", "samples_per_prompt"), ("GRPOConfig", "beta", "kl_coef"),
     ("RLOOConfig", "num_generations", "samples_per_prompt"), ("SFTConfig", "train_dataset", "data"),
     ("DPOConfig", "max_completion_length", "max_response_length")],
)
def test_a_config_object_given_trl_argument_names_says_the_option_they_mean_here(config, trl_name, ours):
    """GRPOConfig(num_generations=8) was a raw TypeError; the option spelt closest was generation_batch_size."""
    import rlhfkit

    refusal = rf"^unknown key '{trl_name}' in {config}\(\.\.\.\)\. TRL's {trl_name} is {ours} here\."
    with pytest.raises(rlhfkit.ConfigError, match=refusal):
        getattr(rlhfkit, config)(**{trl_name: 1})


def test_the_command_line_gives_trl_users_the_same_hint(capsys):
    from rlhfkit.cli import main

    assert main(["grpo", "num_generations=8"]) == 2
    assert "unknown key 'num_generations' in command-line arguments. TRL's num_generations is samples_per_prompt" in (
        capsys.readouterr().err
    )
    from rlhfkit.stages import resolve

    assert resolve("dpo", None, None, {"beta": 0.2}).beta == 0.2  # DPO's own beta stays its option
