"""Adding an environment is one subclass of `rlhfkit.environments.Environment` in a file of your own, named by
`environment=module:Class` (docs/architecture.md, "Adding an evaluation task or an environment"): a toy one defined
here alone runs in a tiny `rlhfkit grpo`, and what it did is in the run's samples and metrics."""

import json

from rlhfkit.environments import Environment, Reply
from rlhfkit.tracking import read_metrics

from ..support.episodes import eos_prone_policy, episode_args
from ..support.launches import run_in_this_process

RESULT = "RESULT 42"


class TwoTurnTool(Environment):
    """The toy: the policy's first turn is answered with a fixed tool result, its second ends the episode with
    the number of turns it took as the reward."""

    has_reward = True
    component_names = ("tool_results",)

    def __init__(self, start, tokenizer, result: str = RESULT):
        super().__init__(start, tokenizer)
        self.result, self.turns, self.tool_results = result, 0, 0

    def respond(self, turn_ids, turn_text, ended_by_eos):
        self.turns += 1
        if self.turns == 2:
            return Reply.end(reward=float(self.turns))
        self.tool_results += 1
        return self.message("tool", self.result)

    def components(self):
        return {"tool_results": self.tool_results}


def test_an_environment_defined_in_a_test_runs_through_rlhfkit_grpo(tmp_path):
    # a policy that ends a turn with EOS within a few tokens, so 32 tokens hold both turns and the tool's message
    policy, tokenizer = eos_prone_policy(eos_logit=8.0)
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    problems = tmp_path / "sums.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is {a}+1?", "answer": f"#### {a + 1}"}) + "\n"
                                for a in range(6)))
    inputs = {"policy": tmp_path / "policy", "rm": "", "gsm8k": problems}
    # the environment's reward alone, on one update of 4 episodes, every one logged (the 2 highest, the 2 lowest)
    args = episode_args(
        "grpo", inputs, tmp_path / "run", environment="tests.environments.test_adding_an_environment:TwoTurnTool",
        environment_args={}, max_steps=1, eos_trick="false", validation_posts=2, max_query_length=64,
        max_response_length=32, total_batch_size=4, generation_batch_size=4, samples_per_prompt=2, update_epochs=1,
        log_samples=2,
    )
    run = run_in_this_process("grpo", args)

    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and any(s["has_eos"] for s in samples)
    for sample in samples:
        inserted = [t for t in sample["turns"] if t["who"] == "environment"]
        assert all(t["tokens"] > 0 and f"tool\n{RESULT}" in t["text"] for t in inserted)
        policy_turns = sum(t["who"] == "policy" for t in sample["turns"])
        assert sample["raw_score"] == (policy_turns if sample["has_eos"] else 0.0)  # ended by the toy: its reward
    last = read_metrics(run)[-1]
    assert last["rewards/environment"] == sum(s["raw_score"] for s in samples) / 4
    assert last["env/tool_results"] == sum(t["who"] == "environment" for s in samples for t in s["turns"]) / 4
    assert last["episode/env_tokens_mean"] > 0
