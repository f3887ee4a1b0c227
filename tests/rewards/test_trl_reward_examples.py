"""TRL's reward-function contract. Every reward-function example of TRL's GRPO documentation
(docs/source/grpo_trainer.md, "Using a custom reward function", Examples 1 to 6, huggingface/trl at f2cd577),
copied verbatim, runs unchanged through `rlhfkit.grpo`; None rows, async functions, TRL's `log_extra` and
`log_metric` hooks, and `reward_errors=skip` on a grader that fails on 10% of its rows."""

import asyncio
import json
import math
import threading
import time

import pytest

# ---------------------------------------------------------------- TRL's examples, verbatim, one namespace each

EXAMPLE_1 = '''
def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]
'''

EXAMPLE_1_1 = '''
def reward_func(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]
'''

EXAMPLE_2 = '''
import re

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]
'''

EXAMPLE_3 = r'''
import re

def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
'''

EXAMPLE_4 = '''
from datasets import Dataset

# Define a dataset that contains both math and coding problems
dataset = Dataset.from_list(
    [
        {"prompt": "What is 2+2?", "task": "math"},
        {"prompt": "Write a function that returns the sum of two numbers.", "task": "code"},
        {"prompt": "What is 3*4?", "task": "math"},
        {"prompt": "Write a function that returns the product of two numbers.", "task": "code"},
    ]
)

# Math-specific reward function
def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards

# Coding-specific reward function
def coding_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):
        if t == "coding":
            # Calculate coding-specific reward
            works = test_code_solution(prompt, completion)
            reward = 1.0 if works else -1.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards
'''

EXAMPLE_5 = '''
import asyncio

async def async_reward_func(prompts, completions, **kwargs):
    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)
    await asyncio.sleep(0.01)
    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0
    return [1.0 if completion else 0.0 for completion in completions]
'''

EXAMPLE_6 = r'''
import re

def reward_func(completions, ground_truth, log_extra=None, log_metric=None, **kwargs):
    extracted = [re.search(r"\\boxed\{(.*?)\}", c) for c in completions]
    extracted = [m.group(1) if m else None for m in extracted]
    rewards = [1.0 if e == gt else 0.0 for e, gt in zip(extracted, ground_truth)]

    if log_extra:
        log_extra("golden_answer", list(ground_truth))
        log_extra("extracted_answer", [e or "[none]" for e in extracted])

    if log_metric:
        log_metric("accuracy", sum(rewards) / len(rewards))

    return rewards
'''


def example(source: str, **helpers) -> dict:
    """The names an example defines, run as written (with the helpers it calls but does not define)."""
    namespace = dict(helpers)
    exec(compile(source, "trl-docs-example", "exec"), namespace)  # noqa: S102 - TRL's documented code, verbatim
    return namespace


def math_check(prompt, completion):  # Example 4 calls these without defining them
    return "4" in completion or "12" in completion


def code_check(prompt, completion):
    return "def " in completion


TEXT_PROMPTS = [{"prompt": f"Problem: what is {a} + {a}? Solution:", "ground_truth": str(2 * a)} for a in range(12)]
CHAT_PROMPTS = [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}]} for a in range(12)]


def trl_run(tiny_model_dir, tmp_path, monkeypatch, functions, rows, **options):
    """A two-update GRPO run of `functions` on in-memory `rows` through the Python API: (its folder, metrics)."""
    import datasets

    import rlhfkit
    from rlhfkit.models import load_policy

    from ..support.tiny import TINY

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    model, tokenizer = load_policy(str(tiny_model_dir))
    data = rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_list(rows)
    settings = TINY["grpo"] | {"validation_posts": 0, "eos_trick": False, "output_dir": str(tmp_path / "run")}
    result = rlhfkit.grpo(model=model, tokenizer=tokenizer, data=data, reward_functions=functions,
                          prompt_format="auto", **settings | options)
    return tmp_path / "run", result.metrics


@pytest.mark.parametrize(
    ("sources", "rows"),
    [
        ([EXAMPLE_1, EXAMPLE_2, EXAMPLE_5], CHAT_PROMPTS),  # token count, a format, async: conversational data
        ([EXAMPLE_1_1], TEXT_PROMPTS),
        ([EXAMPLE_3], TEXT_PROMPTS),
    ],
    ids=["examples-1-2-5", "example-1.1", "example-3"],
)
def test_trl_documented_reward_functions_run_unchanged(tiny_model_dir, tmp_path, monkeypatch, sources, rows):
    spaces = [example(s) for s in sources]
    functions = [v for space in spaces for k, v in space.items() if k.endswith("reward_func") and callable(v)]
    _, metrics = trl_run(tiny_model_dir, tmp_path, monkeypatch, functions, rows)
    assert list(metrics["step"]) == [1, 2]
    for fn in functions:
        assert list(metrics[f"rewards/{fn.__name__}_errors"]) == [0, 0]
        assert list(metrics[f"reward/{fn.__name__}/none_fraction"]) == [0, 0]


def test_trl_multi_task_example_scores_each_row_by_its_task_and_drops_rows_no_function_scores(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """Example 4 as documented: its coding function tests `t == "coding"` on rows tagged "code", so those rows
    are scored by no function: dropped from the update and counted, as TRL ignores them."""
    space = example(EXAMPLE_4, check_math_solution=math_check, test_code_solution=code_check)
    functions = [space["math_reward_func"], space["coding_reward_func"]]
    _, metrics = trl_run(tiny_model_dir, tmp_path, monkeypatch, functions, space["dataset"],
                         total_batch_size=8, samples_per_prompt=2)
    assert list(metrics["rewards/math_reward_func_errors"]) == [0, 0]
    assert list(metrics["reward/coding_reward_func/none_fraction"]) == [1.0, 1.0]
    # each update draws 4 prompts x 2 samples: the 2 code prompts' 4 rows are unscored, the math ones scored
    assert list(metrics["reward/dropped_rows"]) == [4, 4]
    assert list(metrics["reward/math_reward_func/none_fraction"]) == [0.5, 0.5]
    assert "rows of update 1 have no reward" in capsys.readouterr().err


def test_trl_logging_example_logs_its_columns_in_the_samples_and_its_metric(tiny_model_dir, tmp_path, monkeypatch):
    """Example 6: `log_extra` columns in samples.jsonl and the report's samples, `log_metric` in metrics.jsonl."""
    space = example(EXAMPLE_6)
    run, metrics = trl_run(tiny_model_dir, tmp_path, monkeypatch, [space["reward_func"]], TEXT_PROMPTS,
                           sample_every=1)
    assert list(metrics["reward/reward_func/accuracy"]) == [0.0, 0.0]  # a random tiny model boxes nothing
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["extracted_answer"] == "[none]" for s in samples)
    truths = {r["ground_truth"] for r in TEXT_PROMPTS}
    assert all(s["golden_answer"] in truths for s in samples)
    assert all(s["query"].startswith(f"Problem: what is {int(s['golden_answer']) // 2} + ") for s in samples)
    report = (run / "report.html").read_text()
    assert "golden_answer" in report and "reward/reward_func/error_fraction" in report


# ---------------------------------------------------------------- failures under reward_errors=skip

FLAKY = '''
CALLS = []
def flaky(completions, **kwargs):
    """A remote grader that cannot take a batch and fails on every 10th completion it is sent."""
    if len(completions) > 1:
        raise ConnectionError("batch refused")
    CALLS.append(1)
    if len(CALLS) % 10 == 1:
        raise TimeoutError("grader timed out")
    return [float(len(completions[0]))]
'''


def test_a_function_failing_on_a_tenth_of_rows_is_skipped_counted_and_the_run_ends_well(ppo_dirs, tmp_path, capsys):
    from rlhfkit.cli import main as cli_main

    from ..support.tiny import PRESETS, cli_args, stage_args

    (tmp_path / "grader.py").write_text(FLAKY)
    out = tmp_path / "run"
    options = stage_args("grpo", ppo_dirs, out, reward_model="", reward_functions=f"{tmp_path / 'grader.py'}:flaky",
                         reward_errors="skip", total_batch_size=20, generation_batch_size=20, eos_trick="false")
    assert cli_main(["grpo", "--preset", PRESETS["grpo"], *cli_args(options)]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/flaky/error_fraction"] for m in metrics] == [pytest.approx(0.1)] * 2
    assert [m["rewards/flaky_errors"] for m in metrics] == [2, 2]
    assert [m["reward/dropped_rows"] for m in metrics] == [2, 2]
    assert all(math.isfinite(m["objective/scores"]) for m in metrics)
    assert "reward/flaky/error_fraction" in (out / "report.html").read_text()
    assert "raised TimeoutError: grader timed out" in capsys.readouterr().err


def test_more_failures_than_max_reward_error_fraction_stop_the_update_in_one_line():
    import torch

    from rlhfkit.errors import ConfigError
    from rlhfkit.onpolicy.reward_sources import RewardSources
    from rlhfkit.rewards import RewardFunctions

    sources = RewardSources(RewardFunctions(["grader"], [len]), False, [1.0], max_error_fraction=0.25)
    failed = torch.tensor([[True], [False], [False], [False]])
    sources.stop_if_failed(failed, 3)  # 25%: not more than the limit
    with pytest.raises(ConfigError, match=r"'grader' failed on 50% of the 4 rows of update 3, more than "
                                          r"max_reward_error_fraction=0.25"):
        sources.stop_if_failed(torch.tensor([[True], [True], [False], [False]]), 3)


def test_the_old_stop_option_is_refused_with_its_replacement(ppo_dirs, tmp_path):
    from rlhfkit.errors import ConfigError
    from rlhfkit.onpolicy.reward_sources import RewardSources
    from rlhfkit.stages import resolve

    from ..support.tiny import PRESETS, stage_args

    cfg = resolve("grpo", PRESETS["grpo"], None, stage_args("grpo", ppo_dirs, tmp_path, stop_on_reward_error="true"))
    with pytest.raises(ConfigError, match="stop_on_reward_error=true was replaced by reward_errors=stop"):
        RewardSources.of(cfg.reward_options)


# ---------------------------------------------------------------- async functions


def overlap_probe(delay: float):
    """An async function that takes one completion at a time (a batch call raises, so each row is called alone)
    and records how many of its calls were running at once."""
    running, most = [0], [0]

    async def one_at_a_time(completions, **kwargs):
        if len(completions) != 1:
            raise ValueError("one completion per request")
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(delay)
        running[0] -= 1
        return [1.0]

    return one_at_a_time, most


def test_an_async_function_is_awaited_and_its_8_calls_overlap():
    from rlhfkit.rewards import RewardFunctions

    fn, most = overlap_probe(0.3)
    functions = RewardFunctions(["one_at_a_time"], [fn])
    started = time.monotonic()
    assert functions.score(["p"] * 8, list("abcdefgh"), {}, [f"w{i}" for i in range(8)]) == [[1.0] * 8]
    assert most[0] == 8 and time.monotonic() - started < 8 * 0.3 / 2  # together, not one after another
    assert functions.take_errors() == []


def test_async_functions_of_a_batch_run_together_within_the_timeout_and_inside_a_running_loop():
    from rlhfkit.rewards import RewardFunctions

    async def slow(completions, **kwargs):
        await asyncio.sleep(0.3)
        return [2.0] * len(completions)

    async def stuck(completions, **kwargs):
        await asyncio.sleep(30)

    functions = RewardFunctions(["a", "b", "stuck"], [slow, slow, stuck], on_error="score", timeout=1.0)
    started = time.monotonic()
    assert functions.score(["p"] * 2, ["x", "y"], {}, ["w1", "w2"]) == [[2.0, 2.0], [2.0, 2.0], [-1.0, -1.0]]
    assert time.monotonic() - started < 1.0 + 0.5  # the slow calls overlap each other and the stuck one
    assert [e.problem for e in functions.take_errors()] == ["still running after reward_timeout=1 s: stopped"] * 2

    async def notebook_cell():  # a notebook's cell runs inside an event loop of its own
        return functions.score(["p"], ["x"], {}, ["w1"])[:2], threading.current_thread()

    assert asyncio.run(notebook_cell())[0] == [[2.0], [2.0]]


def test_an_async_function_is_recognised_before_anything_loads():
    """An async function: its required columns read from its signature, and it is called as async, not iterated."""
    import functools

    from rlhfkit.reward_calls import is_async
    from rlhfkit.rewards import required_columns

    async def graded(prompts, completions, answer, **kwargs):
        return [0.0] * len(completions)

    class Grader:
        async def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)

    assert required_columns(graded) == ["answer"]
    assert is_async(graded) and is_async(functools.partial(graded, answer=None)) and is_async(Grader())
    assert not is_async(len)


# ---------------------------------------------------------------- TRL's logging hooks


def test_log_extra_and_log_metric_keep_each_row_s_value_also_when_rows_are_retried_alone():
    from rlhfkit.rewards import RewardFunctions

    def logs(completions, log_extra, log_metric, **kwargs):
        log_extra("length", [len(c) for c in completions])
        log_metric("calls", 1.0)
        if any(c == "bad" for c in completions):
            raise ValueError("bad")
        return [1.0] * len(completions)

    functions = RewardFunctions(["logs"], [logs])
    functions.score(["p"] * 3, ["a", "bad", "ccc"], {}, ["w1", "w2", "w3"])
    assert functions.logs.extra == {"length": [1, None, 3]}  # the failed row's call logged nothing kept
    assert functions.logs.metrics == {"logs/calls": [1.0, 1.0]}  # the two rows that succeeded alone

    def miscounted(completions, log_extra, **kwargs):
        log_extra("length", [0])
        return [1.0] * len(completions)

    functions = RewardFunctions(["miscounted"], [miscounted], on_error="score")
    assert functions.score(["p"] * 2, ["a", "b"], {}, ["w1", "w2"]) == [[1.0, 1.0]]  # alone, one value is right
    assert functions.take_errors() == []


# ---------------------------------------------------------------- dropped rows take no part in the update


def test_a_dropped_row_takes_no_part_in_group_baselines_whitening_or_the_loss():
    import dataclasses

    import torch

    from rlhfkit import ops
    from rlhfkit.onpolicy.advantages import compute_advantages
    from rlhfkit.onpolicy.trainer import objective_of
    from rlhfkit.rollout import RolloutBatch
    from rlhfkit.stages import resolve

    mask = torch.ones(6, 3, dtype=torch.bool)
    zeros = torch.zeros(6, 3)
    raw = torch.tensor([1.0, 3.0, math.nan, 0.0, 2.0, 5.0])  # two groups of 3; row 2 unscored
    batch = RolloutBatch(torch.arange(6), torch.ones(6, 1, dtype=torch.long), torch.ones(6, 1),
                         torch.zeros(6, 3, dtype=torch.long), mask, torch.ones(6, dtype=torch.bool),
                         logprobs=zeros, ref_logprobs=zeros, raw_scores=raw)
    grpo = dataclasses.replace(resolve("grpo", None, None, {}), samples_per_prompt=3, whiten_advantages=True)
    out = compute_advantages(batch, grpo.advantage_options, 0.0)
    assert math.isnan(float(out.scores[2])) and float(out.advantages[2].abs().sum()) == 0.0
    # the same as the scored rows alone: group statistics over them, whitened over them
    relative = ops.group_relative_advantages(torch.tensor([1.0, 3.0, 0.0, 2.0, 5.0]), torch.tensor([0, 0, 1, 1, 1]))
    expected = ops.masked_whiten(relative.unsqueeze(1) * torch.ones(5, 3), torch.ones(5, 3, dtype=torch.bool))
    torch.testing.assert_close(out.advantages[[0, 1, 3, 4, 5]], expected)
    assert objective_of(grpo).loss_mask(out)[2].sum() == 0 and objective_of(grpo).units(out).tolist()[2] == 0.0
    rloo = dataclasses.replace(resolve("rloo", None, None, {}), samples_per_prompt=3)
    advantages = compute_advantages(batch, rloo.advantage_options, 0.0).advantages[:, 0]
    assert advantages[:3].tolist() == [-2.0, 2.0, 0.0]  # rows 0, 1 compared with each other alone


# ---------------------------------------------------------------- the EOS trick with reward functions alone


def test_the_eos_trick_deciding_most_function_rewards_warns_once_and_the_report_says_it(capsys):
    import torch

    from rlhfkit.onpolicy.reward_sources import RewardSources
    from rlhfkit.report.caveats import eos_trick_caveat
    from rlhfkit.rewards import RewardFunctions
    from rlhfkit.rollout import RolloutBatch

    sources = RewardSources(RewardFunctions(["f"], [len]), False, [1.0], eos_trick=True)
    has_eos = torch.tensor([True, False, False, False])
    batch = RolloutBatch(torch.arange(4), None, None, torch.zeros(4, 2), torch.ones(4, 2, dtype=torch.bool),
                         has_eos, reward_components=torch.ones(4, 1), reward_failures=torch.zeros(4, 1, dtype=bool))
    for update in (1, 2):
        sources.check_update(batch, update, _one_process())
    err = capsys.readouterr().err
    assert err.count("the EOS trick (Detail 23, eos_trick=true) replaced the reward functions' values of 3 of 4") == 1
    with_model = RewardSources(RewardFunctions(["f"], [len]), True, [1.0, 1.0], eos_trick=True)
    with_model.check_update(dataclasses_replace(batch, reward_components=torch.ones(4, 2)), 1, _one_process())
    assert "EOS trick" not in capsys.readouterr().err  # the paper's default, for what it was made for
    assert "replaced the reward functions' values of 75%" in eos_trick_caveat([0.25, 0.25], True)
    assert eos_trick_caveat([0.25], False) == "" and eos_trick_caveat([0.75], True) == ""


def _one_process():
    from rlhfkit.distributed import ONE_PROCESS

    return ONE_PROCESS


def dataclasses_replace(batch, **changes):
    import dataclasses

    return dataclasses.replace(batch, **changes)
