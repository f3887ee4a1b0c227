"""`rlhfkit eval gsm8k`: accuracy of policies on a verifiable task's problems, with or without an environment: GSM8K
(and the problems `data make-task` writes), or any task `task=` names of those eval/tasks.py declares, which says
how its problems are read and an answer graded.

Per policy, on the same problems in file order (the first `max_prompts`):
- greedy pass@1: one greedy answer per problem, graded against the reference by the task (GSM8K: its final number,
  `rewards.is_correct`);
- with `pass_k=k`: k sampled answers per problem at `temperature`: the mean accuracy of a sample
  (sampled pass@1) and pass@k, the share of problems with at least one correct answer among k (the
  base model's pass@k is best-of-k with a perfect verifier: what RL's extra samples could at most buy);
- the share of answers in the format the prompt asks for (GSM8K: `rewards.answer_format`), response length,
  the EOS rate and, with `reference_model=`, the KL of the sampled answers to the reference
  (sum over tokens of log pi - log pi_ref, at the sampling temperature, averaged over answers);
- the share of answers that write a calculator annotation `<<48/2=24>>`, and for a policy given an
  environment (`environments=sft-calc=gsm8k-calculator`: its answers are multi-turn episodes, the
  calculator inserting each result) the share of answers in which the calculator answered a call.

Every accuracy has a 95% percentile-bootstrap interval over problems, and every policy after the
first its paired difference from the first, with the interval of the per-problem differences
(`pairs=sft-calc:sft` adds the paired difference of any two, and the problems only one of them got
right). Where the problems count their calculator steps (GSM8K's do), the same table is given for the easy subset:
problems whose reference solution has at most `easy_steps` calculator annotations (a rule fixed before any result is
seen).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import Gsm8kEvalConfig, parse_named
from ..data.examples import SFTExample, reward_prompt, tokenize_sft
from ..devices import default_device, model_device
from ..environments import EpisodePlan, EpisodePrompt, episode_plan
from ..environments.calculator import ANNOTATION
from ..errors import ConfigError
from ..generation import (
    SamplingParams,
    completion_texts,
    sample_held_out,
)
from ..intervals import bootstrap_interval
from ..logprobs import response_logprobs
from ..models import load_policy
from ..report.caveats import fell_caveat, few_prompts_caveat
from ..report.report import Report, with_intervals
from ..rollout import RolloutBatch
from ..tracking import write_jsonl
from .tasks import Grader, Task, task_named

RESAMPLES = 2000
TOOL_CALLS = "tool_calls"  # the component the calculator reports its answered calls under (calculator.py)


def named_models(specs: list[str]) -> dict[str, str]:
    """name=model pairs in order; a model is an embedded name, a folder or a hub id."""
    named = parse_named(specs, "models", "base=smollm2-135m,grpo=runs/grpo/model")
    if not named:
        raise ConfigError(
            "eval gsm8k needs models=name=model[,name=model...]: the first is the baseline the others are "
            "compared with"
        )
    return named


def interval(values: np.ndarray, seed: int) -> dict[str, float]:
    low, high = bootstrap_interval(values, np.mean, RESAMPLES, 0.95, seed)
    return {"mean": float(values.mean()), "low": low, "high": high}


def named_pairs(specs: list[str], models: dict[str, str]) -> list[tuple[str, str]]:
    """`policy:baseline` entries of `pairs=`, both names among `models`' and different."""
    pairs = []
    for spec in specs:
        policy, sep, baseline = spec.partition(":")
        if not sep or not policy or not baseline:
            raise ConfigError(f"pairs entry {spec!r} must be policy:baseline, two names of models= (e.g. sft-calc:sft)")
        if policy == baseline:
            raise ConfigError(
                f"pairs entry {spec!r} pairs {policy!r} with itself: a policy cannot be its own baseline; "
                "name two different models= (e.g. sft-calc:sft)"
            )
        unknown = [name for name in (policy, baseline) if name not in models]
        if unknown:
            raise ConfigError(
                f"pairs entry {spec!r} names {', '.join(unknown)}, which models= does not ({', '.join(models)})"
            )
        pairs.append((policy, baseline))
    return pairs


def named_environments(cfg: Gsm8kEvalConfig, models: dict[str, str]) -> dict[str, EpisodePlan]:
    """The episode plan of each policy of `environments=` (name=environment, each name one of `models`'), built as
    an on-policy stage builds its own from the same options."""
    named = parse_named(cfg.environments, "environments", "sft-calc=gsm8k-calculator")
    unknown = [name for name in named if name not in models]
    if unknown:
        raise ConfigError(
            f"environments= names {', '.join(unknown)}, which models= does not: give each environment to a "
            f"policy of models= ({', '.join(models)})"
        )
    return {name: episode_plan(cfg.episode_options(spec)) for name, spec in named.items()}


@torch.no_grad()
def answer(
    policy, examples: list[SFTExample], tokenizer, cfg: Gsm8kEvalConfig, temperature: float, samples: int,
    episodes: EpisodePlan | None = None,
) -> RolloutBatch:
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=temperature)
    label = "greedy" if temperature == 0 else f"{samples} samples at T={temperature}"
    queries = [e.query.ids for e in examples]
    prompts = [EpisodePrompt(reward_prompt(e), e.record.columns, e.record.where) for e in examples]
    return sample_held_out(
        policy, queries, params, tokenizer, cfg.generation_batch_size, cfg.seed, f"answering ({label})", samples,
        episodes, prompts,
    )


@torch.no_grad()
def sequence_logprobs_of(model, batch: RolloutBatch, temperature: float, rows: int) -> torch.Tensor:
    """(B,) summed log-probabilities of each sampled answer's own tokens under `model`: with an environment,
    the tokens it inserted (a calculator's results, a user's turn) are not the policy's and do not count."""
    sums = []
    for start in range(0, batch.size, rows):
        part = batch.select(slice(start, start + rows)).to(model_device(model))
        logprobs, _ = response_logprobs(
            model, part.input_ids(), part.attention_mask(), part.context_length, temperature
        )
        sums.append((logprobs * part.trained_mask).sum(-1).cpu())
    return torch.cat(sums)


def graded(
    batch: RolloutBatch, examples: list[SFTExample], tokenizer, samples: int, task: Task
) -> dict[str, np.ndarray]:
    """Per answer, as `task` grades it: correct, in format, mentioning the answer; and tokens, EOS; arrays of shape
    (problems, samples)."""
    texts = completion_texts(batch, tokenizer)
    answers = [e.record.columns["answer"] for e in examples for _ in range(samples)]
    shape = (len(examples), samples)
    return {
        "texts": np.array(texts, dtype=object).reshape(shape),
        "correct": each_answer(task.grade, texts, answers).reshape(shape),
        "format": np.array([task.in_format(t) for t in texts], dtype=np.float64).reshape(shape),
        "mentioned": each_answer(task.mentions, texts, answers).reshape(shape),
        "tokens": batch.lengths.cpu().numpy().astype(np.float64).reshape(shape),
        "eos": batch.has_eos.cpu().numpy().astype(np.float64).reshape(shape),
        "annotated": np.array([bool(ANNOTATION.search(t)) for t in texts], dtype=np.float64).reshape(shape),
        "tool_calls": tool_calls(batch).reshape(shape),
    }


def each_answer(grade: Grader, texts: list[str], references: list) -> np.ndarray:
    return np.array([grade(t, a) for t, a in zip(texts, references, strict=True)], dtype=np.float64)


def tool_calls(batch: RolloutBatch) -> np.ndarray:
    """(B,) the tool calls answered in each episode, as its environment reports them (the calculator's
    `tool_calls`); NaN for answers sampled without an environment or with one that does not report them."""
    if batch.episodes is None or TOOL_CALLS not in batch.episodes.component_names:
        return np.full(batch.size, np.nan)
    column = batch.episodes.component_names.index(TOOL_CALLS)
    return batch.episodes.env_components[:, column].cpu().numpy().astype(float)


def evaluate_policy(name: str, path: str, examples: list[SFTExample], cfg: Gsm8kEvalConfig, task: Task, reference,
                    episodes: EpisodePlan | None = None) -> dict[str, Any]:
    policy, tokenizer = load_policy(path, cfg.trust_remote_code)
    policy = policy.to(default_device()).eval()  # the GPU where there is one, as `generate` answers
    result: dict[str, Any] = {
        "model": path,
        "greedy": graded(answer(policy, examples, tokenizer, cfg, 0.0, 1, episodes), examples, tokenizer, 1, task),
    }
    if cfg.pass_k:
        batch = answer(policy, examples, tokenizer, cfg, cfg.temperature, cfg.pass_k, episodes)
        result["sampled"] = graded(batch, examples, tokenizer, cfg.pass_k, task)
        if reference is not None:
            rows = cfg.generation_batch_size
            kl = sequence_logprobs_of(policy, batch, cfg.temperature, rows) - sequence_logprobs_of(
                reference, batch, cfg.temperature, rows
            )
            result["kl"] = float(kl.mean())
    print(f"{name}: greedy accuracy {result['greedy']['correct'].mean():.3f} on {len(examples)} problems")
    return result


def summary_table(results: dict[str, dict[str, Any]], subset: np.ndarray, seed: int) -> list[dict[str, Any]]:
    """One row per policy on the problems selected by `subset`: accuracies with intervals, paired
    differences from the first policy, format share, length, EOS rate, KL."""
    rows, baseline = [], None
    for name, result in results.items():
        greedy = result["greedy"]["correct"][subset, 0]
        row: dict[str, Any] = {"policy": name, "problems": int(subset.sum())}
        row |= {f"greedy_accuracy{k if k != 'mean' else ''}": v for k, v in named_interval(greedy, seed).items()}
        if baseline is None:
            baseline, baseline_mentioned = greedy, result["greedy"]["mentioned"][subset, 0]
        else:
            row |= {
                f"greedy_minus_first{k if k != 'mean' else ''}": v
                for k, v in named_interval(greedy - baseline, seed).items()
            }
            # the gain beyond format: right answers against those the first policy wrote anywhere in its answer,
            # which a policy that only learned to put the first policy's numbers last could not exceed
            row |= {
                f"greedy_minus_first_mentioned{k if k != 'mean' else ''}": v
                for k, v in named_interval(greedy - baseline_mentioned, seed).items()
            }
        in_format = result["greedy"]["format"][subset, 0].astype(bool)
        row |= {
            "format_share": float(result["greedy"]["format"][subset].mean()),
            # the right number anywhere in the answer, and the accuracy of answers in and out of format: a gain in
            # accuracy without a gain here is a policy that learned to put its number last, not to compute
            "mentions_answer_share": float(result["greedy"]["mentioned"][subset].mean()),
            "length": float(result["greedy"]["tokens"][subset].mean()),
            "eos_rate": float(result["greedy"]["eos"][subset].mean()),
            "annotation_share": float(result["greedy"]["annotated"][subset].mean()),
        }
        calls = result["greedy"]["tool_calls"][subset, 0]
        if not np.isnan(calls).all():  # answered in episodes with the calculator
            row |= {"tool_use_share": float((calls > 0).mean()), "tool_calls_mean": float(calls.mean())}
        for label, answers in (("in_format", in_format), ("out_of_format", ~in_format)):
            if answers.any():  # else no such answers, and no accuracy to give
                row[f"accuracy_{label}"] = float(greedy[answers].mean())
        if "sampled" in result:
            sampled = result["sampled"]["correct"][subset]
            k = sampled.shape[1]
            row |= {f"sampled_accuracy{s}": v for s, v in suffixed(interval(sampled.mean(1), seed)).items()}
            row |= {f"pass@{k}{s}": v for s, v in suffixed(interval(sampled.max(1), seed)).items()}
            row["sampled_format_share"] = float(result["sampled"]["format"][subset].mean())
        if "kl" in result:
            row["kl_to_reference"] = result["kl"]
        rows.append(row)
    return rows


def pair_table(results: dict[str, dict[str, Any]], pairs: list[tuple[str, str]], subset: np.ndarray,
               seed: int) -> list[dict[str, Any]]:
    """One row per pair on the problems selected by `subset`: the paired difference of greedy accuracy with its
    interval, and the problems both, only the policy and only the baseline got right (the discordant counts on
    which the difference rests)."""
    rows = []
    for policy, baseline in pairs:
        right = results[policy]["greedy"]["correct"][subset, 0]
        base = results[baseline]["greedy"]["correct"][subset, 0]
        row: dict[str, Any] = {"pair": f"{policy} vs {baseline}", "policy": policy, "baseline": baseline,
                               "problems": int(subset.sum())}
        row |= {f"greedy_minus{k}": v for k, v in named_interval(right - base, seed).items()}
        row |= {
            "both_right": int(((right == 1) & (base == 1)).sum()),
            "only_policy_right": int(((right == 1) & (base == 0)).sum()),
            "only_baseline_right": int(((right == 0) & (base == 1)).sum()),
        }
        rows.append(row)
    return rows


def suffixed(stats: dict[str, float]) -> dict[str, float]:
    return {"" if k == "mean" else f"_{k}": v for k, v in stats.items()}


def named_interval(values: np.ndarray, seed: int) -> dict[str, float]:
    return suffixed(interval(values, seed)) if values.size else {}


def select_problems(cfg: Gsm8kEvalConfig, tokenizer) -> list[SFTExample]:
    records, log = task_named(cfg.task).read(cfg.data, cfg.hf_split)
    if cfg.max_prompts:
        records = records[: cfg.max_prompts]
    examples, tokenized = tokenize_sft(records, tokenizer, cfg.max_query_length, 10**9)
    print(
        f"loaded: {log.summary('problems')}; queries: {tokenized.summary('problems')}; evaluating on the first "
        f"{len(examples)}"
    )
    if not examples:
        raise ConfigError(f"no {cfg.task} problems in {', '.join(cfg.data)} ({log.summary('problems')})")
    return examples


def run(cfg: Gsm8kEvalConfig) -> int:
    task = task_named(cfg.task)
    named = named_models(cfg.models)
    pairs = named_pairs(cfg.pairs, named)
    if not cfg.data:
        raise ConfigError("eval gsm8k needs data= (GSM8K test problems, e.g. ../shared/data/gsm8k/test.jsonl.gz)")
    reference = (
        load_policy(cfg.reference_model, cfg.trust_remote_code)[0].to(default_device()).eval()
        if cfg.reference_model and cfg.pass_k
        else None
    )
    first_tokenizer = load_policy(next(iter(named.values())), cfg.trust_remote_code)[1]
    examples = select_problems(cfg, first_tokenizer)
    environments = named_environments(cfg, named)
    results = {
        name: evaluate_policy(name, path, examples, cfg, task, reference, environments.get(name))
        for name, path in named.items()
    }
    subsets = problem_subsets(examples, cfg.easy_steps)
    tables = {label: summary_table(results, mask, cfg.seed) for label, mask in subsets.items()}
    written = {"task": cfg.task, "problems": len(examples), "tables": tables}
    if pairs:
        written["pairs"] = {label: pair_table(results, pairs, mask, cfg.seed) for label, mask in subsets.items()}
    out = Path(cfg.out) if cfg.out else Path("runs") / f"eval-gsm8k-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "accuracy.json").write_text(json.dumps(written, indent=2))
    write_jsonl(out / "answers.jsonl", answer_rows(examples, results))
    report = write_accuracy_report(out, written, cfg)
    print(json.dumps({k: v for k, v in written.items() if k != "problems"}, indent=2))
    print(f"report: {report}")
    return 0


def problem_subsets(examples: list[SFTExample], easy_steps: int) -> dict[str, np.ndarray]:
    """All problems, and where every problem counts its calculator steps (GSM8K's and make-task's do) the easy
    ones."""
    subsets = {"all": np.ones(len(examples), dtype=bool)}
    steps = [e.record.columns.get("calculator_steps") for e in examples]
    if None not in steps:
        subsets[f"easy (<= {easy_steps} calculator steps)"] = np.array(steps) <= easy_steps
    return subsets


def write_accuracy_report(out: Path, written: dict[str, Any], cfg: Gsm8kEvalConfig) -> Path:
    """Each policy's greedy accuracy beside the first policy's on the same problems, with the paired difference,
    and the paired difference of each of `pairs=`."""
    report = Report(
        f"Accuracy on {cfg.task}",
        {"folder": str(out), "policies": ", ".join(cfg.models), "data": ", ".join(cfg.data)},
    )
    tables = written["tables"]
    everything = next(iter(tables.values()))
    first = everything[0]
    report.caveat(few_prompts_caveat(first["problems"], "problems"))
    for row in everything:
        accuracy = (row["greedy_accuracy"], row["greedy_accuracy_low"], row["greedy_accuracy_high"])
        if row is first:
            report.number(f"{row['policy']}: greedy accuracy", accuracy)
            continue
        report.number(
            f"{row['policy']}: greedy accuracy",
            accuracy,
            first["greedy_accuracy"],
            first["policy"],
            fell_caveat("greedy accuracy", first["greedy_accuracy"], row["greedy_accuracy"], first["policy"]),
        )
        report.number(
            f"{row['policy']}: minus {first['policy']} (paired)",
            (row["greedy_minus_first"], row["greedy_minus_first_low"], row["greedy_minus_first_high"]),
            0,
            "no difference",
        )
        report.number(
            f"{row['policy']}: minus the answers {first['policy']} mentions anywhere (paired; the gain beyond format)",
            (
                row["greedy_minus_first_mentioned"],
                row["greedy_minus_first_mentioned_low"],
                row["greedy_minus_first_mentioned_high"],
            ),
            0,
            "no difference",
        )
    pair_tables = written.get("pairs", {})
    for row in next(iter(pair_tables.values()), []):
        report.number(
            f"{row['policy']}: minus {row['baseline']} (paired; right only with {row['policy']} on "
            f"{row['only_policy_right']} problems, only with {row['baseline']} on {row['only_baseline_right']})",
            (row["greedy_minus"], row["greedy_minus_low"], row["greedy_minus_high"]),
            0,
            "no difference",
        )
    for label, rows in tables.items():
        report.table(f"Problems: {label}", [with_intervals(r) for r in rows])
    for label, rows in pair_tables.items():
        report.table(f"Pairs: {label}", [with_intervals(r) for r in rows])
    return report.write(out)


def answer_rows(examples: list[SFTExample], results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for i, e in enumerate(examples):
        row = {"prompt_id": e.record.prompt_id, "where": e.record.where, "answer": e.record.columns["answer"]}
        if "calculator_steps" in e.record.columns:
            row["calculator_steps"] = e.record.columns["calculator_steps"]
        for name, result in results.items():
            row |= {name: result["greedy"]["texts"][i, 0], f"{name}_correct": bool(result["greedy"]["correct"][i, 0])}
            if "sampled" in result:
                row[f"{name}_sampled_correct"] = int(result["sampled"]["correct"][i].sum())
        rows.append(row)
    return rows

