"""Multi-turn episodes: a fixed-text environment, an EOS-prone policy, sampled episodes, a tiny run's options."""

from __future__ import annotations

import torch

from rlhfkit.environments import Environment, Reply

from .tiny import stage_args


class FixedTextEnv(Environment):
    """A test environment: every `pause_every` sampled tokens (0: never) it inserts `tool_text` inside the
    policy's turn; each turn the policy ends with EOS it answers with the user message `text`, `user_turns`
    times, then ends the episode, rewarding it (policy tokens of its last turn) mod 3."""

    component_names = ("insertions",)
    has_reward = True

    def __init__(self, start, tokenizer, user_turns: int = 2, pause_every: int = 0, text: str = "Fixed reply.",
                 tool_text: str = " [ok]"):
        super().__init__(start, tokenizer)
        self.user_turns, self.pause_every, self.text, self.tool_text = user_turns, pause_every, text, tool_text
        self.seen = self.insertions = 0

    def components(self):
        return {"insertions": self.insertions}

    def pauses_after(self, turn_text: str) -> bool:
        self.seen += 1
        return bool(self.pause_every) and self.seen % self.pause_every == 0

    def respond(self, turn_ids, turn_text, ended_by_eos):
        self.insertions += 1
        if not ended_by_eos:
            return self.inline(self.tool_text)
        if not self.user_turns:
            return Reply.end(reward=float(len(turn_ids) % 3))
        self.user_turns -= 1
        return self.message("user", self.text)


def eos_prone_policy(seed: int = 0, eos_logit: float = 6.0):
    """(model, tokenizer): a tiny random Llama (untied head) that ends a turn with EOS about one step in
    ten: every token's embedding carries a large constant in dimension 0, so the final hidden state does
    too, and only EOS's head row reads that dimension, so EOS's logit is about `eos_logit` everywhere."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.models import disable_dropout, load_tokenizer
    from rlhfkit.tiny_models import tiny_config
    from rlhfkit.vocab import match_vocab

    tokenizer = load_tokenizer("smollm2-135m")
    config = tiny_config(tokenizer)
    config.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    match_vocab(model, tokenizer)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 1.0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        head[tokenizer.eos_token_id, 0] = eos_logit / config.hidden_size**0.5
    return disable_dropout(model), tokenizer


CHAT_PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Tell me a joke about cats, please."}],
]


def episode_setup(tokenizer, prompts=CHAT_PROMPTS):
    """(query ids, PromptTexts) of chat `prompts`, as an on-policy run reads them."""
    from rlhfkit.data.formats import encode_rendered, render_chat
    from rlhfkit.onpolicy.scoring import PromptTexts

    queries = [encode_rendered(tokenizer, render_chat(tokenizer, p)) for p in prompts]
    return queries, PromptTexts(list(prompts), [{} for _ in prompts], [f"prompt {i}" for i in range(len(prompts))])


def sample_fixed_episodes(model, tokenizer, budget: int = 60, group: int = 4, seed: int = 0, check: bool = True,
                          decoding: str = "eager", temperature: float = 0.7, **env_args):
    """`group` FixedTextEnv episodes of each of `CHAT_PROMPTS`, sampled as an on-policy run samples them."""
    from rlhfkit.environments import EpisodePlan, EpisodePrompt
    from rlhfkit.generation import SampleKeys, SamplingParams, sample_responses

    queries, texts = episode_setup(tokenizer)
    plan = EpisodePlan(FixedTextEnv, env_args, max_turns=8, timeout=0.0, check_tokens=check, run_seed=seed)
    params = SamplingParams(max_new_tokens=budget, temperature=temperature, decoding=decoding)
    with torch.no_grad():
        return sample_responses(model, queries, params, tokenizer, 2 * group,
                                SampleKeys(seed), samples_per_prompt=group,
                                episodes=plan, prompts=[EpisodePrompt(prompt, {}) for prompt in texts.prompts])


def environment_run_models(model, tokenizer, cfg):
    """OnPolicyModels of an environment-rewarded run: `model` trained, an identical frozen reference."""
    import copy

    from rlhfkit.environments import episode_plan
    from rlhfkit.onpolicy.scoring import OnPolicyModels, RewardSources

    reference = copy.deepcopy(model).eval().requires_grad_(False)
    return OnPolicyModels(
        model, reference, None, None, tokenizer, RewardSources.of(cfg.reward_options), episode_plan(cfg.episode_options)
    )


FIXED = "tests.support.episodes:FixedTextEnv"


def episode_args(stage, dirs, out, **extra):
    """A tiny `stage` run on GSM8K's chat prompts with the fixed-text environment (a user turn, an inline
    insertion every 6 sampled tokens), its token check on, every update's samples logged."""
    inputs = {"policy": dirs["policy"], "rm": dirs["rm"], "posts": dirs["gsm8k"]}
    options = {
        "prompt_format": "gsm8k",
        "environment": FIXED,
        "environment_args": {"user_turns": 1, "pause_every": 6},
        "check_tokens": "true",
        "max_response_length": 64,
        "max_query_length": 256,
        "sample_every": 1,
        "mixed_precision": "no",
    }
    return stage_args(stage, inputs, out, **(options | extra))
