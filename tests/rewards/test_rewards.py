"""Reward functions beside reward models: the built-ins against hand-written cases, user
callables by `module:function`, failures reported with their row and counted (never a silent zero),
the weighted sum the on-policy stages train on, sequence-classification reward models, GSM8K."""

import json
import math

import numpy as np
import pytest
import torch

from rlhfkit.data.gsm8k import calculator_steps, final_number, load_gsm8k
from rlhfkit.errors import ConfigError
from rlhfkit.eval import gsm8k
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.onpolicy.scoring import PromptTexts
from rlhfkit.reward_models import ScalarModel, load_reward_model
from rlhfkit.rewards import RewardFunctions, answer_format, extract_answer, gsm8k_exact_match, length_penalty
from rlhfkit.stages import resolve

from ..support.data import data_file
from ..support.gradients import collected
from ..support.tiny import PRESETS, stage_args

GSM8K_TEST = data_file("gsm8k", "test.jsonl.gz")


@pytest.mark.parametrize(
    "completion, reference, expected",
    [
        ("5 + 7 = 12.\nThe answer is 12.", "12", 1.0),
        ("So, the answer is 1,234.", "1234", 1.0),
        ("She pays $18 in total.", "18", 1.0),  # no answer phrase: the last number
        ("The answer is 12. Then 3 more people came.", "12", 1.0),  # the stated answer wins over later numbers
        ("The answer is -3.5", "-3.5", 1.0),
        ("12 apples and 13 pears", "12", 0.0),
        ("I do not know.", "12", 0.0),
        ("#### 72", "72", 1.0),
    ],
)
def test_gsm8k_exact_match_on_hand_written_cases(completion, reference, expected):
    assert gsm8k_exact_match(["q"], [completion], answer=[reference]) == [expected]


def test_answer_extraction_and_format_reward():
    assert extract_answer("3 * 4 = 12, so the answer is 12.") == 12.0
    assert extract_answer("no digits here") is None
    assert answer_format([], ["Work.\nThe answer is 18.", "The answer is 18. Bye!", "18", "the answer is $1,000"]) == [
        1.0,
        0.0,
        0.0,
        1.0,
    ]


def test_length_penalty_is_minus_the_share_of_the_budget():
    assert length_penalty(["a"] * 3, ["x"] * 3, completion_lengths=[0, 50, 100], max_completion_length=100) == [
        0.0,
        -0.5,
        -1.0,
    ]


def test_user_callable_by_module_and_by_file(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def shouting(prompts, completions, answer, **columns):\n"
        "    return [float(c.isupper()) + float(a) for c, a in zip(completions, answer)]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("my_rewards:shouting", str(tmp_path / "my_rewards.py") + ":shouting"):
        functions = RewardFunctions.from_specs([spec])
        assert functions.names == ["shouting"]
        scores = functions.score(["p", "p"], ["LOUD", "quiet"], {"answer": [1, 2], "unused": [0, 0]}, ["f:1", "f:2"])
        assert scores == [[2.0, 2.0]]
    with pytest.raises(ConfigError, match="has no function 'missing'"):
        RewardFunctions.from_specs(["my_rewards:missing"])
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        RewardFunctions.from_specs(["no_such_module:f"])
    with pytest.raises(ConfigError, match="neither a built-in"):
        RewardFunctions.from_specs(["gsm9k"])


def fragile(prompts, completions, **columns):
    out = []
    for c in completions:
        if "boom" in c:
            raise ValueError("cannot parse")
        out.append(math.nan if "nan" in c else 1.0)
    return out


def test_a_failing_row_is_reported_with_its_row_and_counted_never_zero(capsys):
    functions = RewardFunctions(["fragile"], [fragile], on_error="score", error_score=-7.0)
    scores = functions.score(
        ["p"] * 4, ["fine", "boom", "nan", "fine"], {}, ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "a.jsonl:4"]
    )
    assert scores == [[1.0, -7.0, -7.0, 1.0]]  # the good rows keep their value, the bad ones get error_score
    errors = functions.take_errors()
    assert [(e.row, e.where) for e in errors] == [(1, "a.jsonl:2"), (2, "a.jsonl:3")]
    assert "raised ValueError: cannot parse" in errors[0].line() and "returned nan" in errors[1].line()
    skipping = RewardFunctions(["fragile"], [fragile])  # the default, reward_errors=skip: no value at all
    values = skipping.score(["p"] * 3, ["fine", "boom", "nan"], {}, ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3"])[0]
    assert values[0] == 1.0 and math.isnan(values[1]) and math.isnan(values[2])
    assert [e.row for e in skipping.take_errors()] == [1, 2]
    stopping = RewardFunctions(["fragile"], [fragile], on_error="stop")
    with pytest.raises(ConfigError, match=r"failed on row 1 \(a.jsonl:2\): raised ValueError.*reward_errors=stop"):
        stopping.score(["p"] * 2, ["fine", "boom"], {}, ["a.jsonl:1", "a.jsonl:2"])


def test_wrong_count_of_values_fails_every_row_of_the_call():
    functions = RewardFunctions(["short"], [lambda prompts, completions, **c: [1.0]], on_error="score")
    assert functions.score(["p"] * 2, ["a", "b"], {}, ["w1", "w2"]) == [
        [-1.0, -1.0]
    ]  # no value can be matched to its row
    assert [e.problem for e in functions.take_errors()] == ["returned 1 values for 2 completions"] * 2


@pytest.mark.parametrize("value", ["1.0", "good", b"1", [1.0], object()])
def test_a_value_that_is_not_a_number_fails_its_row_even_a_numeric_string(value):
    """A numeric string: "1.0" fails as "good" does; only numbers (and None: not scored) are values."""
    functions = RewardFunctions(["odd"], [lambda prompts, completions, **c: [value, 2]], on_error="score")
    assert functions.score(["p"] * 2, ["a", "b"], {}, ["w1", "w2"]) == [[-1.0, 2.0]]
    [error] = functions.take_errors()
    assert error.row == 0 and error.problem == f"returned {value!r}, not a number"


def test_none_means_the_function_does_not_score_the_row_and_is_no_failure():
    functions = RewardFunctions(["math"], [lambda prompts, completions, task, **c: [1.0 if t == "math" else None
                                                                                     for t in task]])
    [values] = functions.score(["p"] * 3, ["a", "b", "c"], {"task": ["math", "code", "math"]}, ["w1", "w2", "w3"])
    assert values[0] == values[2] == 1.0 and math.isnan(values[1]) and functions.take_errors() == []


def test_positional_only_parameters_are_refused_before_anything_loads(tmp_path):
    """Positional-only parameters: a function called by keyword cannot reach them; said in one line at from_specs."""
    (tmp_path / "positional.py").write_text("def f(prompts, completions, /, **kwargs):\n    return [0.0]\n")
    with pytest.raises(ConfigError, match=r"reward_functions: f takes prompts, completions as positional-only"):
        RewardFunctions.from_specs([f"{tmp_path / 'positional.py'}:f"])


def test_gsm8k_records_keep_the_final_number_and_count_steps(tmp_path):
    assert final_number("48/2 = <<48/2=24>>24\n#### 1,024") == "1024" and final_number("no mark") is None
    assert calculator_steps("a <<1+1=2>> b <<2*3=6>>") == 2
    bad = tmp_path / "gsm.jsonl"
    bad.write_text(
        json.dumps({"question": "How many?", "answer": "It is 3.\n#### 3"})
        + "\n"
        + json.dumps({"question": "How many?", "answer": "no final line"})
        + "\n"
        + json.dumps({"question": "", "answer": "#### 1"})
        + "\n"
    )
    records, log = load_gsm8k([str(bad)])
    assert [r.columns["answer"] for r in records] == ["3"] and records[0].task == "chat"
    assert dict(log.counts) == {"no_final_answer": 1, "no_question": 1}
    real, _ = load_gsm8k([str(GSM8K_TEST)])
    assert len(real) == 1319 and real[0].columns["answer"] == "18"


def on_policy_setup(stage, ppo_dirs, tmp_path, **extra):
    cfg = resolve(stage, PRESETS[stage], None, stage_args(stage, ppo_dirs, tmp_path / "run", **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, train


def test_the_score_is_the_weighted_sum_of_functions_and_reward_model(ppo_dirs, tmp_path, monkeypatch):
    (tmp_path / "toy_rewards.py").write_text(
        "def vowels(prompts, completions, **columns):\n"
        "    return [float(sum(ch in 'aeiou' for ch in c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg, models, train = on_policy_setup(
        "grpo", ppo_dirs, tmp_path, reward_functions="toy_rewards:vowels,length", reward_weights="0.5,2.0,3.0"
    )
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef, texts=PromptTexts.of(train))
    vowels, length, rm = batch.reward_components.T
    texts = [
        models.tokenizer.decode(batch.responses[i][batch.mask[i]].tolist(), skip_special_tokens=True)
        for i in range(batch.size)
    ]
    assert vowels.tolist() == [float(sum(ch in "aeiou" for ch in t)) for t in texts]
    torch.testing.assert_close(length, -batch.lengths.float() / cfg.max_response_length)
    torch.testing.assert_close(
        rm,
        models.reward(
            batch.input_ids(),
            batch.attention_mask(),
            context_length=batch.context_length,
            eos_index=batch.context_length + batch.lengths - 1,
        ),
    )
    torch.testing.assert_close(batch.raw_scores, 0.5 * vowels + 2.0 * length + 3.0 * rm)


def test_reward_functions_alone_train_and_log_each_component(ppo_dirs, tmp_path, capsys):
    from rlhfkit.cli import main as cli_main

    (tmp_path / "picky.py").write_text(  # fails on every other call: the batch's, then every other row's
        "CALLS = []\n"
        "def picky(prompts, completions, **columns):\n"
        "    CALLS.append(1)\n"
        "    if len(CALLS) % 2:\n"
        "        raise KeyError('no posts please')\n"
        "    return [1.0] * len(completions)\n"
    )
    args = stage_args(
        "grpo",
        ppo_dirs,
        tmp_path / "run",
        reward_model="",
        reward_functions=f"{tmp_path / 'picky.py'}:picky,length",
        max_steps=1,
        eval_samples=2,
        reward_errors="score",
        reward_error_score=-3.0,
    )
    assert cli_main(["grpo", *[f"{k}={v}" for k, v in args.items()]]) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"rewards/picky", "rewards/length", "rewards/picky_errors", "rewards/length_errors"} <= set(metrics[0])
    assert metrics[0]["rewards/picky_errors"] == 4 and metrics[0]["rewards/picky"] == -1.0  # rows 1, 3, 5, 7 of 8
    assert metrics[0]["rewards/length_errors"] == 0 and "rm_score" not in json.dumps(metrics)
    err = capsys.readouterr().err
    assert "reward function 'picky' failed on row 1 (" in err and "posts.jsonl:" in err and "raised KeyError" in err
    evaluation_metrics = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert {"eval/grpo_score", "eval/grpo_reward_picky", "eval/grpo_reward_length"} <= set(evaluation_metrics)


def test_nothing_to_optimise_and_mismatched_weights_fail_in_one_line(ppo_dirs, tmp_path):
    with pytest.raises(ConfigError, match="nothing to optimise"):
        on_policy_setup("grpo", ppo_dirs, tmp_path, reward_model="")
    with pytest.raises(ConfigError, match=r"reward_weights has 1 values for 2 rewards \(length, reward_model\)"):
        on_policy_setup("grpo", ppo_dirs, tmp_path, reward_functions="length", reward_weights="1.0")
    with pytest.raises(ConfigError, match="value model"):
        on_policy_setup("ppo", ppo_dirs, tmp_path, reward_model="", reward_functions="length")


def test_a_sequence_classification_reward_model_scores_at_eos_like_its_own_head(tiny_model_dir, ppo_dirs, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(3)
    classifier = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    classifier.config.pad_token_id = tokenizer.pad_token_id
    classifier.save_pretrained(tmp_path / "trl-rm")
    tokenizer.save_pretrained(tmp_path / "trl-rm")
    reward, _ = load_reward_model(tmp_path / "trl-rm")
    assert isinstance(reward, ScalarModel)
    ids = torch.tensor([[5, 6, 7, tokenizer.eos_token_id], [8, 9, tokenizer.eos_token_id, tokenizer.pad_token_id]])
    mask = (ids != tokenizer.pad_token_id).long()
    with torch.no_grad():
        expected = classifier.eval()(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        got = reward(ids, mask, eos_index=torch.tensor([3, 2]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    cfg, models, train = on_policy_setup("ppo", ppo_dirs, tmp_path, reward_model=str(tmp_path / "trl-rm"))
    assert torch.equal(models.value.head.weight, models.reward.head.weight)  # Detail 22: the value model starts as it
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    assert batch.reward_components.shape == (batch.size, 1)


def graded_answers(correct: list[list[int]], in_format: list[int] | None = None, tool_calls=None) -> dict:
    """Answers graded as `gsm8k.graded` grades them: right as given, the right number mentioned by every right
    answer and by the first wrong one, in format where `in_format` says (all by default), an annotation written in
    the first, and `tool_calls` answered by a calculator (None: answered without one)."""
    values = np.array(correct, dtype=np.float64)
    mentioned, wrong = values.copy(), np.argwhere(values == 0)
    if len(wrong):
        mentioned[tuple(wrong[0])] = 1
    return {
        "correct": values,
        "mentioned": mentioned,
        "format": np.ones_like(values) if in_format is None else np.array(in_format, dtype=np.float64)[:, None]
        * np.ones_like(values),
        "tokens": np.full_like(values, 10.0),
        "eos": np.ones_like(values),
        "texts": np.full(values.shape, "x", dtype=object),
        "annotated": (np.arange(values.shape[0]) == 0)[:, None] * np.ones_like(values),
        "tool_calls": np.full_like(values, np.nan) if tool_calls is None else np.array(tool_calls, float)[:, None],
    }


def test_accuracy_table_pairs_every_policy_with_the_first():
    results = {
        "base": {
            "greedy": graded_answers([[1], [0], [0], [1]]),
            "sampled": graded_answers([[1, 0], [0, 0], [0, 1], [0, 0]]),
        },
        "rl": {"greedy": graded_answers([[1], [1], [0], [1]], in_format=[1, 1, 0, 0], tool_calls=[2, 0, 1, 0]),
               "kl": 0.5},
    }
    everything = np.ones(4, dtype=bool)
    base, rl = gsm8k.summary_table(results, everything, seed=0)
    assert base["greedy_accuracy"] == 0.5 and "greedy_minus_first" not in base
    assert base["sampled_accuracy"] == pytest.approx(0.25) and base["pass@2"] == 0.5
    assert rl["greedy_accuracy"] == 0.75 and rl["greedy_minus_first"] == 0.25 and rl["kl_to_reference"] == 0.5
    assert rl["greedy_minus_first_low"] == 0.0 and rl["greedy_minus_first_high"] <= 0.75
    # the right number anywhere (3 right + 1 wrong that mentions it), accuracy in format (2 of 2) and out (1 of 2)
    assert rl["mentions_answer_share"] == 1.0 and base["mentions_answer_share"] == 0.75
    assert (rl["accuracy_in_format"], rl["accuracy_out_of_format"]) == (1.0, 0.5) and rl["format_share"] == 0.5
    assert base["accuracy_in_format"] == 0.5 and "accuracy_out_of_format" not in base  # every base answer in format
    # the gain beyond format: rl's right answers (1, 1, 0, 1) against what base mentions anywhere (1, 1, 0, 1)
    assert rl["greedy_minus_first_mentioned"] == 0.0 and "greedy_minus_first_mentioned" not in base
    # tools: an annotation in the first answer of each; the calculator answered in 2 of rl's 4 answers, 3 calls
    assert base["annotation_share"] == rl["annotation_share"] == 0.25 and "tool_use_share" not in base
    assert rl["tool_use_share"] == 0.5 and rl["tool_calls_mean"] == 0.75
    first_two = np.array([True, True, False, False])
    _, rl_subset = gsm8k.summary_table(results, first_two, seed=0)
    assert rl_subset["problems"] == 2 and rl_subset["greedy_minus_first"] == 0.5


def test_pairs_give_the_paired_difference_of_any_two_policies_and_the_problems_only_one_got_right():
    results = {name: {"greedy": graded_answers(correct)} for name, correct in
               (("base", [[1], [0], [0], [1]]), ("sft", [[0], [1], [0], [1]]), ("calc", [[1], [1], [1], [0]]))}
    models = dict.fromkeys(results, "folder")
    pairs = gsm8k.named_pairs(["calc:sft", "sft:base"], models)
    calc_sft, sft_base = gsm8k.pair_table(results, pairs, np.ones(4, dtype=bool), seed=0)
    assert calc_sft["pair"] == "calc vs sft" and calc_sft["greedy_minus"] == 0.25  # (1 + 0 + 1 - 1) / 4
    assert (calc_sft["both_right"], calc_sft["only_policy_right"], calc_sft["only_baseline_right"]) == (1, 2, 1)
    assert calc_sft["greedy_minus_low"] < 0.25 < calc_sft["greedy_minus_high"]
    assert sft_base["greedy_minus"] == 0.0
    assert (sft_base["only_policy_right"], sft_base["only_baseline_right"]) == (1, 1)
    (last_two,) = gsm8k.pair_table(results, pairs[:1], np.array([False, False, True, True]), seed=0)
    assert last_two["problems"] == 2 and last_two["greedy_minus"] == 0.0 and last_two["both_right"] == 0
    mistakes = (("calc", "policy:baseline"), ("calc:calc", "cannot be its own baseline"), ("calc:rl", "names rl"))
    for bad, named in mistakes:
        with pytest.raises(ConfigError, match=named):
            gsm8k.named_pairs([bad], models)


def test_eval_gsm8k_end_to_end_on_the_tiny_model(tiny_model_dir, tmp_path):
    from rlhfkit.cli import main as cli_main

    out = tmp_path / "eval"
    assert (
        cli_main(
            [
                "eval",
                "gsm8k",
                f"models=base={tiny_model_dir},same={tiny_model_dir}",
                f"data={GSM8K_TEST}",
                "max_prompts=6",
                "pass_k=2",
                "max_response_length=6",
                f"reference_model={tiny_model_dir}",
                f"out={out}",
            ]
        )
        == 0
    )
    tables = json.loads((out / "accuracy.json").read_text())["tables"]
    assert list(tables) == ["all", "easy (<= 2 calculator steps)"]
    base, same = tables["all"]
    assert base["problems"] == 6 and same["greedy_minus_first"] == 0.0  # greedy answers of one model are deterministic
    assert same["kl_to_reference"] == pytest.approx(0.0, abs=1e-5) and "pass@2" in same
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 6 and answers[0]["answer"] == "18" and (out / "report.html").is_file()
