# %% [markdown]
# # rlhfkit from Python: SFT -> reward model -> PPO, then GRPO with a reward function of your own
#
# Every stage is one call that takes the options of `rlhfkit <stage> --help` as keyword arguments and returns a
# `Result`: its run folder, `metrics` (a pandas DataFrame), `headline` (the report's numbers with their
# baselines), `evaluation`, and the trained `model` as a path and as an object. Data can be files or in memory;
# models can be folders, names or loaded objects; reward functions can be Python functions.
#
# `python_api.ipynb` is this file as a notebook (`tests/test_examples.py` keeps the two identical and runs both).
# `EXAMPLE_SIZE=tiny` (the default) trains a 2-layer random model for a few steps, so the whole notebook runs
# in about a minute on a laptop CPU and shows the mechanics, not learning; `EXAMPLE_SIZE=smollm2` starts from
# the embedded SmolLM2-135M at the quick start's settings (about 10 minutes on a 2-core CPU).

# %%
import gzip
import itertools
import json
import os
from pathlib import Path

import datasets
import matplotlib.pyplot as plt

import rlhfkit

SHARED = Path(os.environ.get("RLHFKIT_SHARED_DATA", "../../shared/data"))  # the repository's sample data
OUT = Path(os.environ.get("EXAMPLE_OUT", "runs/python-api"))
TINY = os.environ.get("EXAMPLE_SIZE", "tiny") == "tiny"

if TINY:
    from rlhfkit.tiny_models import save_tiny_policy

    BASE = str(save_tiny_policy(OUT / "tiny-policy"))
    SMALL = {"max_query_length": 128, "learning_rate": 1e-3, "report_to": ""}
    STEPS = 2
else:
    BASE, SMALL, STEPS = "smollm2-135m", {"max_query_length": 256}, 4
# run again, a cell starts its run afresh: the earlier run in its output_dir is moved aside to <output_dir>.old-<time>
AGAIN = {"overwrite": True}
# each on-policy update: 8 rows sampled together, scored and trained on 4 at a time, 16 response tokens at most
ROLLOUTS = {
    "max_steps": STEPS,
    "total_batch_size": 8,
    "micro_batch_size": 4,
    "generation_batch_size": 8,
    "forward_batch_size": 4,
    "max_response_length": 16,
}

# %% [markdown]
# ## SFT on TL;DR posts (a file, read in its upstream format)

# %%
sft = rlhfkit.sft(
    preset="tldr-sft",
    model=BASE,
    data=[SHARED / "tldr-sft-sample/tldr_sft_sample.jsonl.gz"],
    output_dir=OUT / "sft",
    max_steps=STEPS * 3,
    total_batch_size=8,
    micro_batch_size=4,
    validation_posts=16,
    eval_samples=4,
    **SMALL,
    **AGAIN,
)
sft.metrics.dropna(subset=["train/loss"])[["step", "train/loss", "train/lr"]]

# %% [markdown]
# ## A reward model on human comparisons, and its headline numbers beside the "prefer the longer summary" rule

# %%
rm = rlhfkit.rm(
    preset="tldr-rm",
    model=sft.model_path,
    data=[SHARED / "summarize-from-feedback-comparisons/batch13.jsonl.gz"],
    sft_data=[SHARED / "tldr-sft-sample/tldr_sft_sample.jsonl.gz"],  # the references its scores are centred on
    output_dir=OUT / "rm",
    max_steps=STEPS,
    max_pairs=64,
    total_batch_size=8,
    micro_batch_size=4,
    eval_pairs=16,
    normalization_samples=16,
    **SMALL,
    **AGAIN,
)
{metric: (number["value"], number["baseline_name"], number["baseline"]) for metric, number in rm.headline.items()}

# %% [markdown]
# ## PPO from the SFT model against the reward model

# %%
ppo = rlhfkit.ppo(
    preset="tldr-ppo",
    model=sft.model_path,
    reward_model=rm.model_path,
    data=[SHARED / "tldr-sft-sample/tldr_sft_sample.jsonl.gz"],
    output_dir=OUT / "ppo",
    validation_posts=16,
    eval_samples=4,
    **ROLLOUTS,
    **SMALL,
    **AGAIN,
)
ppo.metrics[["step", "objective/scores", "objective/kl", "response/length_mean"]]

# %%
ppo.metrics.plot(x="step", y=["objective/scores", "objective/kl"], marker="o", subplots=True, figsize=(6, 4))
plt.show()

# %% [markdown]
# ## GRPO on GSM8K-style problems held in memory, with a reward function written here
#
# The data is a `datasets.Dataset` built in this cell; the policy is the SFT model as a loaded object; the reward
# is the function below beside the built-in `format` reward. Its arguments follow TRL's convention: the prompts,
# the completions, and every other column of the dataset (here `answer`) by name.

# %%
with gzip.open(SHARED / "gsm8k/train.jsonl.gz", "rt") as f:
    problems = [json.loads(line) for line in itertools.islice(f, 64)]
gsm8k = datasets.Dataset.from_list(
    [{"prompt": p["question"] + "\nAnswer:", "answer": p["answer"].split("####")[-1].strip()} for p in problems]
)


def final_number_is_right(prompts, completions, answer, **columns):
    """1 when the last number in the completion is the reference answer, else 0."""
    rewards = []
    for completion, reference in zip(completions, answer, strict=True):
        numbers = [word.strip(".,$") for word in completion.split() if word.strip(".,$").replace(".", "").isdigit()]
        rewards.append(float(bool(numbers) and numbers[-1] == reference))
    return rewards


grpo = rlhfkit.grpo(
    preset="gsm8k-grpo",
    model=sft.model,
    tokenizer=sft.tokenizer,
    data=gsm8k,
    prompt_format="auto",  # the preset reads GSM8K's own columns; these rows are prompt-only data
    reward_functions=[final_number_is_right, "format"],
    output_dir=OUT / "grpo",
    samples_per_prompt=4,
    validation_posts=8,
    eval_samples=0,
    eos_trick=False,
    **ROLLOUTS,
    **SMALL,
    **AGAIN,
)
grpo.metrics[["step", "rewards/final_number_is_right", "rewards/format", "objective/kl"]]

# %%
grpo.metrics.plot(x="step", y=["rewards/final_number_is_right", "rewards/format"], marker="o", figsize=(6, 3))
plt.show()
print(grpo)
