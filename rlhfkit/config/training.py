"""The training stages' options: the fields every run shares (`RunConfig`), the supervised stages'
(`TrainConfig`: SFT, and `PairConfig`: reward model, DPO) and each stage's own defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .sections import FieldNames, LoraOptions, ModelSource, PairLengths, PairSelection, ShardingOptions
from .values import (
    PAIR_FORMATS_HELP,
    SFT_FORMATS_HELP,
    article_length_opt,
    check_known,
    opt,
    pickle_opt,
    query_length_opt,
    remote_code_opt,
)


@dataclass
class DataFieldsConfig:
    """Column names of data in the ecosystem's generic formats (docs/data-formats.md), for every stage that reads
    data."""

    prompt_field: str = opt("", "generic formats: column of the prompt (empty: prompt)")
    completion_field: str = opt("", "generic formats: column of the completion (empty: completion)")
    chosen_field: str = opt("", "generic formats: column of the preferred response (empty: chosen)")
    rejected_field: str = opt("", "generic formats: column of the rejected response (empty: rejected)")
    text_field: str = opt(
        "", "generic formats: column of language-modelling text or conversations (empty: text, or messages)"
    )

    @property
    def fields(self) -> FieldNames:
        """The `*_field` options; each one left empty keeps the standard name."""
        given = {
            "prompt": self.prompt_field,
            "completion": self.completion_field,
            "chosen": self.chosen_field,
            "rejected": self.rejected_field,
            "text": self.text_field,
        }
        return FieldNames(**{role: column for role, column in given.items() if column})


# the options of a stage that name a model: the Python API takes a loaded model for each, a run checks each loads
MODEL_OPTIONS = ("model", "reference_model", "reward_model", "value_model", "teacher")


@dataclass
class RunConfig(DataFieldsConfig):
    """Fields shared by every training stage."""

    def __new__(cls, *args: Any, **kwargs: Any):
        # a dataclass meets an unknown keyword with a bare TypeError; a TRL user's GRPOConfig(num_generations=8)
        # learns the option it is called here instead
        for key in kwargs:
            check_known(cls, key, f"{cls.__name__}(...)")
        return super().__new__(cls)

    model: str = opt("smollm2-135m", "starting model: embedded name, HF directory or hub id")
    output_dir: str = opt("", "run directory (empty: runs/<stage>-<timestamp>)")
    seed: int = opt(1, "seed for torch, numpy, python and the data order")
    learning_rate: float = opt(3e-6, "AdamW learning rate", "Tables 3, 4, 7")
    adam_eps: float = opt(1e-5, "AdamW epsilon", "Tables 3, 4, 7")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    lr_scheduler: Literal["cosine", "linear", "constant"] = opt("cosine", "learning-rate schedule", "Tables 3, 4")
    warmup_steps: int = opt(0, "linear warm-up steps before the schedule")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: use num_epochs)")
    total_batch_size: int = opt(
        128, "episodes per optimizer step = micro batch x accumulation x processes", "Table 3", minimum=1
    )
    micro_batch_size: int = opt(8, "rows per forward pass on one process", minimum=1)
    max_query_length: int = query_length_opt()
    max_response_length: int = opt(
        53,
        "response tokens including EOS; a longer completion is cut (without its EOS) in SFT on generic data, "
        "skipped on TL;DR or GSM8K data (docs/data-formats.md); both are counted",
        "Detail 4",
        minimum=1,
    )
    trust_remote_code: bool = remote_code_opt()
    allow_pickle: bool = pickle_opt()
    mixed_precision: Literal["auto", "no", "bf16"] = opt("auto", "bf16 autocast where supported, else fp32", "Detail 8")
    gradient_checkpointing: bool = opt(False, "recompute activations to save memory")
    lora_rank: int = opt(
        0, "LoRA rank of the trained models (0: off, full fine-tuning); the scalar heads stay fully trainable"
    )
    lora_alpha: float = opt(
        16.0, "LoRA scale numerator: the adapter's update is scaled by lora_alpha / lora_rank", minimum=1e-9
    )
    lora_dropout: float = opt(0.0, "dropout on the adapter input (0: off, as everywhere else: Detail 7)")
    lora_target_modules: list[str] = opt(
        [], "module names the adapters wrap (empty: every linear layer of the decoder blocks)"
    )
    sharding: Literal["none", "fsdp2", "zero2", "zero3"] = opt(
        "none",
        "shard across processes: fsdp2 (parameters, gradients, optimizer state), zero2/zero3 (DeepSpeed; the deepspeed "
        "extra)",
    )
    max_grad_norm: float = opt(0.0, "clip the gradient norm to this (0: no clipping; the norm is still logged)")
    keep_checkpoints: int = opt(2, "newest checkpoints kept in checkpoints/ (0: all)")
    save_every: int = opt(0, "save a checkpoint every N optimizer steps (0: only at the end)")
    eval_every: int = opt(0, "evaluate every N optimizer steps (0: only at the end)")
    log_every: int = opt(1, "log metrics every N optimizer steps", minimum=1)
    report_to: list[Literal["tensorboard", "wandb"]] = opt(
        ["tensorboard"], "trackers besides metrics.jsonl (wandb needs the wandb extra)"
    )
    resume: str = opt("", "run directory or checkpoint folder to resume from")
    overwrite: bool = opt(
        False, "start afresh in an output_dir that holds another run: move that run aside to <output_dir>.old-<time>"
    )

    @property
    def lora(self) -> LoraOptions:
        return LoraOptions(self.lora_rank, self.lora_alpha, self.lora_dropout, list(self.lora_target_modules))

    @property
    def model_source(self) -> ModelSource:
        return ModelSource(self.model, self.trust_remote_code, self.allow_pickle)

    @property
    def sharding_options(self) -> ShardingOptions:
        return ShardingOptions(self.sharding, self.lora_rank, self.micro_batch_size, self.max_grad_norm)


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
    data_format: Literal["auto", "tldr-sft", "gsm8k", "prompt-completion", "language-modeling"] = opt(
        "auto", SFT_FORMATS_HELP
    )
    hf_split: str = opt("train", "split to read when `data` is a hub id")
    validation_posts: int = opt(
        300,
        "posts held out by post identity for validation (0: none; data with fewer distinct posts holds out a tenth)",
    )
    loss_on_query: bool = opt(False, "also train on query tokens (default: response tokens only)")
    eval_samples: int = opt(64, "held-out posts generated and scored with ROUGE-L at the end (0: none)")
    eval_temperature: float = opt(0.0, "temperature for the evaluation generations (0: greedy)")


@dataclass
class PairConfig(TrainConfig):
    """Fields of the stages that train on human comparisons (reward model, DPO)."""

    data: list[str] = opt(
        ["openai/summarize_from_feedback"],
        "comparisons in data_format: hub id, files (OpenAI JSON lines, HH-RLHF jsonl.gz, any jsonl, json, csv, "
        "parquet) or folders",
        "Detail 1",
    )
    data_format: Literal["auto", "tldr-comparisons", "hh", "preference"] = opt("auto", PAIR_FORMATS_HELP)
    hf_split: str = opt("train", "split to read when `data` is a hub id")
    total_batch_size: int = opt(64, "pairs per optimizer step", minimum=1)
    micro_batch_size: int = opt(4, "pairs per forward pass on one process", minimum=1)
    max_response_length: int = opt(
        169,
        "response tokens including EOS; DPO cuts longer responses of generic or HH data (without their EOS), "
        "other pairs with one are skipped (docs/data-formats.md); both are counted",
        "Detail 4",
        minimum=1,
    )
    max_article_query_length: int = article_length_opt()
    validation_fraction: float = opt(
        0.1, "fraction of prompts (posts, dialogues) held out by prompt identity for validation", below=1
    )
    splits: list[str] = opt([], "keep only comparisons from these splits (e.g. train, valid1; empty: all)", "Detail 16")
    validation_splits: list[str] = opt(
        [],
        "split-disjoint protocol: validate on these upstream splits (TL;DR valid1), train on `splits` "
        "(empty: the others); replaces validation_fraction; prompts also trained on are dropped",
        "Detail 6",
    )
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    max_pairs: int = opt(0, "train on at most this many training pairs, in data order (0: all)")
    eval_pairs: int = opt(256, "validation pairs scored at each evaluation (0: all)")

    @property
    def lengths(self) -> PairLengths:
        return PairLengths(self.max_query_length, self.max_article_query_length, self.max_response_length)

    @property
    def pair_selection(self) -> PairSelection:
        return PairSelection(
            list(self.data),
            self.data_format,
            self.hf_split,
            self.fields,
            list(self.splits),
            list(self.batches),
            list(self.validation_splits),
            self.validation_fraction,
            self.seed,
            self.max_pairs,
        )


@dataclass
class RMConfig(PairConfig):
    total_batch_size: int = opt(64, "pairs per optimizer step", "Table 4", minimum=1)
    head: Literal["eos-linear", "mean-mlp"] = opt(
        "eos-linear", "reward head: EOS-token linear or mean-pooled MLP", "Details 11-12"
    )
    sft_data: list[str] = opt([], "SFT data whose reference summaries set the reward bias (empty: skip)", "Detail 15")
    normalization_samples: int = opt(1024, "reference summaries used for the bias", "Detail 15")
    length_head: bool = opt(
        False,
        "ODIN (Chen et al. 2024): a second linear head trained to carry response length, decorrelated "
        "from the reward head, which alone is saved as the reward",
    )
    length_head_weight: float = opt(
        1.0, "ODIN: weight of |corr(reward, length)| - corr(length head, length)", minimum=0.0
    )
    orthogonality_weight: float = opt(1.0, "ODIN: weight of |W_reward . W_length|", minimum=0.0)
    length_balance: bool = opt(
        False, "train on equal numbers of pairs whose chosen response is longer and shorter (majority subsampled)"
    )
    trainable_layers: int = opt(
        -1,
        "train only the top N transformer blocks and the heads (-1: everything; 0: heads only, on backbone "
        "features computed once and cached)",
        minimum=-1,
    )
    feature_cache: str = opt(
        "", "trainable_layers=0: file of cached backbone features, shared between runs (empty: <run>/features.pt)"
    )
    cross_validation_folds: int = opt(
        0,
        "post-disjoint K-fold cross-validation before the final model: K models, each trained like it "
        "on the training pairs of K-1 folds of prompts, score the fold they never saw, so every "
        "training pair is validated once (0: off; cheap with trainable_layers=0)",
        minimum=0,
    )


@dataclass
class DPOConfig(PairConfig):
    """DPO from the SFT policy (Appendix A equations 4-5, Table 6)."""

    model: str = opt(
        "smollm2-135m",
        "SFT policy: starts the trained policy and, unless reference_model is set, is the frozen reference",
    )
    reference_model: str = opt("", "frozen reference policy (empty: the starting model)", "Appendix A")
    loss_type: Literal["dpo", "ipo", "cdpo", "simpo"] = opt(
        "dpo",
        "preference loss: dpo (Rafailov et al. 2023), ipo (Azar et al. 2023), cdpo (dpo with label_smoothing, Mitchell "
        "2023), "
        "simpo (no reference, length-normalised, Meng et al. 2024); see docs/algorithms.md",
        "Appendix A",
    )
    beta: float = opt(
        0.05,
        "dpo, ipo, cdpo: weight of the log-ratio to the reference (ipo's target margin is 1/(2 beta))",
        "Table 6",
        minimum=1e-9,
    )
    label_smoothing: float = opt(
        0.0, "cdpo only: eps, the assumed probability that a human label is flipped, in (0, 0.5)", "Mitchell 2023"
    )
    simpo_beta: float = opt(
        2.0,
        "simpo only (in place of beta): weight of the mean token log-probability",
        "SimPO, Llama-3-Base setup",
        minimum=1e-9,
    )
    simpo_gamma: float = opt(
        1.0, "simpo only: target margin between the chosen and rejected rewards", "SimPO, Llama-3-Base setup"
    )
    total_batch_size: int = opt(64, "pairs per optimizer step", "Table 6", minimum=1)
    learning_rate: float = opt(3e-6, "AdamW learning rate", "Table 6")
    lr_scheduler: Literal["cosine", "linear", "constant"] = opt("cosine", "learning-rate schedule", "Table 6")
    forward_batch_size: int = opt(
        8, "pairs per no-grad forward pass (reference log-probabilities, validation)", minimum=1
    )
    shared_prefix: Literal["auto", "off"] = opt(
        "auto",
        "read each pair's query once, in one row with both responses, in training, the reference pass and "
        "validation (auto falls back to a row per response, with the reason logged, where a model cannot take "
        "the mask); off: a row per response",
        "docs/performance.md",
    )
    eval_samples: int = opt(
        16, "validation prompts answered greedily by the reference and the DPO policy at the end (0: none)"
    )
