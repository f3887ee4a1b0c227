"""Multi-turn episodes (rlhfkit/environments, docs/environments.md): the ids an episode holds are the chat
template's rendering of its conversation; the random stream does not depend on what an environment
inserts; the last token is always the policy's; at step 0 the ratio is 1 and the KL 0; environment tokens
take no part in the loss; advantages run over the policy's tokens alone."""

import dataclasses
import json

import pytest
import torch

from rlhfkit import ops
from rlhfkit.config import GRPOConfig, PPOConfig, ReinforceConfig
from rlhfkit.environments import Environment, EpisodePlan, EpisodePrompt, EpisodeStart, Reply, check_environment
from rlhfkit.environments.calculator import Gsm8kCalculator
from rlhfkit.environments.dialogue import HHDialogue
from rlhfkit.environments.driver import EpisodeDriver, EpisodeLimits
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.generation import SampleKeys, SamplingParams, sample_responses
from rlhfkit.onpolicy.advantages import compute_advantages
from rlhfkit.onpolicy.update import Optimizers

from ..support.episodes import (
    CHAT_PROMPTS,
    FixedTextEnv,
    environment_run_models,
    eos_prone_policy,
    episode_setup,
    sample_fixed_episodes,
)
from ..support.gradients import collected, run_update

FIXED = "tests.support.episodes:FixedTextEnv"


@pytest.fixture(scope="module")
def eos_prone():
    model, tokenizer = eos_prone_policy()
    return model.eval(), tokenizer


def segments(ids: list[int], sampled: list[bool]) -> list[tuple[bool, list[int]]]:
    runs: list[tuple[bool, list[int]]] = []
    for token, by_policy in zip(ids, sampled, strict=True):
        if not runs or runs[-1][0] != by_policy:
            runs.append((by_policy, []))
        runs[-1][1].append(token)
    return runs


def test_fixed_text_episodes_are_the_chat_templates_rendering_of_their_conversations(eos_prone):
    model, tokenizer = eos_prone
    batch = sample_fixed_episodes(model, tokenizer, budget=80, user_turns=2)  # check_tokens on: each row checked
    assert bool((batch.episodes.policy_mask <= batch.mask).all())
    complete = 0
    for row in range(batch.size):
        n = int(batch.lengths[row])
        runs = segments(batch.responses[row, :n].tolist(), batch.episodes.policy_mask[row, :n].tolist())
        # the conversation as text, each assistant content as the policy's own ids decode
        messages = list(CHAT_PROMPTS[row // 4])
        for by_policy, ids in runs:
            if by_policy:
                content = ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids
                messages.append({"role": "assistant", "content": tokenizer.decode(content)})
            else:
                messages.append({"role": "user", "content": "Fixed reply."})
        if not bool(batch.has_eos[row]):
            continue
        complete += 1
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt = tokenizer.apply_chat_template(CHAT_PROMPTS[row // 4], tokenize=False, add_generation_prompt=True)
        episode = "".join(tokenizer.decode(ids) for _, ids in runs)
        assert prompt + episode + "\n" == rendered  # the template writes "\n" after the final <|im_end|>
        assert [p for p, _ in runs] == [True, False, True, False, True]  # two user turns, three assistant turns
    assert complete >= 4


def test_the_token_check_names_the_first_position_an_environment_gets_wrong(eos_prone):
    model, tokenizer = eos_prone

    class DropsTheSeparator(FixedTextEnv):
        def message(self, role, content):  # the bug verl PR #6921 fixed: the "\n" after <|im_end|> dropped
            reply = super().message(role, content)
            return dataclasses.replace(reply, ids=reply.ids[1:])

    queries, texts = episode_setup(tokenizer)
    plan = EpisodePlan(DropsTheSeparator, {}, max_turns=8, timeout=0.0, check_tokens=True, run_seed=0)
    with pytest.raises(UserError, match=r"episode \d+: token \d+ differs from the chat template's rendering"):
        sample_responses(model, queries, SamplingParams(max_new_tokens=80), tokenizer, 8,
                         SampleKeys(0), samples_per_prompt=4,
                         episodes=plan, prompts=[EpisodePrompt(prompt, {}) for prompt in texts.prompts])


def test_environments_change_no_sampled_token_before_their_first_insertion(eos_prone):
    model, tokenizer = eos_prone
    plain = sample_fixed_episodes(model, tokenizer, budget=40, user_turns=0, check=False)  # ends at the first EOS
    inserted = sample_fixed_episodes(model, tokenizer, budget=40, user_turns=3, pause_every=4, check=False)
    for row in range(plain.size):
        first = min(4, int(plain.lengths[row]))  # the first pause comes after 4 sampled tokens
        assert torch.equal(plain.responses[row, :first], inserted.responses[row, :first])
    # every row draws at every step: the policy tokens after an insertion are those a run without it sampled
    again = sample_fixed_episodes(model, tokenizer, budget=40, user_turns=3, pause_every=4, check=False)
    assert torch.equal(inserted.responses, again.responses)
    assert torch.equal(inserted.episodes.policy_mask, again.episodes.policy_mask)


def test_bucketed_decoding_samples_the_episodes_eager_steps_sample(eos_prone):
    model, tokenizer = eos_prone
    eager = sample_fixed_episodes(model, tokenizer, budget=50, pause_every=5)
    buckets = sample_fixed_episodes(model, tokenizer, budget=50, pause_every=5, decoding="buckets")
    assert torch.equal(eager.responses, buckets.responses)
    assert torch.equal(eager.episodes.policy_mask, buckets.episodes.policy_mask)


@pytest.mark.parametrize("budget", [12, 25, 40])
def test_the_last_token_of_every_episode_is_the_policys_and_a_reply_that_does_not_fit_is_not_inserted(
    eos_prone, budget
):
    model, tokenizer = eos_prone
    batch = sample_fixed_episodes(model, tokenizer, budget=budget, user_turns=5, pause_every=3)
    last = batch.lengths - 1
    assert bool(batch.episodes.policy_mask[torch.arange(batch.size), last].all())
    assert bool((batch.lengths <= budget).all())
    # an episode ended by its environment ended at the policy's EOS; every other row is truncated
    ended = batch.has_eos
    assert bool((batch.responses[torch.arange(batch.size), last][ended] == tokenizer.eos_token_id).all())
    assert not bool(ended.all())


def test_a_reply_after_an_eos_must_end_the_episode_or_open_a_message(eos_prone):
    model, tokenizer = eos_prone

    class Silent(FixedTextEnv):
        def respond(self, turn_ids, turn_text, ended_by_eos):
            return Reply()

    driver = EpisodeDriver([Silent(EpisodeStart([], {}, 0), tokenizer)], tokenizer, EpisodeLimits(10, 4, 1.0))
    with pytest.raises(UserError, match="answered the policy's EOS with nothing"):
        driver.advance(torch.tensor([tokenizer.eos_token_id]), torch.zeros(1, len(tokenizer)))


def environment_config(**options):
    defaults = {
        "environment": FIXED,
        "environment_args": {"user_turns": 2, "pause_every": 4},
        "max_response_length": 60,
        "total_batch_size": 8,
        "samples_per_prompt": 4,
        "generation_batch_size": 8,
        "forward_batch_size": 8,
        "micro_batch_size": 8,
        "check_tokens": True,
        "kl_coef": 0.1,
        "temperature": 0.7,
        "seed": 3,
    }
    return GRPOConfig(**(defaults | options))


def test_at_step_0_the_sampled_logprobs_are_recomputed_the_ratio_is_1_and_the_kl_0(eos_prone):
    model, tokenizer = eos_prone
    cfg = environment_config(update_epochs=1, kl_placement="reward")
    models = environment_run_models(model, tokenizer, cfg)
    queries, texts = episode_setup(tokenizer)
    batch = collected(models, queries, cfg, 0, cfg.kl_coef, texts)
    policy = batch.trained_mask
    inserted = batch.mask & ~policy
    assert int(inserted.sum()) > 0 and int(policy.sum()) > 0  # multi-turn episodes
    assert torch.allclose(batch.logprobs[policy], batch.episodes.sample_logprobs[policy], atol=1e-4)
    assert float(batch.kl.abs().max()) == 0.0
    for name in ("logprobs", "ref_logprobs", "kl", "rewards", "advantages", "returns"):
        assert float(getattr(batch, name)[inserted].abs().max()) == 0.0, name
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model.train()
    metrics = run_update(models, Optimizers(optimizer, None, None, None), batch, cfg).metrics
    model.eval()
    assert metrics["val/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["val/ratio_var"] == pytest.approx(0.0, abs=1e-9)
    assert metrics["policy/clipfrac_avg"] == 0.0 and metrics["policy/approxkl_avg"] < 1e-12


def update_gradient(model, models, batch, cfg) -> dict[str, torch.Tensor]:
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    run_update(models, Optimizers(optimizer, None, None, None), batch, cfg)
    model.eval()
    change = {k: before[k] - v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        for k, v in model.named_parameters():
            v.copy_(before[k])
    return change


@pytest.mark.parametrize("kl_placement", ["loss", "reward"])
def test_numbers_at_environment_tokens_change_no_gradient(eos_prone, kl_placement):
    model, tokenizer = eos_prone
    cfg = environment_config(update_epochs=1, kl_placement=kl_placement, entropy_coef=0.01, reuse_update_forward=False)
    models = environment_run_models(model, tokenizer, cfg)
    queries, texts = episode_setup(tokenizer)
    batch = collected(models, queries, cfg, 0, cfg.kl_coef, texts)
    inserted = batch.mask & ~batch.trained_mask
    noise = torch.Generator().manual_seed(0)

    def perturbed(where: torch.Tensor):
        shift = lambda t: t + torch.randn(t.shape, generator=noise) * where  # noqa: E731
        return dataclasses.replace(batch, advantages=shift(batch.advantages), logprobs=shift(batch.logprobs),
                                   ref_logprobs=shift(batch.ref_logprobs))

    want = update_gradient(model, models, batch, cfg)
    got = update_gradient(model, models, perturbed(inserted), cfg)
    assert all(torch.equal(got[k], want[k]) for k in want)
    # teeth: the same perturbation at one policy token moves the gradient
    one = torch.zeros_like(inserted)
    one[0, int(batch.trained_mask[0].nonzero()[0])] = True
    moved = update_gradient(model, models, perturbed(one), cfg)
    assert any(not torch.equal(moved[k], want[k]) for k in want)


def masked_gae_by_hand(rewards, values, policy, gamma, lam):
    """verl's GAE with an observation mask: values and TD errors skip the environment's tokens."""
    advantages = torch.zeros_like(rewards)
    for row in range(rewards.size(0)):
        next_value, running = 0.0, 0.0
        for t in reversed(range(rewards.size(1))):
            if not policy[row, t]:
                continue
            delta = rewards[row, t] + gamma * next_value - values[row, t]
            running = delta + gamma * lam * running
            advantages[row, t] = running
            next_value = values[row, t]
    return advantages, (advantages + values) * policy


def test_gae_over_the_policys_tokens_skips_the_environments_as_verl_does():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 9, generator=g), torch.randn(3, 9, generator=g)
    policy = torch.tensor(
        [[1, 1, 0, 0, 1, 1, 1, 0, 0], [1, 0, 1, 0, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool
    )
    compacted, columns, kept = ops.compact_tokens(rewards * policy, policy)
    dense_values = ops.compact_tokens(values, policy)[0]
    advantages, returns = ops.gae(compacted, dense_values, kept, 0.9, 0.8)
    got = (ops.expand_tokens(advantages, columns, kept, 9), ops.expand_tokens(returns, columns, kept, 9))
    want = masked_gae_by_hand(rewards * policy, values * policy, policy, 0.9, 0.8)
    assert torch.allclose(got[0], want[0], atol=1e-6) and torch.allclose(got[1], want[1], atol=1e-6)
    # without holes it is the single-turn GAE
    assert torch.allclose(got[0][2], ops.gae(rewards, values, policy, 0.9, 0.8)[0][2], atol=1e-6)


def test_ppo_and_reinforce_advantages_and_returns_sit_on_the_policys_tokens_only(eos_prone):
    model, tokenizer = eos_prone
    cfg = environment_config(kl_placement="reward", whiten_rewards=True)
    queries, texts = episode_setup(tokenizer)
    batch = collected(environment_run_models(model, tokenizer, cfg), queries, cfg, 0, cfg.kl_coef, texts)
    inserted = batch.mask & ~batch.trained_mask
    values = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(1)) * batch.trained_mask
    for other in (PPOConfig(whiten_rewards=True), ReinforceConfig(advantage_estimator="reinforce-pp", gamma=0.9)):
        done = compute_advantages(dataclasses.replace(batch, values=values), other.advantage_options, cfg.kl_coef)
        assert float(done.advantages[inserted].abs().max()) == 0 and float(done.returns[inserted].abs().max()) == 0
        assert float(done.advantages[done.trained_mask].abs().max()) > 0


def test_the_calculator_pauses_on_an_opened_annotation_and_inserts_the_result(tokenizer):
    env = Gsm8kCalculator(EpisodeStart([], {}, 0), tokenizer, max_calls=2)
    assert not env.pauses_after("She sold 48/2 = ")
    assert env.pauses_after("She sold 48/2 = <<48/2=")
    assert not env.pauses_after("<<48/2=24>>24 and 3 =")  # an "=" outside an opened annotation
    reply = env.respond([], "She sold 48/2 = <<48/2=", ended_by_eos=False)
    assert reply.ids == tokenizer.encode("24>>", add_special_tokens=False) and reply.message is None
    refused = env.respond([], "<<__import__('os')=", ended_by_eos=False)
    assert refused.ids == [] and not refused.done
    env.respond([], "<<0.2*50=", ended_by_eos=False)
    past_limit = env.respond([], "<<1+1=", ended_by_eos=False)  # max_calls=2 already made
    assert past_limit.ids == []
    end = env.respond([], "The answer is 10.", ended_by_eos=True)
    assert end.done and env.components() == {"tool_calls": 2, "tool_refused": 2}


def test_the_hh_dialogue_environment_replays_the_human_turns(tokenizer):
    from rlhfkit.data.tldr import SFTRecord

    dialogue = (
        "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How are you?\n\nAssistant: Fine."
        "\n\nHuman: Bye\n\nAssistant:"
    )
    record = HHDialogue.episode_record(SFTRecord("x", {"dialogue": dialogue}, "Bye!", "here:1", "hh"))
    assert record.task == "chat" and record.columns["human_turns"] == ["Hi there", "How are you?", "Bye"]
    env = HHDialogue(EpisodeStart([], record.columns, 0), tokenizer, max_human_turns=2)
    reply = env.respond([2], "", ended_by_eos=True)
    assert reply.message == {"role": "user", "content": "How are you?"}
    assert tokenizer.decode(reply.ids) == "\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"
    assert env.respond([2], "", ended_by_eos=True).done


class NotAnEnvironment:
    pass


def test_environment_options_are_checked_before_anything_loads():
    assert check_environment("", {}) is None
    assert check_environment("gsm8k-calculator", {"max_calls": 3}) is Gsm8kCalculator
    assert check_environment(FIXED, {"user_turns": 1}) is FixedTextEnv
    with pytest.raises(ConfigError, match="environment_args is set but environment is not"):
        check_environment("", {"max_calls": 3})
    with pytest.raises(ConfigError, match=r"environment_args=\{'max_cals': 3\}: Gsm8kCalculator does not take them"):
        check_environment("gsm8k-calculator", {"max_cals": 3})
    with pytest.raises(ConfigError, match="is not a subclass of rlhfkit.environments.Environment"):
        check_environment("tests.environments.test_environments:NotAnEnvironment", {})
    with pytest.raises(ConfigError, match="environment: .*no class 'Missing'"):
        check_environment("tests.support.episodes:Missing", {})
    with pytest.raises(ConfigError, match="neither a built-in \\(gsm8k-calculator, hh-dialogue\\)"):
        check_environment("calculator", {})


def test_an_environment_only_reward_needs_neither_reward_model_nor_functions():
    from rlhfkit.onpolicy.scoring import RewardSources

    weighted = environment_config(reward_functions=["format"], reward_weights=[0.5, 2.0])
    sources = RewardSources.of(weighted.reward_options)
    assert sources.names == ["format", "environment"] and sources.weights == [0.5, 2.0]
    with pytest.raises(ConfigError, match=r"reward_weights has 1 values for 2 rewards \(format, environment\)"):
        RewardSources.of(environment_config(reward_functions=["format"], reward_weights=[1.0]).reward_options)
    assert RewardSources.of(environment_config().reward_options).names == ["environment"]
    assert issubclass(FixedTextEnv, Environment)


def test_the_calculator_in_the_decoding_loop_feeds_its_result_then_hands_the_turn_back(tokenizer):
    """Scripted samples through the driver: the policy writes `<<48/2=`, the next fed tokens are the
    calculator's `24>>` whatever was sampled meanwhile, then the policy's own tokens again."""
    env = Gsm8kCalculator(EpisodeStart([], {}, 0), tokenizer)
    driver = EpisodeDriver([env], tokenizer, EpisodeLimits(40, 8, 1.0))
    written = tokenizer.encode("So 48/2 = <<48/2=", add_special_tokens=False)
    result = tokenizer.encode("24>>", add_special_tokens=False)
    after = tokenizer.encode("24 clips.", add_special_tokens=False) + [tokenizer.eos_token_id]
    junk = tokenizer.encode(" zebra", add_special_tokens=False)[0]  # sampled while the result is fed: discarded
    logits = torch.zeros(1, len(tokenizer))
    fed = [int(driver.advance(torch.tensor([t]), logits)[0]) for t in written + [junk] * len(result) + after]
    assert fed == written + result + after
    out = driver.results(len(fed), torch.device("cpu"))
    assert out.episodes.policy_mask[0].tolist() == [True] * len(written) + [False] * len(result) + [True] * len(after)
    assert bool(out.has_eos[0]) and out.episodes.env_components[0].tolist() == [1.0, 0.0]
    assert tokenizer.decode(fed, skip_special_tokens=True) == "So 48/2 = <<48/2=24>>24 clips."


def test_eval_gsm8k_evaluates_a_model_with_and_without_the_calculator(tiny_model_dir, tmp_path, capsys):
    from rlhfkit.cli import main as cli_main

    from ..support.data import data_file

    out = tmp_path / "eval"
    args = ["eval", "gsm8k", f"models=base={tiny_model_dir},calc={tiny_model_dir}",
            f"data={data_file('gsm8k', 'test.jsonl.gz')}", "max_prompts=4", "max_response_length=6", f"out={out}"]
    assert cli_main([*args, "environments=calc=gsm8k-calculator", "pairs=calc:base"]) == 0
    written = json.loads((out / "accuracy.json").read_text())
    base, calc = written["tables"]["all"]
    assert calc["tool_use_share"] == 0.0 and "tool_use_share" not in base  # a random model calls nothing
    assert calc["greedy_minus_first"] == 0.0 and base["annotation_share"] == calc["annotation_share"] == 0.0
    (pair,) = written["pairs"]["all"]
    assert pair["pair"] == "calc vs base" and pair["greedy_minus"] == 0.0 and pair["problems"] == 4
    assert "calc: minus base (paired; right only with calc on 0 problems" in (out / "report.html").read_text()
    assert cli_main([*args, "environments=other=gsm8k-calculator", "overwrite=true"]) != 0
    assert "environments= names other, which models= does not" in capsys.readouterr().err


def test_the_report_flags_a_logprob_gap_and_refused_tool_calls():
    from rlhfkit.onpolicy.evaluation import episode_caveat

    quiet = [{"episode/logprob_gap_max": 2e-5, "env/tool_calls": 2.0, "env/tool_refused": 0.5}]
    assert episode_caveat(quiet, "no") == ""
    loud = [{"episode/logprob_gap_max": 0.2, "env/tool_calls": 1.0, "env/tool_refused": 3.0}]
    caveat = episode_caveat(loud, "no")
    assert "moved by up to 0.2" in caveat and "refused 3 tool calls for each one it answered" in caveat
    assert "moved" not in episode_caveat(loud, "bf16")
