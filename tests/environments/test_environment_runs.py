"""Multi-turn runs from the command line: every on-policy method trains on episodes, the report shows them
turn by turn, HH dialogues replay their human turns, and 2 processes and a SIGKILLed-and-resumed run sample
and train exactly what one uninterrupted process does."""

import json

import pytest

from rlhfkit.tracking import read_metrics

from ..support.episodes import episode_args
from ..support.launches import launch, run_in_this_process
from ..support.processes import assert_same_files, assert_same_metrics, straight_and_resumed
from ..support.tiny import stage_args


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "stage", ["grpo", "ppo", pytest.param("rloo", marks=SLOW), pytest.param("reinforce", marks=SLOW)]
)
def test_every_on_policy_method_trains_on_episodes_and_reports_them_turn_by_turn(stage, environment_dirs, tmp_path):
    run = run_in_this_process(stage, episode_args(stage, environment_dirs, tmp_path / "run", eval_samples=2))
    metrics = read_metrics(run)
    last = metrics[-1]
    assert last["episode/env_tokens_mean"] > 0 and last["episode/turns_mean"] > 1
    assert last["env/insertions"] > 0 and "rewards/environment" in last and last["response/eos_rate"] > 0
    assert last["episode/logprob_gap_max"] < 1e-4  # fp32: the update starts from the sampled log-probabilities
    samples = rows_of(run / "samples.jsonl")
    turns = samples[-1]["turns"]
    assert {t["who"] for t in turns} == {"policy", "environment"} and turns[0]["who"] == "policy"
    report = (run / "report.html").read_text()
    assert "[environment, " in report and "[policy, " in report
    held_out = rows_of(run / "eval_samples.jsonl")
    assert held_out and all(r[f"{stage}_episode"].startswith("[policy, ") for r in held_out)  # held-out episodes too


def test_rlhfkit_grpo_on_hh_dialogues_replays_the_human_turns_and_reports_them(environment_dirs, tmp_path):
    inputs = {"policy": environment_dirs["policy"], "rm": environment_dirs["rm"], "posts": environment_dirs["hh"]}
    args = stage_args(
        "grpo", inputs, tmp_path / "run", prompt_format="hh", environment="hh-dialogue",
        environment_args={"max_human_turns": 3}, check_tokens="true", max_response_length=96, max_query_length=256,
        sample_every=1, mixed_precision="no",
    )
    run = run_in_this_process("grpo", args)
    samples = rows_of(run / "samples.jsonl")
    human = [t for s in samples for t in s["turns"] if t["who"] == "environment"]
    assert human and all(t["text"].startswith("\n<|im_start|>user\n") for t in human)
    dialogues = {json.loads(line)["chosen"] for line in environment_dirs["hh"].read_text().splitlines()}
    replayed = human[0]["text"].split("user\n", 1)[1].split("<|im_end|>")[0]
    assert any(f"Human: {replayed}" in d for d in dialogues)  # a later human turn of a real dialogue
    assert "[environment, " in (run / "report.html").read_text()
    assert read_metrics(run)[-1]["episode/turns_mean"] > 1


@pytest.mark.slow
def test_two_processes_sample_and_train_the_episodes_one_process_does(environment_dirs, one_process_run, tmp_path):
    options = {"generation_batch_size": 4, "sample_every": 1, "log_samples": 4, "eos_trick": "false", "max_steps": 2}
    one = one_process_run("grpo", episode_args("grpo", environment_dirs, None, **options))
    two = tmp_path / "two"
    done = launch("grpo", episode_args("grpo", environment_dirs, two, **options), 2)
    assert done.returncode == 0, done.stderr[-3000:]
    key = lambda r: (r["step"], r["query"], r["episode"])  # noqa: E731
    assert sorted(map(key, rows_of(one / "samples.jsonl"))) == sorted(map(key, rows_of(two / "samples.jsonl")))
    for left, right in zip(read_metrics(one), read_metrics(two), strict=True):
        for name in ("episode/env_tokens_mean", "episode/policy_tokens_mean", "env/insertions", "objective/scores",
                     "loss/policy_avg", "advantages/max"):
            assert right[name] == pytest.approx(left[name], rel=1e-4, abs=1e-5), name


@pytest.mark.faults
def test_a_sigkilled_multi_turn_run_resumes_bit_identical(environment_dirs, tmp_path):
    args = episode_args("grpo", environment_dirs, None, max_steps=3)
    straight, killed = straight_and_resumed("grpo", "tldr-grpo", args, tmp_path, kill_at=1)
    assert_same_files(straight, killed, ["model/model.safetensors"])
    assert_same_metrics(straight, killed, 3)
    assert (straight / "samples.jsonl").read_text() == (killed / "samples.jsonl").read_text()


def test_the_python_api_takes_an_environment_class_defined_in_a_notebook(environment_dirs, tmp_path):
    import rlhfkit
    from rlhfkit.environments import Environment, Reply

    class Echo(Environment):  # defined in a function: not importable, held as an object
        component_names = ("turns",)

        def __init__(self, start, tokenizer, turns: int = 1):
            super().__init__(start, tokenizer)
            self.left = turns

        def respond(self, turn_ids, turn_text, ended_by_eos):
            if not self.left:
                return Reply.end()
            self.left -= 1
            return self.message("user", f"You said {len(turn_ids)} tokens.")

        def components(self):
            return {"turns": self.left}

    options = episode_args("grpo", environment_dirs, tmp_path / "api", max_steps=1)
    result = rlhfkit.grpo(preset="tldr-grpo", **(options | {"environment": Echo, "environment_args": {"turns": 1}}))
    assert "env/turns" in result.metrics and result.metrics["episode/turns_mean"].iloc[-1] >= 1
    assert "environment: python:Echo" in (result.run_dir / "config.yaml").read_text()
