"""The shipped presets: one YAML file each, whose `stage:` names the command that takes it and whose
header comment gives the sources. ABOUT holds one line per preset for `rlhfkit <command> --help`,
so that presets can be found from the command line; a preset without one is listed by name only."""

from __future__ import annotations

ABOUT: dict[str, str] = {
    "quickstart": "SFT -> RM -> PPO -> eval of SmolLM2-135M on ../shared/data, a few steps per stage: "
    "fits a 2-core CPU",
    "paper-pythia-1b": "the paper's SFT -> RM -> DPO, PPO -> eval on Pythia-1B-deduped, TL;DR (Tables 3-7); "
    "needs the hub and OPENAI_API_KEY",
    "paper-pythia-2.8b": "paper-pythia-1b on Pythia-2.8B-deduped",
    "paper-pythia-6.9b": "paper-pythia-1b on Pythia-6.9B-deduped",
    "seed002-gpt2-hh": "seed 002: RM, DPO, PPO, GRPO from GPT-2 on HH-RLHF, no SFT stage; needs the hub and "
                       "OPENAI_API_KEY",
    "tldr-sft": "Table 3's SFT hyperparameters on TL;DR (Details 2-5, 9)",
    "tldr-rm": "Table 4's reward-model hyperparameters on TL;DR comparisons (Details 10-15)",
    "tldr-dpo": "Table 6's DPO hyperparameters on TL;DR comparisons (beta 0.05)",
    "tldr-ppo": "Table 7's PPO hyperparameters on TL;DR (Details 20-25)",
    "tldr-grpo": "GRPO at Table 7's TL;DR budget and sampling: G = 4, no value model, KL as a loss term",
    "tldr-rloo": "RLOO at Table 7's TL;DR budget and sampling: k = 4 leave-one-out baseline, KL in the reward",
    "hh-rm": "seed 002's reward model: GPT-2 on HH-RLHF (lr 2e-5, 3 epochs, 512 tokens); needs the hub",
    "hh-dpo": "seed 002's DPO: GPT-2 on HH-RLHF (beta 0.1, lr 5e-7, 1 epoch); needs the hub",
    "hh-ppo": "seed 002's PPO: GPT-2 on HH-RLHF (clip 0.2, beta 0.1, 4 PPO epochs); needs the hub and reward_model=",
    "gsm8k-grpo": "GRPO on GSM8K with the exact-match and format rewards, no reward model: SmolLM2-135M-Instruct on a "
                  "CPU "
    "(docs/reproduction.md)",
    "hh-grpo": "seed 002's GRPO: GPT-2 on HH-RLHF (G = 4, beta 0.1, KL in the loss); needs the hub and reward_model=",
    "tldr-dr-grpo": "Dr. GRPO on tldr-grpo: advantages not divided by the group's std, token sums over a constant",
    "gsm8k-dr-grpo": "Dr. GRPO on gsm8k-grpo: no std scaling, token sums over a constant, no KL term",
    "tldr-dapo": "DAPO on tldr-grpo: clip-higher, token mean, dynamic sampling, overlong shaping and filtering, no KL",
    "gsm8k-dapo": "DAPO on gsm8k-grpo: clip-higher, token mean, dynamic sampling, overlong shaping and filtering, "
    "no KL",
    "tldr-gspo": "GSPO on tldr-grpo: one length-normalised ratio per response, clipped to [1 - 3e-4, 1 + 4e-4]",
    "gsm8k-gspo": "GSPO on gsm8k-grpo: one length-normalised ratio per answer, clipped to [1 - 3e-4, 1 + 4e-4]",
    "tldr-reinforce-pp": "REINFORCE++ at Table 7's TL;DR budget: one response per prompt, returns normalised over the "
                         "batch",
    "gsm8k-reinforce-pp": "REINFORCE++-baseline on GSM8K: 8 answers per problem minus their mean, then the batch's "
                          "normalisation",
}
