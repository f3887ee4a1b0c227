"""One dataclass per stage (the registry in stages.py names each stage's), YAML presets, and
`key=value` overrides.

Resolution order: dataclass defaults < preset or `--config FILE` < command-line `key=value`.
Every field carries its help text and, where the value comes from the paper, its source
(table or detail number), so `rlhfkit <stage> --help` can show where each default comes from.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from .config_values import apply, describe_type, read_yaml_text
from .errors import ConfigError


def opt(default: Any, help: str, source: str | None = None, minimum: float = 0, below: float | None = None) -> Any:
    """A config field with help text, the paper source of its default, and (numbers) its lower bound and
    the bound it must stay below (a fraction of the data: below 1)."""
    meta = {"help": help, "source": source, "minimum": minimum, "below": below}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def query_length_opt() -> Any:
    return opt(512, "query tokens; a longer post loses paragraphs from its end (a dialogue or prompt text: from its start), and a "
                    "record of which no text fits is skipped and counted", "Detail 2", minimum=1)


# the formats one option away, as the help of `data_format` / `prompt_format` lists them (docs/data-formats.md)
PAIR_FORMATS_HELP = ("format of `data`; the default reads OpenAI's TL;DR comparisons. Other data is one option away: hh (HH-RLHF "
                     "chosen/rejected dialogues), preference (TRL's chosen, rejected and optional prompt columns, strings or chat "
                     "messages), or auto (detected from the first record's columns and printed); docs/data-formats.md")
PROMPT_FORMATS_HELP = ("format of `data`; the default reads TL;DR posts. Other data is one option away: prompt-only (TRL's prompt "
                       "column, a string or chat messages; a completion column is the reference), hh (HH-RLHF dialogues; the chosen "
                       "response is the reference), gsm8k (question, answer: the reference solution, its final number the `answer` "
                       "column the gsm8k reward reads), or auto (detected from the first record's columns and printed); "
                       "docs/data-formats.md")


def article_length_opt() -> Any:
    return opt(2047, "query token budget for CNN/DM articles", "Detail 5", minimum=1)


def remote_code_opt() -> Any:
    return opt(False, "allow model code from the hub (off: safer)")


def output_overwrite_opt() -> Any:
    return opt(False, "write over what `out` already holds (off: an existing output is refused, never overwritten silently)")


def pickle_opt() -> Any:
    return opt(False, "load pickle weights (pytorch_model.bin, *.pt) from a folder without safetensors (off: unpickling can run code)")


@dataclass
class AnalyzeConfig:
    dataset: Literal["auto", "tldr-sft", "tldr-comparisons", "hh", "gsm8k", "prompt-completion", "language-modeling", "preference",
                     "prompt-only"] = opt("auto", "format of `path` (auto: detected from the first record's columns and printed; "
                                          "docs/data-formats.md)")
    path: list[str] = opt([], "files, folders or a Hugging Face dataset id (comma separated)")
    model: str = opt("smollm2-135m", "tokenizer used for token lengths (any HF model dir or hub id)")
    out: str = opt("runs/analysis", "folder for analysis.json and the PNG plots")
    overwrite: bool = output_overwrite_opt()
    max_query_length: int = query_length_opt()
    max_article_query_length: int = article_length_opt()
    hf_split: str = opt("", "split to read when `path` is a hub id (empty: all splits)")


@dataclass
class DataFieldsConfig:
    """Column names of data in the ecosystem's generic formats (docs/data-formats.md), for every stage that reads data."""

    prompt_field: str = opt("", "generic formats: column of the prompt (empty: prompt)")
    completion_field: str = opt("", "generic formats: column of the completion (empty: completion)")
    chosen_field: str = opt("", "generic formats: column of the preferred response (empty: chosen)")
    rejected_field: str = opt("", "generic formats: column of the rejected response (empty: rejected)")
    text_field: str = opt("", "generic formats: column of language-modelling text or conversations (empty: text, or messages)")


@dataclass
class RunConfig(DataFieldsConfig):
    """Fields shared by every training stage."""

    model: str = opt("smollm2-135m", "starting model: embedded name, HF directory or hub id")
    output_dir: str = opt("", "run directory (empty: runs/<stage>-<timestamp>)")
    seed: int = opt(1, "seed for torch, numpy, python and the data order")
    learning_rate: float = opt(3e-6, "AdamW learning rate", "Tables 3, 4, 7")
    adam_eps: float = opt(1e-5, "AdamW epsilon", "Tables 3, 4, 7")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    lr_scheduler: Literal["cosine", "linear", "constant"] = opt("cosine", "learning-rate schedule", "Tables 3, 4")
    warmup_steps: int = opt(0, "linear warm-up steps before the schedule")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: use num_epochs)")
    total_batch_size: int = opt(128, "episodes per optimizer step = micro batch x accumulation x processes", "Table 3", minimum=1)
    micro_batch_size: int = opt(8, "rows per forward pass on one process", minimum=1)
    max_query_length: int = query_length_opt()
    max_response_length: int = opt(53, "response tokens including EOS; longer ones are skipped and counted", "Detail 4", minimum=1)
    trust_remote_code: bool = remote_code_opt()
    allow_pickle: bool = pickle_opt()
    mixed_precision: Literal["auto", "no", "bf16"] = opt("auto", "bf16 autocast where supported, else fp32", "Detail 8")
    gradient_checkpointing: bool = opt(False, "recompute activations to save memory")
    lora_rank: int = opt(0, "LoRA rank of the trained models (0: off, full fine-tuning); the scalar heads stay fully trainable")
    lora_alpha: float = opt(16.0, "LoRA scale numerator: the adapter's update is scaled by lora_alpha / lora_rank", minimum=1e-9)
    lora_dropout: float = opt(0.0, "dropout on the adapter input (0: off, as everywhere else: Detail 7)")
    lora_target_modules: list[str] = opt([], "module names the adapters wrap (empty: every linear layer of the decoder blocks)")
    sharding: Literal["none", "fsdp2", "zero2", "zero3"] = opt(
        "none", "shard across processes: fsdp2 (parameters, gradients, optimizer state), zero2/zero3 (DeepSpeed; the deepspeed extra)")
    max_grad_norm: float = opt(0.0, "clip the gradient norm to this (0: no clipping; the norm is still logged)")
    keep_checkpoints: int = opt(2, "newest checkpoints kept in checkpoints/ (0: all)")
    save_every: int = opt(0, "save a checkpoint every N optimizer steps (0: only at the end)")
    eval_every: int = opt(0, "evaluate every N optimizer steps (0: only at the end)")
    log_every: int = opt(1, "log metrics every N optimizer steps", minimum=1)
    report_to: list[Literal["tensorboard", "wandb"]] = opt(["tensorboard"], "trackers besides metrics.jsonl (wandb needs the wandb extra)")
    resume: str = opt("", "run directory or checkpoint folder to resume from")
    overwrite: bool = opt(False, "start afresh in an output_dir that holds another run: move that run aside to <output_dir>.old-<time>")


@dataclass
class TrainConfig(RunConfig):
    """Fields of the supervised stages (SFT, reward model): one pass = one epoch over the data."""

    num_epochs: float = opt(1.0, "passes over the training set", "Tables 3, 4")


@dataclass
class SFTConfig(TrainConfig):
    data: list[str] = opt(
        ["vwxyzjn/summarize_from_feedback_tldr_3_filtered"],
        "SFT data in data_format: hub id, files (jsonl, json, csv, parquet; gz too) or folders",
        "Detail 1",
    )
    data_format: Literal["tldr-sft", "auto", "prompt-completion", "language-modeling"] = opt(
        "tldr-sft", "format of `data`; the default reads TL;DR posts and summaries. Other data is one option away: prompt-completion "
        "(TRL's prompt and completion columns, strings or chat messages), language-modeling (a text or messages column), or auto "
        "(detected from the first record's columns and printed); docs/data-formats.md")
    hf_split: str = opt("train", "split to read when `data` is a hub id")
    validation_posts: int = opt(300, "posts held out by post identity for validation (0: none)")
    loss_on_query: bool = opt(False, "also train on query tokens (default: response tokens only)")
    eval_samples: int = opt(64, "held-out posts generated and scored with ROUGE-L at the end (0: none)")
    eval_temperature: float = opt(0.0, "temperature for the evaluation generations (0: greedy)")


@dataclass
class PairConfig(TrainConfig):
    """Fields of the stages that train on human comparisons (reward model, DPO)."""

    data: list[str] = opt(
        ["openai/summarize_from_feedback"],
        "comparisons in data_format: hub id, files (OpenAI JSON lines, HH-RLHF jsonl.gz, any jsonl, json, csv, parquet) or folders",
        "Detail 1",
    )
    data_format: Literal["tldr-comparisons", "hh", "auto", "preference"] = opt("tldr-comparisons", PAIR_FORMATS_HELP)
    hf_split: str = opt("train", "split to read when `data` is a hub id")
    total_batch_size: int = opt(64, "pairs per optimizer step", minimum=1)
    micro_batch_size: int = opt(4, "pairs per forward pass on one process", minimum=1)
    max_response_length: int = opt(169, "response tokens including EOS; longer pairs are skipped", "Detail 4", minimum=1)
    max_article_query_length: int = article_length_opt()
    validation_fraction: float = opt(0.1, "fraction of prompts (posts, dialogues) held out by prompt identity for validation", below=1)
    splits: list[str] = opt([], "keep only comparisons from these splits (e.g. train, valid1; empty: all)", "Detail 16")
    validation_splits: list[str] = opt([], "split-disjoint protocol: validate on these upstream splits (TL;DR valid1), train on `splits` "
                                       "(empty: the others); replaces validation_fraction; prompts also trained on are dropped", "Detail 6")
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    max_pairs: int = opt(0, "train on at most this many training pairs, in data order (0: all)")
    eval_pairs: int = opt(256, "validation pairs scored at each evaluation (0: all)")


@dataclass
class RMConfig(PairConfig):
    total_batch_size: int = opt(64, "pairs per optimizer step", "Table 4", minimum=1)
    head: Literal["eos-linear", "mean-mlp"] = opt("eos-linear", "reward head: EOS-token linear or mean-pooled MLP", "Details 11-12")
    sft_data: list[str] = opt([], "SFT data whose reference summaries set the reward bias (empty: skip)", "Detail 15")
    normalization_samples: int = opt(1024, "reference summaries used for the bias", "Detail 15")
    length_head: bool = opt(False, "ODIN (Chen et al. 2024): a second linear head trained to carry response length, decorrelated "
                            "from the reward head, which alone is saved as the reward")
    length_head_weight: float = opt(1.0, "ODIN: weight of |corr(reward, length)| - corr(length head, length)", minimum=0.0)
    orthogonality_weight: float = opt(1.0, "ODIN: weight of |W_reward . W_length|", minimum=0.0)
    length_balance: bool = opt(False, "train on equal numbers of pairs whose chosen response is longer and shorter (majority subsampled)")
    trainable_layers: int = opt(-1, "train only the top N transformer blocks and the heads (-1: everything; 0: heads only, on backbone "
                                "features computed once and cached)", minimum=-1)
    feature_cache: str = opt("", "trainable_layers=0: file of cached backbone features, shared between runs (empty: <run>/features.pt)")
    cross_validation_folds: int = opt(0, "post-disjoint K-fold cross-validation before the final model: K models, each trained like it "
                                      "on the training pairs of K-1 folds of prompts, score the fold they never saw, so every "
                                      "training pair is validated once (0: off; cheap with trainable_layers=0)", minimum=0)


@dataclass
class DPOConfig(PairConfig):
    """DPO from the SFT policy (Appendix A equations 4-5, Table 6)."""

    model: str = opt("smollm2-135m", "SFT policy: starts the trained policy and, unless reference_model is set, is the frozen reference")
    reference_model: str = opt("", "frozen reference policy (empty: the starting model)", "Appendix A")
    loss_type: Literal["dpo", "ipo", "cdpo", "simpo"] = opt(
        "dpo", "preference loss: dpo (Rafailov et al. 2023), ipo (Azar et al. 2023), cdpo (dpo with label_smoothing, Mitchell 2023), "
        "simpo (no reference, length-normalised, Meng et al. 2024); see docs/algorithms.md", "Appendix A")
    beta: float = opt(0.05, "dpo, ipo, cdpo: weight of the log-ratio to the reference (ipo's target margin is 1/(2 beta))", "Table 6",
                      minimum=1e-9)
    label_smoothing: float = opt(0.0, "cdpo only: eps, the assumed probability that a human label is flipped, in (0, 0.5)",
                                 "Mitchell 2023")
    simpo_beta: float = opt(2.0, "simpo only (in place of beta): weight of the mean token log-probability",
                            "SimPO, Llama-3-Base setup", minimum=1e-9)
    simpo_gamma: float = opt(1.0, "simpo only: target margin between the chosen and rejected rewards", "SimPO, Llama-3-Base setup")
    total_batch_size: int = opt(64, "pairs per optimizer step", "Table 6", minimum=1)
    learning_rate: float = opt(3e-6, "AdamW learning rate", "Table 6")
    lr_scheduler: Literal["cosine", "linear", "constant"] = opt("cosine", "learning-rate schedule", "Table 6")
    forward_batch_size: int = opt(8, "pairs per no-grad forward pass (reference log-probabilities, validation)", minimum=1)
    eval_samples: int = opt(16, "validation prompts answered greedily by the reference and the DPO policy at the end (0: none)")


@dataclass
class GenerateConfig(DataFieldsConfig):
    model: str = opt("smollm2-135m", "policy to sample from: embedded name, HF directory or hub id")
    data: list[str] = opt([], "prompts in prompt_format (hub id, files or folders): TL;DR SFT posts, HH-RLHF comparisons, prompt-only data")
    prompt_format: Literal["tldr-sft", "hh", "gsm8k", "auto", "prompt-only"] = opt("tldr-sft", PROMPT_FORMATS_HELP)
    prompt_suite: str = opt("", "answer a prompt suite instead of summarising posts: builtin-hh or a YAML file (see rlhfkit/prompts)", "seed 002")
    hf_split: str = opt("train", "split to read when `data` is a hub id (train: the one `rlhfkit sft` splits)")
    split: Literal["all", "train", "validation"] = opt("validation", "which side of the post split to use")
    validation_posts: int = opt(300, "posts held out by post identity (same split as `rlhfkit sft` with the same seed)")
    seed: int = opt(1, "seed for the split and for sampling")
    num_samples: int = opt(0, "posts to summarise (0: all of the chosen side)")
    batch_size: int = opt(8, "queries per generation batch", minimum=1)
    max_query_length: int = query_length_opt()
    max_new_tokens: int = opt(53, "response tokens sampled at most", "Detail 4", minimum=1)
    temperature: float = opt(0.7, "sampling temperature (0: greedy)", "Table 7")
    top_k: int = opt(0, "keep only the k most likely tokens (0: off)")
    top_p: float = opt(1.0, "nucleus sampling mass (1: off)")
    trust_remote_code: bool = remote_code_opt()
    out: str = opt("samples.jsonl", "output JSON-lines file")
    overwrite: bool = output_overwrite_opt()


@dataclass
class RMEvalConfig(DataFieldsConfig):
    model: str = opt("", "reward model folder written by `rlhfkit rm`, or a DPO policy (its implicit reward, equation 5)", "Detail 19")
    reference_model: str = opt("", "DPO only: the reference policy (empty: the one `rlhfkit dpo` recorded in the model folder)", "Appendix A")
    beta: float = opt(0.0, "DPO only: beta of the implicit reward (0: the one `rlhfkit dpo` recorded)", "Appendix A")
    data: list[str] = opt([], "comparisons: hub id or OpenAI JSON-lines / HH-RLHF jsonl.gz files, or preference data (docs/data-formats.md)")
    data_format: Literal["tldr-comparisons", "hh", "auto", "preference"] = opt("tldr-comparisons", PAIR_FORMATS_HELP)
    hf_split: str = opt("validation", "split to read when `data` is a hub id")
    splits: list[str] = opt([], "keep only comparisons from these splits (empty: all)", "Detail 16")
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    side: Literal["all", "validation", "train"] = opt("all", "which side of the prompt split to score (as `rlhfkit rm` split it)")
    validation_fraction: float = opt(0.1, "the prompt split's validation fraction (same as the training run)", below=1)
    seed: int = opt(1, "the prompt split's seed (same as the training run)")
    max_pairs: int = opt(0, "score at most this many pairs (0: all)")
    batch_size: int = opt(8, "pairs per forward pass", minimum=1)
    max_query_length: int = query_length_opt()
    max_article_query_length: int = article_length_opt()
    max_response_length: int = opt(169, "response tokens including EOS; longer pairs are skipped and counted", "Detail 4", minimum=1)
    probes: str = opt("builtin", "YAML of graded probe responses ('builtin': the TL;DR probes, for TL;DR data only; '': none)")
    errors: int = opt(20, "most confidently wrong pairs written to confident_errors.jsonl")
    calibration_bins: int = opt(10, "reward-margin bins of the calibration plot", "Detail 18", minimum=1)
    dump_logits: int = opt(1, "pairs whose per-token reward logits are dumped", "Detail 13")
    length_penalty: float = opt(0.0, "score each response as reward - length_penalty x response tokens (what PPO sees with "
                                "reward_length_penalty)", minimum=0.0)
    trust_remote_code: bool = remote_code_opt()
    out: str = opt("", "output folder (empty: runs/rm-eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()


def stage_opt(preset: str, what: str) -> Any:
    return opt({"preset": preset}, f"options of the {what} stage, on top of its preset (the `preset` key) and the pipeline's wiring, "
               f"e.g. '{{max_steps: 4, preset: {preset}}}'")


@dataclass
class PipelineConfig:
    """`rlhfkit pipeline`: the stages in order, each in its own sub-directory of output_dir."""

    output_dir: str = opt("runs/pipeline", "run directory; each stage writes <output_dir>/<stage>/")
    stages: list[Literal["sft", "rm", "dpo", "ppo", "grpo", "rloo", "eval"]] = opt(["sft", "rm", "ppo", "eval"], "stages to run, in this order")
    task: Literal["tldr", "hh"] = opt("tldr", "tldr: SFT data (posts, reference summaries) and TL;DR comparisons; hh: HH-RLHF comparisons only, whose dialogues are also the prompts (no SFT stage, seed 002)")
    model: str = opt("smollm2-135m", "base model the SFT stage starts from")
    sft_data: list[str] = opt(["vwxyzjn/summarize_from_feedback_tldr_3_filtered"], "TL;DR SFT data: SFT, the RM's Detail 15 bias, on-policy prompts", "Detail 1")
    comparisons: list[str] = opt(["openai/summarize_from_feedback"], "human comparisons for the reward model and DPO (task=hh: also the prompts)", "Detail 1")
    judge: str = opt("hf:smollm2-135m", "judge of the eval stage (see `rlhfkit eval --help`); empty: no win rates")
    eval_posts: int = opt(16, "held-out posts summarised by every policy in the eval stage", minimum=1)
    eval_hf_split: str = opt("", "hub split whose posts the eval stage summarises (e.g. validation, as Figure 1; empty: the posts the SFT split held out)")
    sft: dict[str, Any] = stage_opt("tldr-sft", "SFT")
    rm: dict[str, Any] = stage_opt("tldr-rm", "reward-model")
    dpo: dict[str, Any] = stage_opt("tldr-dpo", "DPO")
    ppo: dict[str, Any] = stage_opt("tldr-ppo", "PPO")
    grpo: dict[str, Any] = stage_opt("tldr-grpo", "GRPO")
    rloo: dict[str, Any] = stage_opt("tldr-rloo", "RLOO")
    eval: dict[str, Any] = opt({}, "options of the eval stage: `rlhfkit eval` keys, e.g. '{max_prompts: 8}' (no preset; eval_posts sets "
                               "how many posts each policy answers)")


@dataclass
class JudgeConfig:
    """Fields of the commands that ask a judge."""

    judge: str = opt("", "judge spec: openai:<model>[@<base url>], anthropic:<model>, hf:<model or folder>, hf-logprob:<model or folder>, rm:<reward model folder>")
    seed: int = opt(1, "seed of the sample and of the A/B order of each pair")
    template: str = opt("", "judge prompt template file, or builtin:hh-helpfulness for HH-RLHF dialogues (empty: the paper's Appendix I prompt)", "Appendix I")
    cache_dir: str = opt("runs/judge-cache", "verdict cache folder shared by evaluations (a repeated pair is never paid twice)")
    concurrency: int = opt(4, "API judges: requests in flight at once", minimum=1)
    timeout: float = opt(60.0, "API judges: seconds per request before it is retried", minimum=0.001)
    input_price: float = opt(0.0, "API judges: price per million input tokens, for the cost line")
    output_price: float = opt(0.0, "API judges: price per million output tokens, for the cost line")
    max_new_tokens: int = opt(64, "hf judges: reply tokens generated", minimum=1)
    batch_size: int = opt(8, "hf and rm judges: pairs per forward batch", minimum=1)


@dataclass
class JudgeEvalConfig(JudgeConfig):
    data: list[str] = opt([], "labelled comparisons: hub id or OpenAI JSON-lines / HH-RLHF jsonl.gz files")
    data_format: Literal["tldr-comparisons", "hh"] = opt("tldr-comparisons", "format of `data`")
    hf_split: str = opt("validation", "split to read when `data` is a hub id")
    splits: list[str] = opt([], "keep only comparisons from these splits (empty: all)", "Detail 16")
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    max_pairs: int = opt(64, "judge a seeded sample of this many pairs, each in both orders (0: all)")
    out: str = opt("", "output folder (empty: runs/judge-eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()


@dataclass
class EvalConfig(JudgeConfig):
    task: Literal["samples", "gsm8k"] = opt("samples", "samples: compare policies' samples (judges, RM scores, KL); gsm8k: accuracy of "
                                            "`models` on the GSM8K problems in `data` (rlhfkit/eval/accuracy.py)")
    samples: list[str] = opt([], "name=path of each policy's samples, written by `rlhfkit generate` on the same posts")
    data: list[str] = opt([], "task=gsm8k: problems (files or hub id), e.g. ../shared/data/gsm8k/test.jsonl.gz")
    hf_split: str = opt("test", "task=gsm8k: split to read when `data` is a hub id")
    pass_k: int = opt(0, "task=gsm8k: answers sampled per problem for sampled accuracy and pass@k (0: greedy only)")
    temperature: float = opt(0.7, "task=gsm8k: sampling temperature of the pass@k answers", minimum=1e-6)
    max_response_length: int = opt(256, "task=gsm8k: answer tokens generated", minimum=1)
    max_query_length: int = opt(512, "task=gsm8k: prompt tokens", minimum=1)
    generation_batch_size: int = opt(32, "task=gsm8k: answers per generation batch", minimum=1)
    easy_steps: int = opt(2, "task=gsm8k: also report problems whose reference solution has at most this many calculator steps")
    trust_remote_code: bool = remote_code_opt()
    rm_judge: str = opt("", "rm:<reward model folder>: its preference consistency with `judge` on the same pairs", "Detail 17")
    reward_model: str = opt("", "reward model folder: mean RM score of each policy's samples (-1 without EOS, Detail 23)")
    reference_model: str = opt("", "reference policy (the SFT model): token shift of every policy's samples, KL of those in `models`", "Appendix F.2")
    models: list[str] = opt([], "name=folder of the policies behind the samples (same names), for their KL to reference_model; "
                                "task=gsm8k: name=model of each policy evaluated, the first the baseline")
    shift_samples: int = opt(3, "samples per policy shown with their tokens coloured by shift in the report", "Table 8")
    max_prompts: int = opt(0, "compare on at most this many common prompts (task=gsm8k: the first problems of `data`; 0: all)")
    out: str = opt("", "output folder (empty: runs/eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()


@dataclass
class PlanConfig:
    """`rlhfkit plan`: a stage's estimated peak memory per device (rlhfkit/memory_plan.py, docs/memory.md).
    A batch or length option left at 0 takes the stage's own default."""

    model: str = opt("smollm2-135m", "model: embedded name, folder with config.json, a config.json file, or hub id (shipped "
                     "configs need no network: Llama-3.2-1B, Pythia 1B/2.8B/6.9B deduped, SmolLM2-135M)")
    stage: Literal["sft", "rm", "dpo", "ppo", "grpo", "rloo", "reinforce"] = opt("ppo", "the stage whose peak memory is estimated")
    reward_model: str = opt("", "on-policy: architecture of the reward and value models, given as `model` is (empty: the policy's)")
    micro_batch_size: int = opt(0, "rows (rm, dpo: pairs) per forward/backward pass (0: the stage's default)")
    forward_batch_size: int = opt(0, "dpo, on-policy: rows (dpo: pairs) per no-grad forward pass (0: the stage's default)")
    generation_batch_size: int = opt(0, "on-policy: rows per generation batch (0: the stage's default)")
    samples_per_prompt: int = opt(0, "on-policy: responses sampled per prompt (0: the stage's default)")
    max_query_length: int = opt(0, "query tokens (0: the stage's default)")
    max_response_length: int = opt(0, "response tokens (0: the stage's default)")
    mixed_precision: Literal["auto", "no", "bf16"] = opt("auto", "as the stage's option; auto plans bf16 autocast, as on a GPU with bf16")
    gradient_checkpointing: bool = opt(False, "recompute activations in the backward pass")
    lora_rank: int = opt(0, "LoRA rank of the trained models (0: full fine-tuning)")
    lora_target_modules: list[str] = opt([], "module names the adapters wrap (empty: every linear layer of the decoder blocks)")
    sharding: Literal["none", "fsdp2", "zero2", "zero3"] = opt("none", "as the stage's option: zero2 shards gradients and optimizer "
                                                               "state, fsdp2 and zero3 the weights too")
    devices: int = opt(1, "devices (processes) the stage runs on", minimum=1)
    decoding: Literal["auto", "eager", "cuda-graphs", "buckets"] = opt(
        "auto", "on-policy: as the stage's option; auto plans CUDA-graph decoding, whose buffers stay through the update")
    device_memory_gb: float = opt(80.0, "memory of one device, GiB", minimum=0.001)
    headroom: float = opt(0.1, "fraction of device memory kept free for the CUDA context, allocator fragmentation and what the "
                          "plan does not model")
    format: Literal["table", "json"] = opt("table", "output: a table, or one JSON object")


@dataclass
class RunsReportConfig:
    runs: list[str] = opt([], "run directories to put side by side (any stages; on-policy runs line up by episodes)")
    out: str = opt("runs/report", "output folder for report.html and plots/")
    max_plots: int = opt(40, "panels at most (headline metrics first)", minimum=1)


def field_info(cls: type) -> list[tuple[str, Any, str, str | None, str]]:
    """(name, default, help, source, type description) for every field of a config class."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((f.name, default, f.metadata.get("help", ""), f.metadata.get("source"), describe_type(hints[f.name])))
    return rows


def preset_names() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in resources.files("rlhfkit.presets").iterdir() if p.name.endswith(".yaml"))


def read_preset(name: str) -> tuple[dict[str, Any], str]:
    path = resources.files("rlhfkit.presets") / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; shipped presets: {', '.join(preset_names())}")
    return read_yaml_text(path.read_text(), f"preset {name}"), f"preset {name}"


def read_config_file(path: str) -> tuple[dict[str, Any], str]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return read_yaml_text(p.read_text(), str(p)), str(p)


def resolve(stage: str, preset: str | None, config_file: str | None, overrides: dict[str, Any], processes: int = 1) -> Any:
    """Build the config of `stage` from defaults, a preset or file, and overrides, checked for `processes` processes."""
    from .config_checks import check_config, launched_processes
    from .stages import STAGES  # these import the config classes above: read them once they exist

    cls = STAGES[stage].config
    cfg = cls()
    for source in (read_preset(preset) if preset else None, read_config_file(config_file) if config_file else None):
        if source is None:
            continue
        values, where = source
        declared = values.pop("stage", stage)
        if declared != stage:
            raise ConfigError(f"{where} is for stage {declared!r}, not {stage!r}")
        base_preset = values.pop("preset", None)  # a config file may start from a preset's values
        if base_preset is not None:
            preset_values, preset_where = read_preset(str(base_preset))
            preset_stage = preset_values.pop("stage", stage)
            if preset_stage != stage:
                raise ConfigError(f"{where} starts from {preset_where}, which is for stage {preset_stage!r}, not {stage!r}")
            cfg = apply(cls, preset_values, preset_where, cfg)
        cfg = apply(cls, values, where, cfg)
    return check_config(apply(cls, overrides, "command-line arguments", cfg), launched_processes(processes))


def to_yaml(cfg: Any, stage: str) -> str:
    return yaml.safe_dump({"stage": stage, **dataclasses.asdict(cfg)}, sort_keys=False)
