"""What an on-policy run is evaluated on: held-out prompts summarised by the SFT and the trained policies,
scored by the reward model (EOS trick applied) and by ROUGE-L against the references, and the run's report
(Figure 12's curves, update statistics, phase times, samples). Each update's own statistics and samples are
in rollout_stats.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import PromptSplit, RewardOptions, RolloutOptions
from ..data import SFTRecord, load_prompts, usable
from ..data.examples import SFTExample, tokenize_sft, training_examples
from ..data.split import split_by_prompt
from ..environments import episode_plan
from ..errors import ConfigError
from ..eval.alarms import alarms
from ..generation import (
    SamplingParams,
    completion_texts,
    sample_held_out,
)
from ..plots import metric_series, plot_curves
from ..report.caveats import (
    alarm_caveat,
    budget_caveat,
    eos_trick_caveat,
    fell_caveat,
    few_prompts_caveat,
    reward_model_caveat_of,
)
from ..report.report import Report, config_text, trained_amount, training_summary
from ..rouge import mean, rouge_l
from ..tracking import read_jsonl, read_metrics
from .advantages import with_eos_trick
from .episodes import episode_prompts
from .rollout_stats import SAMPLE_KEYS, SAMPLES_FILE, episode_turns, transcript
from .scoring import OnPolicyModels, PromptTexts, model_scores, reward_components

FIGURE_12 = ["objective/rlhf_reward", "objective/kl", "objective/scores", "response/length_mean", "response/eos_rate"]
UPDATE_CURVES = [
    "loss/policy_avg",
    "loss/value_avg",
    "loss/kl_avg",
    "policy/entropy_avg",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "val/clipfrac_avg",
    "val/ratio",
    "val/explained_variance",
    "response/length_score_corr",
]
PERF_CURVES = ["perf/generation_s", "perf/scoring_s", "perf/update_s", "perf/generated_tokens_per_s"]


def split_posts(split: PromptSplit, tokenizer) -> tuple[list[SFTExample], list[SFTExample], list[str]]:
    """(prompts to train on, held-out prompts to evaluate on, notes): the post split of `rlhfkit sft`."""
    records, log = usable(
        load_prompts(split.prompt_format, split.data, split.hf_split, split.fields),
        split.data,
        "prompts",
        f"prompt_format={split.prompt_format}",
    )
    # built again here, once per run: the records are read before the models that hold the run's plan load
    episodes = episode_plan(split.episodes)
    records = episodes.records(records) if episodes is not None else records
    train_records, val_records = split_by_prompt(
        records, lambda r: r.prompt_id, validation_size=split.validation_posts, seed=split.seed
    )
    length = split.max_query_length
    train, train_log = training_examples(
        tokenize_sft(train_records, tokenizer, length, 10**9), length, "training prompts"
    )
    held_out, held_out_log = tokenize_sft(val_records, tokenizer, length, 10**9)
    notes = [
        f"loaded: {log.summary('prompts')}",
        f"split by prompt (seed {split.seed}): {len(train_records)} training prompts, {len(val_records)} held-out "
        "prompts, before their queries are tokenized",
        f"query tokenization: training {train_log.summary('prompts')}; held-out {held_out_log.summary('prompts')}",
        f"queries truncated at a paragraph or turn to {length} tokens (Detail 2): "
        f"{sum(e.query.truncated for e in train)}",
    ]
    if not train:
        raise ConfigError(
            f"no training prompts left in {', '.join(split.data)} after holding out "
            f"validation_posts={split.validation_posts} "
            f"(loaded: {log.summary('prompts')})"
        )
    return train, held_out, notes


@torch.no_grad()
def summarise_and_score(
    policy, models: OnPolicyModels, examples: list[SFTExample], options: RolloutOptions, label: str
) -> list[dict]:
    """Responses to `examples` by `policy` with the score it is trained on (EOS trick applied), each
    reward component, length, EOS and ROUGE-L against the reference completions."""
    params = SamplingParams(
        max_new_tokens=options.max_response_length, temperature=options.eval_temperature, decoding=options.decoding
    )
    queries = [e.query.ids for e in examples]
    texts = PromptTexts.of(examples)
    batch = sample_held_out(
        policy, queries, params, models.tokenizer, options.generation_batch_size, options.seed, f"answering ({label})",
        episodes=models.episodes,
        prompts=episode_prompts(texts, list(range(len(examples)))) if models.episodes is not None else (),
    )
    batch = batch.to(torch.device("cpu"))
    sources = models.reward_sources()
    components, failed = reward_components(
        models, batch, model_scores(models, batch, options.forward_batch_size), texts, options.max_response_length
    )
    raw = sources.combine(components, failed)
    scores = with_eos_trick(raw, batch.has_eos, options.shaping).where(~raw.isnan(), raw)  # unscored stays so
    rm_scores = with_eos_trick(components[:, -1], batch.has_eos, options.shaping) if sources.has_model else None
    texts = [text.strip() for text in completion_texts(batch, models.tokenizer)]
    rouge = rouge_l(texts, [e.record.summary.strip() for e in examples])
    rows = []
    for i in range(batch.size):
        row = {
            "text": texts[i],
            "tokens": int(batch.lengths[i]),
            "has_eos": bool(batch.has_eos[i]),
            "score": number_or_none(scores[i]),
            "raw_score": number_or_none(raw[i]),
            "rouge_l": rouge[i],
        }
        if batch.episodes is not None:  # an episode, for the report: turn by turn (the alarms read the text)
            row["episode"] = transcript(episode_turns(batch, i, models.tokenizer))
        row |= {f"reward_{name}": number_or_none(components[i, c]) for c, name in enumerate(sources.functions.names)}
        if rm_scores is not None:  # as the paper reports it: Detail 23's constant where there is no EOS
            row |= {"rm_score": float(rm_scores[i]), "raw_rm_score": float(components[i, -1])}
        rows.append(row)
    return rows


def number_or_none(value: torch.Tensor) -> float | None:
    """A held-out row's score or component; None where nothing scored it (a function returned None)."""
    return None if bool(value.isnan()) else float(value)


def prompt_body(record: SFTRecord) -> str:
    """The TL;DR post, or the HH dialogue, without its template."""
    return record.fields.get("post") or "\n\n".join(record.fields.values())


SUMMARY = (
    ("score", "score"),
    ("length", "tokens"),
    ("eos_rate", "has_eos"),
    ("rouge_l", "rouge_l"),
)  # (metric, row key)


def summary_keys(rows: list[dict]) -> list[tuple[str, str]]:
    """(metric, row key): the score, each reward component, length, EOS rate and ROUGE-L."""
    components = [(key, key) for key in (rows[0] if rows else {}) if key == "rm_score" or key.startswith("reward_")]
    return [SUMMARY[0], *components, *SUMMARY[1:]]


def policy_summary(rows: list[dict], who: str) -> dict[str, float]:
    """The mean of each summary key over the rows that have it (a row no reward function scored has no score)."""
    summary = {}
    for name, key in summary_keys(rows):
        values = [float(r[key]) for r in rows if r[key] is not None]
        if values:
            summary[f"eval/{who}_{name}"] = mean(values)
    return summary


def compare_policies(
    models: OnPolicyModels, examples: list[SFTExample], options: RolloutOptions, name: str
) -> tuple[dict, list[dict]]:
    """SFT (the frozen reference) and the trained policy on the same held-out posts."""
    sft_rows = summarise_and_score(models.reference, models, examples, options, "SFT policy")
    new_rows = summarise_and_score(models.policy, models, examples, options, f"{name} policy")
    metrics = {"eval/posts": len(examples)} | policy_summary(sft_rows, "sft") | policy_summary(new_rows, name)
    compared = [(n["score"], s["score"]) for n, s in zip(new_rows, sft_rows, strict=True)]
    beats = [float(n > s) for n, s in compared if n is not None and s is not None]  # where both were scored
    if beats:
        metrics[f"eval/{name}_beats_sft_score"] = mean(beats)
    rows = []
    for e, sft, new in zip(examples, sft_rows, new_rows, strict=True):
        row = {"prompt_id": e.record.prompt_id, "post": prompt_body(e.record), "reference": e.record.summary.strip()}
        for who, result in (("sft", sft), (name, new)):
            row |= {
                who: result["text"],
                f"{who}_score": result["score"],
                f"{who}_tokens": result["tokens"],
                f"{who}_has_eos": result["has_eos"],
                f"{who}_rouge_l": result["rouge_l"],
            }
            row |= {
                f"{who}_{key}": value for key, value in result.items() if key == "rm_score" or key.startswith("reward_")
            }
            if "episode" in result:
                row[f"{who}_episode"] = result["episode"]
        rows.append(row)
    return metrics, rows


def held_out_alarms(rows: list[dict], who: str) -> dict:
    """The reward-hacking alarms (eval/alarms.py: copying, repetition, length, EOS, a shared template)
    of one policy's held-out summaries."""
    return alarms(
        [r[who] for r in rows],
        [r["post"] for r in rows],
        [r["reference"] for r in rows],
        [r[f"{who}_has_eos"] for r in rows],
    )


LOGPROB_GAP_ALARM = 1e-3  # fp32: decoding steps and one forward pass agree to about 2e-5 (docs/environments.md)
REFUSED_ALARM = 0.5  # tool calls refused per call answered


def episode_caveat(history: list[dict], precision: str) -> str:
    """Multi-turn runs: a flag when the update did not start from the log-probabilities the episodes were sampled
    with (fp32 runs: `precision` "no"), or when the environment refused more of the policy's tool calls than it
    answered."""
    flags = []
    gaps = metric_series(history, "episode/logprob_gap_max")[1]
    if gaps and precision == "no" and max(gaps) > LOGPROB_GAP_ALARM:
        flags.append(f"a sampled token's log-probability moved by up to {max(gaps):.2g} before the update (fp32: "
                     "expected below 1e-3); the environment's ids may not be what the model read")
    calls, refused = (sum(metric_series(history, f"env/tool_{k}")[1]) for k in ("calls", "refused"))
    if refused > REFUSED_ALARM * calls:
        flags.append(f"the environment refused {refused / max(calls, 1e-9):.2g} tool calls for each one it answered: "
                     "read the samples")
    return "; ".join(flags)


@dataclass(frozen=True)
class ReportedRun:
    """What an on-policy run's report says of it beside its metrics and samples."""

    name: str  # the stage
    model: str  # the policy it started from
    total_batch_size: int  # episodes per update
    precision: str  # the autocast it trained in ("no": fp32)
    rewards: RewardOptions


DISTILL_CURVES = ["distill/reverse_kl", "distill/teacher_logprob", "distill/divergence", "objective/scores",
                  "response/length_mean"]


def distill_numbers(report: Report, history: list[dict]) -> None:
    """A distillation run's headline: the per-token reverse KL to the teacher at the last update beside the first's."""
    values = metric_series(history, "distill/reverse_kl")[1]
    if values:
        report.number("per-token KL(student || teacher) of the training rollouts, last update", values[-1], values[0],
                      "first update", "" if values[-1] < values[0] else
                      "the student is no closer to the teacher than at its first update")


def write_onpolicy_report(
    run_dir: Path, run: ReportedRun, notes: list[str], metrics: dict[str, float], rows: list[dict]
) -> Path:
    history, name, rewards = read_metrics(run_dir), run.name, run.rewards
    report = Report(
        f"{name.upper()} run {run_dir.name}",
        training_summary(run_dir, run.model, notes, history, run.total_batch_size, "episodes"),
        config=config_text(run_dir),
    )
    report.caveat(budget_caveat(name, trained_amount(history, run.total_batch_size)))
    if rewards.reward_model:
        report.caveat(reward_model_caveat_of(Path(rewards.reward_model)))
    held_out_numbers(report, name, metrics)
    for who in ("sft", name):
        report.caveat(alarm_caveat(f"the {who} policy's held-out samples", held_out_alarms(rows, who)))
    report.caveat(episode_caveat(history, run.precision))
    functions_alone = bool(rewards.functions) and not rewards.reward_model
    eos_rates = metric_series(history, "response/eos_rate")[1]
    report.caveat(eos_trick_caveat(eos_rates, rewards.eos_trick and functions_alone))
    reward_function_numbers(report, history)
    score = "RM score" if rewards.reward_model and not rewards.functions else "score"
    for key, label in (("objective/scores", score), ("response/eos_rate", "EOS rate")):
        values = metric_series(history, key)[1]
        if values:
            report.number(
                f"{label} of training rollouts, last update",
                values[-1],
                values[0],
                "first update",
                fell_caveat(f"the rollouts' {label}", values[0], values[-1], "first update"),
            )
    distill_numbers(report, history)
    components = sorted({k for row in history for k in row if k.startswith("rewards/") and not k.endswith("_errors")})
    plots = [
        (f"Figure 12: RLHF reward, KL, {score}; length and EOS rate", FIGURE_12, "curves.png", "Figure 12"),
        (
            "Reward components (each reward function and the reward model, before weighting)",
            components,
            "rewards.png",
            "reward components",
        ),
        ("Update statistics", UPDATE_CURVES, "update.png", "update statistics"),
        ("Time per phase", PERF_CURVES, "perf.png", "time per phase"),
    ]
    if metric_series(history, "distill/reverse_kl")[1]:
        plots.insert(1, ("Distillation: per-token KL to the teacher and its log-probabilities, beside the task's score "
                         "and the answers' length", DISTILL_CURVES, "distill.png", "distillation"))
    for title, keys, file, short in plots:
        report.figure(title, plot_curves(history, keys, run_dir / "plots" / file, f"{name.upper()} {short}"))
    answers = ["sft_episode", f"{name}_episode"] if rewards.environment else ["sft", name]
    columns = ["post", "reference", *answers, "sft_score", f"{name}_score", "sft_tokens", f"{name}_tokens"]
    report.sample_table("Held-out samples", rows[:10], columns)
    samples_path = run_dir / SAMPLES_FILE
    if samples_path.exists():
        logged = read_jsonl(samples_path)
        last = max(r["step"] for r in logged) if logged else 0
        shown = [r for r in logged if r["step"] == last]
        extra = list(dict.fromkeys(k for r in shown for k in r if k not in SAMPLE_KEYS))  # log_extra's columns
        report.sample_table(
            f"Highest- and lowest-scored training samples (update {last})",
            shown,
            ["rank", "score", "kl", "advantage", "length", "has_eos", "episode" if rewards.environment else "response",
             *extra],
        )
    return report.write(run_dir)


def reward_function_numbers(report: Report, history: list[dict]) -> None:
    """Each reward function's share of failed and unscored (None) rows, and the rows dropped from the updates,
    over the run (reward/<name>/error_fraction, reward/<name>/none_fraction, reward/dropped_rows)."""
    keys = sorted({k for row in history for k in row if k.endswith(("/error_fraction", "/none_fraction"))})
    for key in keys:
        values = metric_series(history, key)[1]
        report.number(f"{key}, mean over the updates", sum(values) / len(values))
    dropped = metric_series(history, "reward/dropped_rows")[1]
    if dropped:
        report.number("rows dropped from the updates (no reward scored them, or reward_errors=skip)", sum(dropped))


def held_out_numbers(report: Report, name: str, metrics: dict[str, float]) -> None:
    """The trained policy beside the SFT policy it started from, on the same held-out prompts."""
    if not metrics:
        return
    report.caveat(few_prompts_caveat(int(metrics["eval/posts"]), "held-out prompts"))
    for key, label in (
        ("score", "score"),
        ("rm_score", "RM score"),
        ("eos_rate", "EOS rate"),
        ("length", "length (tokens)"),
        ("rouge_l", "ROUGE-L"),
    ):
        after, before = metrics.get(f"eval/{name}_{key}"), metrics.get(f"eval/sft_{key}")
        if after is None or (key == "rm_score" and metrics.get(f"eval/{name}_score") == after):
            continue  # the score is the RM score when the reward model is the only reward
        caveat = "" if key in ("length", "rouge_l") else fell_caveat(f"held-out {label}", before, after, "SFT policy")
        report.number(f"held-out {label}", after, before, "SFT policy (the start)", caveat)
    beats = metrics.get(f"eval/{name}_beats_sft_score")
    if beats is not None:
        report.number(f"share of held-out prompts where {name} outscores SFT", beats, 0.5, "chance")
