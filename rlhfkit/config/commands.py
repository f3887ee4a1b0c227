"""The options of the commands that train nothing: data analysis, sampling, evaluations, judges,
the pipeline, memory plans and multi-run reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .sections import EpisodeOptions, PairLengths
from .training import DataFieldsConfig
from .values import (
    PAIR_FORMATS_HELP,
    PROMPT_FORMATS_HELP,
    article_length_opt,
    check_tokens_opt,
    environment_args_opt,
    environment_timeout_opt,
    max_turns_opt,
    opt,
    output_overwrite_opt,
    query_length_opt,
    remote_code_opt,
)


@dataclass
class AnalyzeConfig:
    dataset: Literal[
        "auto",
        "tldr-sft",
        "tldr-comparisons",
        "hh",
        "gsm8k",
        "prompt-completion",
        "language-modeling",
        "preference",
        "prompt-only",
    ] = opt(
        "auto", "format of `path` (auto: detected from the first record's columns and printed; docs/data-formats.md)"
    )
    path: list[str] = opt([], "files, folders or a Hugging Face dataset id (comma separated)")
    model: str = opt("smollm2-135m", "tokenizer used for token lengths (any HF model dir or hub id)")
    out: str = opt("runs/analysis", "folder for analysis.json and the PNG plots")
    overwrite: bool = output_overwrite_opt()
    max_query_length: int = query_length_opt()
    max_article_query_length: int = article_length_opt()
    hf_split: str = opt("", "split to read when `path` is a hub id (empty: all splits)")


@dataclass
class MakeTaskConfig:
    task: Literal["add", "sub", "mul", "add-mul"] = opt(
        "add", "add: a + b; sub: a - b (a >= b); mul: a * b (b from 2 to 9); add-mul: (a + b) * c (c from 2 to 9)"
    )
    digits: int = opt(3, "digits of a and b (1 to 9)", minimum=1)
    seed: int = opt(0, "seed of the problems and of the rule that splits them into training and held-out sides")
    train_problems: int = opt(5000, "training problems (train.jsonl)", minimum=1)
    test_problems: int = opt(1000, "held-out problems (test.jsonl), none of them a training problem", minimum=1)
    held_out_percent: int = opt(
        20, "about this many problems in 100 fall on the held-out side (raise it for a task with few problems)",
        minimum=1,
        below=100,
    )
    out: str = opt("", "folder for train.jsonl, test.jsonl and task.json (empty: data/<task>-<digits>d-seed<seed>)")
    overwrite: bool = output_overwrite_opt()


@dataclass
class RecipeCheckConfig:
    expected: str = opt("", "a recipe folder (recipes/<name>) or its expected.json")
    variant: str = opt("full", "which of the recipe's variants: full, or short (the version CI runs)")
    root: str = opt("", "folder the recipe's commands wrote (empty: the variant's own root in expected.json)")


@dataclass
class GenerateConfig(DataFieldsConfig):
    model: str = opt("smollm2-135m", "policy to sample from: embedded name, HF directory or hub id")
    data: list[str] = opt(
        [],
        "prompts in prompt_format (hub id, files or folders): TL;DR SFT posts, HH-RLHF comparisons, prompt-only data",
    )
    prompt_format: Literal["auto", "tldr-sft", "hh", "gsm8k", "prompt-only"] = opt("auto", PROMPT_FORMATS_HELP)
    prompt_suite: str = opt(
        "",
        "answer a prompt suite instead of summarising posts: builtin-hh or a YAML file (see rlhfkit/prompts)",
        "seed 002",
    )
    hf_split: str = opt("train", "split to read when `data` is a hub id (train: the one `rlhfkit sft` splits)")
    split: Literal["all", "train", "validation"] = opt("validation", "which side of the post split to use")
    validation_posts: int = opt(
        300,
        "posts held out by post identity (same split as `rlhfkit sft` with the same seed; data with fewer distinct "
        "posts holds out a tenth)",
    )
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
    model: str = opt(
        "",
        "reward model folder written by `rlhfkit rm`, or a DPO policy (its implicit reward, equation 5)",
        "Detail 19",
    )
    reference_model: str = opt(
        "", "DPO only: the reference policy (empty: the one `rlhfkit dpo` recorded in the model folder)", "Appendix A"
    )
    beta: float = opt(0.0, "DPO only: beta of the implicit reward (0: the one `rlhfkit dpo` recorded)", "Appendix A")
    data: list[str] = opt(
        [],
        "comparisons: hub id or OpenAI JSON-lines / HH-RLHF jsonl.gz files, or preference data (docs/data-formats.md)",
    )
    data_format: Literal["auto", "tldr-comparisons", "hh", "preference"] = opt("auto", PAIR_FORMATS_HELP)
    hf_split: str = opt("validation", "split to read when `data` is a hub id")
    splits: list[str] = opt([], "keep only comparisons from these splits (empty: all)", "Detail 16")
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    side: Literal["all", "validation", "train"] = opt(
        "all", "which side of the prompt split to score (as `rlhfkit rm` split it)"
    )
    validation_fraction: float = opt(0.1, "the prompt split's validation fraction (same as the training run)", below=1)
    seed: int = opt(1, "the prompt split's seed (same as the training run)")
    max_pairs: int = opt(0, "score at most this many pairs (0: all)")
    batch_size: int = opt(8, "pairs per forward pass", minimum=1)
    max_query_length: int = query_length_opt()
    max_article_query_length: int = article_length_opt()
    max_response_length: int = opt(
        169, "response tokens including EOS; longer pairs are skipped and counted", "Detail 4", minimum=1
    )
    probes: str = opt(
        "builtin", "YAML of graded probe responses ('builtin': the TL;DR probes, for TL;DR data only; '': none)"
    )
    errors: int = opt(20, "most confidently wrong pairs written to confident_errors.jsonl")
    calibration_bins: int = opt(10, "reward-margin bins of the calibration plot", "Detail 18", minimum=1)
    dump_logits: int = opt(1, "pairs whose per-token reward logits are dumped", "Detail 13")
    length_penalty: float = opt(
        0.0,
        "score each response as reward - length_penalty x response tokens (what PPO sees with reward_length_penalty)",
        minimum=0.0,
    )
    trust_remote_code: bool = remote_code_opt()
    out: str = opt("", "output folder (empty: runs/rm-eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()

    @property
    def lengths(self) -> PairLengths:
        return PairLengths(self.max_query_length, self.max_article_query_length, self.max_response_length)


def stage_opt(preset: str, what: str) -> Any:
    return opt(
        {"preset": preset},
        f"options of the {what} stage, on top of its preset (the `preset` key) and the pipeline's wiring, "
        f"e.g. '{{max_steps: 4, preset: {preset}}}'",
    )


@dataclass
class PipelineConfig:
    """`rlhfkit pipeline`: the stages in order, each in its own sub-directory of output_dir."""

    output_dir: str = opt("runs/pipeline", "run directory; each stage writes <output_dir>/<stage>/")
    stages: list[str] = opt(
        ["sft", "rm", "ppo", "eval"],
        "stages to run, in this order: sft, rm, dpo, ppo, grpo, rloo, "
        "reinforce (any stage that trains a policy, and the reward model they read), then eval",
    )
    task: Literal["tldr", "hh"] = opt(
        "tldr",
        "tldr: SFT data (posts, reference summaries) and TL;DR comparisons; hh: HH-RLHF comparisons only, whose "
        "dialogues are also the prompts (no SFT stage, seed 002)",
    )
    model: str = opt("smollm2-135m", "base model the SFT stage starts from")
    sft_data: list[str] = opt(
        ["vwxyzjn/summarize_from_feedback_tldr_3_filtered"],
        "TL;DR SFT data: SFT, the RM's Detail 15 bias, on-policy prompts",
        "Detail 1",
    )
    comparisons: list[str] = opt(
        ["openai/summarize_from_feedback"],
        "human comparisons for the reward model and DPO (task=hh: also the prompts)",
        "Detail 1",
    )
    judge: str = opt("hf:smollm2-135m", "judge of the eval stage (see `rlhfkit eval --help`); empty: no win rates")
    eval_posts: int = opt(16, "held-out posts summarised by every policy in the eval stage", minimum=1)
    eval_hf_split: str = opt(
        "",
        "hub split whose posts the eval stage summarises (e.g. validation, as Figure 1; empty: the posts the SFT split "
        "held out)",
    )
    sft: dict[str, Any] = stage_opt("tldr-sft", "SFT")
    rm: dict[str, Any] = stage_opt("tldr-rm", "reward-model")
    dpo: dict[str, Any] = stage_opt("tldr-dpo", "DPO")
    ppo: dict[str, Any] = stage_opt("tldr-ppo", "PPO")
    grpo: dict[str, Any] = stage_opt("tldr-grpo", "GRPO")
    rloo: dict[str, Any] = stage_opt("tldr-rloo", "RLOO")
    reinforce: dict[str, Any] = stage_opt("tldr-reinforce-pp", "REINFORCE")
    eval: dict[str, Any] = opt(
        {},
        "options of the eval stage: `rlhfkit eval` keys, e.g. '{max_prompts: 8}' (no preset; eval_posts sets "
        "how many posts each policy answers)",
    )

    def options_of(self, stage: str) -> dict[str, Any]:
        """The options given to `stage` (the field named after it; tests/entry/test_pipeline.py checks that every
        stage the pipeline can run has one)."""
        return dict(getattr(self, stage))


@dataclass
class JudgeConfig:
    """Fields of the commands that ask a judge."""

    judge: str = opt(
        "",
        "judge spec: openai:<model>[@<base url>], anthropic:<model>, hf:<model or folder>, hf-logprob:<model or "
        "folder>, rm:<reward model folder>",
    )
    seed: int = opt(1, "seed of the sample and of the A/B order of each pair")
    template: str = opt(
        "",
        "judge prompt template file, or builtin:hh-helpfulness for HH-RLHF dialogues (empty: the paper's Appendix I "
        "prompt)",
        "Appendix I",
    )
    cache_dir: str = opt(
        "runs/judge-cache", "verdict cache folder shared by evaluations (a repeated pair is never paid twice)"
    )
    concurrency: int = opt(4, "API judges: requests in flight at once", minimum=1)
    timeout: float = opt(60.0, "API judges: seconds per request before it is retried", minimum=0.001)
    input_price: float = opt(0.0, "API judges: price per million input tokens, for the cost line")
    output_price: float = opt(0.0, "API judges: price per million output tokens, for the cost line")
    max_new_tokens: int = opt(64, "hf judges: reply tokens generated", minimum=1)
    batch_size: int = opt(8, "hf and rm judges: pairs per forward batch", minimum=1)


@dataclass
class JudgeEvalConfig(JudgeConfig):
    data: list[str] = opt(
        [],
        "labelled comparisons: hub id or OpenAI JSON-lines / HH-RLHF jsonl.gz files, or preference data "
        "(docs/data-formats.md)",
    )
    data_format: Literal["auto", "tldr-comparisons", "hh", "preference"] = opt("auto", PAIR_FORMATS_HELP)
    hf_split: str = opt("validation", "split to read when `data` is a hub id")
    splits: list[str] = opt([], "keep only comparisons from these splits (empty: all)", "Detail 16")
    batches: list[str] = opt([], "keep only comparisons from these annotation batches (empty: all)", "Detail 16")
    max_pairs: int = opt(64, "judge a seeded sample of this many pairs, each in both orders (0: all)")
    out: str = opt("", "output folder (empty: runs/judge-eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()


@dataclass
class EvalConfig(JudgeConfig):
    # GSM8K was `task=gsm8k` of this command; a config or command line that still says so is told where it went
    MOVED_OPTIONS: ClassVar[dict[str, str]] = {
        "task": "eval compares policies' samples; GSM8K accuracy is its own command: `rlhfkit eval gsm8k data=... "
        "models=...` (`rlhfkit eval gsm8k --help`)",
    }

    samples: list[str] = opt([], "name=path of each policy's samples, written by `rlhfkit generate` on the same posts")
    rm_judge: str = opt(
        "", "rm:<reward model folder>: its preference consistency with `judge` on the same pairs", "Detail 17"
    )
    reward_model: str = opt(
        "", "reward model folder: mean RM score of each policy's samples (-1 without EOS, Detail 23)"
    )
    reference_model: str = opt(
        "",
        "reference policy (the SFT model): token shift of every policy's samples, KL of those in `models`",
        "Appendix F.2",
    )
    models: list[str] = opt(
        [], "name=folder of the policies behind the samples (same names), for their KL to reference_model"
    )
    shift_samples: int = opt(3, "samples per policy shown with their tokens coloured by shift in the report", "Table 8")
    max_prompts: int = opt(0, "compare on at most this many common prompts (0: all)")
    out: str = opt("", "output folder (empty: runs/eval-<timestamp>)")
    overwrite: bool = output_overwrite_opt()


@dataclass
class Gsm8kEvalConfig:
    """`rlhfkit eval gsm8k`: policies' accuracy on a verifiable task's problems, GSM8K's by default
    (rlhfkit/eval/gsm8k.py)."""

    data: list[str] = opt([], "problems (files or hub id), e.g. ../shared/data/gsm8k/test.jsonl.gz")
    hf_split: str = opt("test", "split to read when `data` is a hub id")
    task: str = opt(
        "gsm8k",
        "the task of `data`'s problems, declared in rlhfkit/eval/tasks.py with how its problems are read and an "
        "answer graded (gsm8k: GSM8K's problems and those `data make-task` writes)",
    )
    models: list[str] = opt([], "name=model of each policy evaluated, the first the baseline")
    environments: list[str] = opt(
        [],
        "name=environment for the policies of `models` that answer in multi-turn episodes with it "
        "(e.g. sft-calc=gsm8k-calculator; list a model twice, under two names, to evaluate it with and without); "
        "their episodes run as an on-policy stage's do, under the options below",
    )
    environment_args: dict[str, Any] = environment_args_opt()
    environment_timeout: float = environment_timeout_opt()
    max_turns: int = max_turns_opt()
    check_tokens: bool = check_tokens_opt()
    pairs: list[str] = opt(
        [],
        "policy:baseline pairs of `models` whose paired difference is also given, beside every policy's difference "
        "from the first (e.g. sft-calc:sft for the calculator's effect on one model)",
    )
    reference_model: str = opt(
        "", "reference policy: with pass_k, the KL of each policy's sampled answers to it", "Appendix F.2"
    )
    pass_k: int = opt(0, "answers sampled per problem for sampled accuracy and pass@k (0: greedy only)")
    temperature: float = opt(0.7, "sampling temperature of the pass@k answers", minimum=1e-6)
    max_response_length: int = opt(256, "answer tokens generated", minimum=1)
    max_query_length: int = opt(512, "prompt tokens", minimum=1)
    generation_batch_size: int = opt(32, "answers per generation batch", minimum=1)
    easy_steps: int = opt(
        2, "also report problems whose reference solution has at most this many calculator steps"
    )
    max_prompts: int = opt(0, "evaluate the first this many problems of `data` (0: all)")
    seed: int = opt(1, "seed of the sampled answers and of the bootstrap intervals")
    trust_remote_code: bool = remote_code_opt()
    out: str = opt("", "output folder (empty: runs/eval-gsm8k-<timestamp>)")
    overwrite: bool = output_overwrite_opt()

    def episode_options(self, environment: str) -> EpisodeOptions:
        """The episodes of a policy given `environment` in `environments`, as an on-policy stage's options make
        them (`OnPolicyConfig.episode_options`)."""
        return EpisodeOptions(
            environment, self.environment_args, self.max_turns, self.environment_timeout, self.check_tokens, self.seed
        )


@dataclass
class PlanConfig:
    """`rlhfkit plan`: a stage's estimated peak memory per device (rlhfkit/memory_plan.py, docs/memory.md).
    A batch or length option left at 0 takes the stage's own default."""

    model: str = opt(
        "smollm2-135m",
        "model: embedded name, folder with config.json, a config.json file, or hub id (shipped "
        "configs need no network: Llama-3.2-1B, pythia-1b-deduped, pythia-2.8b-deduped, "
        "pythia-6.9b-deduped, SmolLM2-135M, or their hub ids)",
    )
    stage: str = opt(
        "ppo",
        "the stage whose peak memory is estimated: any stage that trains (sft, rm, dpo, ppo, grpo, rloo, reinforce)",
    )
    reward_model: str = opt(
        "", "on-policy: architecture of the reward and value models, given as `model` is (empty: the policy's)"
    )
    micro_batch_size: int = opt(0, "rows (rm, dpo: pairs) per forward/backward pass (0: the stage's default)")
    forward_batch_size: int = opt(
        0, "dpo, on-policy: rows (dpo: pairs) per no-grad forward pass (0: the stage's default)"
    )
    generation_batch_size: int = opt(0, "on-policy: rows per generation batch (0: the stage's default)")
    samples_per_prompt: int = opt(0, "on-policy: responses sampled per prompt (0: the stage's default)")
    shared_prefix: Literal["auto", "off"] = opt(
        "auto", "grouped methods and dpo, as the stage's option: each query read once (one row per group or pair)"
    )
    max_query_length: int = opt(0, "query tokens (0: the stage's default)")
    max_response_length: int = opt(0, "response tokens (0: the stage's default)")
    mixed_precision: Literal["auto", "no", "bf16"] = opt(
        "auto", "as the stage's option; auto plans bf16 autocast, as on a GPU with bf16"
    )
    gradient_checkpointing: bool = opt(False, "recompute activations in the backward pass")
    lora_rank: int = opt(0, "LoRA rank of the trained models (0: full fine-tuning)")
    lora_target_modules: list[str] = opt(
        [], "module names the adapters wrap (empty: every linear layer of the decoder blocks)"
    )
    sharding: Literal["none", "fsdp2", "zero2", "zero3"] = opt(
        "none", "as the stage's option: zero2 shards gradients and optimizer state, fsdp2 and zero3 the weights too"
    )
    devices: int = opt(1, "devices (processes) the stage runs on", minimum=1)
    decoding: Literal["auto", "eager", "cuda-graphs", "buckets"] = opt(
        "auto",
        "on-policy: as the stage's option; auto plans CUDA-graph decoding, whose buffers stay through the update",
    )
    device_memory_gb: float = opt(80.0, "memory of one device, GiB", minimum=0.001)
    headroom: float = opt(
        0.1,
        "fraction of device memory kept free for the CUDA context, allocator fragmentation and what the "
        "plan does not model",
    )
    format: Literal["table", "json"] = opt("table", "output: a table, or one JSON object")


@dataclass
class RunsReportConfig:
    runs: list[str] = opt([], "run directories to put side by side (any stages; on-policy runs line up by episodes)")
    out: str = opt("runs/report", "output folder for report.html and plots/")
    max_plots: int = opt(40, "panels at most (headline metrics first)", minimum=1)
