"""`rlhfkit dpo`: DPO from the SFT policy on human comparisons (Appendix A equations 4-5, Table 6, Detail 19).

The loss is -log sigmoid(beta * [log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l)]) over the
response tokens of each pair (equation 4), or another of the DPO family (`loss_type`: ipo, cdpo,
simpo; `preference_ops`). The frozen reference's log-probabilities are computed once before training
for every pair the run will visit, stored in the run directory and read back on resume; they are
never recomputed per step, and SimPO, which has no reference, never computes them. Data, the split
by prompt, the training loop and the evaluation are the reward model's, so the implicit reward
(equation 5; SimPO's beta/|y| log pi) and an explicit reward model can be set side by side on the
same pairs (Detail 19, Figure 6): both are scored by the same `rm-eval` code.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..adapters import frozen_reference, save_final_model, trained_policy
from ..config import DPOConfig
from ..data import PAIRS, resolved_format
from ..data.examples import PairExample, prepare_pairs, prepare_training_pairs, query_limits
from ..data.split import split_comparisons
from ..devices import autocast, default_device, evaluation_mode, model_device
from ..generation import SamplingParams, generate_texts
from ..logprobs import sequence_logprobs, shared_sequence_logprobs
from ..plots import plot_training_curves
from ..preemption import restart_command, resume_command, stopping_at_once
from ..preference_ops import PreferenceLoss, PreferenceObjective, preference_loss
from ..report.report import Table
from ..reward_eval import metrics as reward_metrics
from ..reward_eval import report as reward_report
from ..reward_eval.evaluate import builtin_probes_for, evaluate_reward_model, write_rm_report
from ..reward_models import DPO_RECORD, ImplicitRewardModel
from ..scoring import chosen_and_rejected, collate_pairs, collate_shared_pairs, pair_response_tokens
from ..shared_rows import SharedRows, reads_shared_rows
from ..tracking import read_metrics, write_jsonl
from .run import attention_implementation, autocast_precision, is_main_process, record_settings, start_run
from .supervised import SupervisedStage, batch_indices, plan_schedule, train

REFERENCE_CACHE = "reference_logps.pt"
LOSS_NAMES = {"dpo": "DPO", "ipo": "IPO", "cdpo": "cDPO", "simpo": "SimPO"}


@dataclass
class DPOExample:
    pair: PairExample
    # log pi_ref(response | query), summed over the response tokens; None for a loss without reference (SimPO)
    ref_chosen: float | None = None
    ref_rejected: float | None = None

    def width(self) -> int:
        return self.pair.width()


def preference_objective(cfg: DPOConfig) -> PreferenceObjective:
    """The loss `cfg` asks for. SimPO's beta scales a mean token log-probability, some 40 times DPO's,
    so it has an option of its own: a DPO preset with loss_type=simpo gets SimPO's published values."""
    if cfg.loss_type == "simpo":
        return PreferenceObjective("simpo", cfg.simpo_beta, simpo_gamma=cfg.simpo_gamma)
    return PreferenceObjective(cfg.loss_type, cfg.beta, cfg.label_smoothing)


def frozen_policy(cfg: DPOConfig, policy: torch.nn.Module, source: str, device: torch.device) -> torch.nn.Module:
    """`source` frozen on `device`: the loss's reference, or the starting policy SimPO's result is compared with."""
    return frozen_reference(cfg.model_source, policy, source).to(device).eval().requires_grad_(False)


def shares_queries(model: torch.nn.Module, shared_prefix: str) -> bool:
    """Whether `model` reads pairs as shared rows, the query once (`scoring.collate_shared_pairs`)."""
    return reads_shared_rows(model, shared_prefix)


def collate_pair_rows(pairs: list[PairExample], pad_id: int, shared: bool) -> dict[str, torch.Tensor]:
    """A pair batch in either layout: one shared row per pair, or chosen rows, then rejected rows."""
    return collate_shared_pairs(pairs, pad_id) if shared else collate_pairs(pairs, pad_id)


def collate_dpo(examples: list[DPOExample], pad_id: int, shared: bool = False) -> dict[str, torch.Tensor]:
    """A pair batch (`collate_pair_rows`) plus the cached reference log-probabilities, where the loss has a
    reference."""
    batch = collate_pair_rows([e.pair for e in examples], pad_id, shared)
    if examples[0].ref_chosen is None:
        return batch
    if any(math.isnan(e.ref_chosen) for e in examples):
        raise RuntimeError("a batched pair has no reference log-probability: visited_indices and the "
                           "supervised trainer's order disagree")
    batch["ref_chosen"] = torch.tensor([e.ref_chosen for e in examples], dtype=torch.float32)
    batch["ref_rejected"] = torch.tensor([e.ref_rejected for e in examples], dtype=torch.float32)
    return batch


def pair_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi(chosen), log pi(rejected)), each (B,), from one forward pass over the batch's rows: B shared
    rows or 2B rows of their own."""
    shared = SharedRows.from_batch(batch)
    if shared is None:
        sums = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    else:
        sums = shared_sequence_logprobs(model, shared, batch["pair_responses"], batch["pair_response_mask"])
    return chosen_and_rejected(sums, batch)


def preference_metrics(
    out: PreferenceLoss, objective: PreferenceObjective, prefix: str, reduce: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The reward model's metrics (same names, so the RM and DPO curves share plots) over the implicit
    rewards, reduced over pairs (`supervised.run_step` averages sums itself), and, where there is a
    reference, log pi - log pi_ref summed over the chosen response: the sequence KL estimate on the data."""
    margin = out.chosen_rewards - out.rejected_rewards
    metrics = {
        f"{prefix}/accuracy": reduce((margin > 0).float()),
        f"{prefix}/chosen_reward": reduce(out.chosen_rewards),
        f"{prefix}/rejected_reward": reduce(out.rejected_rewards),
        f"{prefix}/margin": reduce(margin),
    }
    if objective.uses_reference:
        metrics[f"{prefix}/kl_chosen"] = reduce(out.chosen_rewards / objective.beta)
    return metrics


def make_dpo_loss(objective: PreferenceObjective | float):
    """The stage's loss function: the sum over pairs of the objective's loss; a bare float is plain DPO's beta."""
    if not isinstance(objective, PreferenceObjective):
        objective = PreferenceObjective("dpo", objective)

    def dpo_loss_fn(
        model: torch.nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = pair_logprobs(model, batch)
        chosen_lengths, rejected_lengths = pair_response_tokens(batch)  # the tokens each log-probability sums over
        out = preference_loss(
            chosen,
            rejected,
            objective,
            batch.get("ref_chosen"),
            batch.get("ref_rejected"),
            chosen_lengths,
            rejected_lengths,
        )
        return out.losses.sum(), preference_metrics(out, objective, "train", torch.sum)

    return dpo_loss_fn


@torch.no_grad()
def pair_logprobs_all(
    model: torch.nn.Module,
    pairs: list[PairExample],
    pad_id: int,
    batch_size: int,
    precision: str,
    desc: str,
    shared_prefix: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(log pi(chosen), log pi(rejected)) of every pair, in input order; batched longest first, each query read
    once where `shares_queries`."""
    device = model_device(model)
    shared = shares_queries(model, shared_prefix)
    order = sorted(
        range(len(pairs)), key=lambda i: -(len(pairs[i].query.ids) + max(len(pairs[i].chosen), len(pairs[i].rejected)))
    )
    chosen, rejected = np.zeros(len(pairs)), np.zeros(len(pairs))
    with evaluation_mode(model), autocast(device, precision):
        for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=len(order) <= batch_size):
            rows = order[start : start + batch_size]
            batch = {k: v.to(device) for k, v in collate_pair_rows([pairs[i] for i in rows], pad_id, shared).items()}
            c, r = pair_logprobs(model, batch)
            chosen[rows], rejected[rows] = c.float().cpu().numpy(), r.float().cpu().numpy()
    return chosen, rejected


def cache_key(reference: str, precision: str, pairs: list[PairExample]) -> str:
    digest = hashlib.sha256(f"{reference}|{precision}".encode())
    for p in pairs:
        digest.update(np.asarray(p.query.ids + [-1] + p.chosen + [-2] + p.rejected + [-3], dtype=np.int64).tobytes())
    return digest.hexdigest()


def reference_logprobs(
    reference: torch.nn.Module, reference_name: str, pairs: list[PairExample], pad_id: int, cfg: DPOConfig, cache: Path
) -> list[DPOExample]:
    """The pairs with their reference log-probabilities: read from `cache` when it holds these exact
    pairs for this reference and precision (a resumed run), else computed once and written there."""
    precision = autocast_precision(cfg)
    key = cache_key(reference_name, precision, pairs)
    stored = torch.load(cache, weights_only=True) if cache.is_file() else {}
    if stored.get("key") == key:
        chosen, rejected = stored["chosen"].numpy(), stored["rejected"].numpy()
    else:
        chosen, rejected = pair_logprobs_all(
            reference,
            pairs,
            pad_id,
            cfg.forward_batch_size,
            precision,
            f"reference log-probabilities ({cache.stem})",
            cfg.shared_prefix,
        )
        if is_main_process():  # written whole, then renamed: another process never reads half a file
            partial = cache.with_suffix(".partial")
            torch.save(
                {"key": key, "chosen": torch.from_numpy(chosen), "rejected": torch.from_numpy(rejected)}, partial
            )
            partial.replace(cache)
    return [DPOExample(p, float(c), float(r)) for p, c, r in zip(pairs, chosen, rejected, strict=True)]


def visited_indices(cfg: DPOConfig, examples: int) -> list[int]:
    """The training pairs the schedule reaches on every process (max_steps may stop before an epoch ends)."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    schedule = plan_schedule(cfg, examples, processes)
    return sorted(
        {
            i
            for step in range(schedule.total_steps)
            for rank in range(processes)
            for micro in batch_indices(schedule, cfg.seed, step, rank)
            for i in micro
        }
    )


def visited_with_reference(
    reference: torch.nn.Module, reference_name: str, pairs: list[PairExample], pad_id: int, cfg: DPOConfig, cache: Path
) -> list[DPOExample]:
    """Every training pair, with reference log-probabilities for those the run will visit; the others
    (NaN) are never batched, so a short run does not pay a forward pass over the whole dataset."""
    visited = visited_indices(cfg, len(pairs))
    computed = dict(
        zip(
            visited,
            reference_logprobs(reference, reference_name, [pairs[i] for i in visited], pad_id, cfg, cache),
            strict=True,
        )
    )
    return [computed[i] if i in computed else DPOExample(p, math.nan, math.nan) for i, p in enumerate(pairs)]


def without_reference(pairs: list[PairExample]) -> list[DPOExample]:
    return [DPOExample(p) for p in pairs]


def held_out_loss(
    model: torch.nn.Module, examples: list[DPOExample], pad_id: int, cfg: DPOConfig, objective: PreferenceObjective
) -> PreferenceLoss:
    """The objective's loss and implicit rewards (equation 5, or SimPO's) of every pair, without gradients."""
    chosen, rejected = pair_logprobs_all(
        model,
        [e.pair for e in examples],
        pad_id,
        cfg.forward_batch_size,
        autocast_precision(cfg),
        "validating",
        cfg.shared_prefix,
    )
    references = (
        [
            torch.tensor([getattr(e, side) for e in examples], dtype=torch.float64)
            for side in ("ref_chosen", "ref_rejected")
        ]
        if objective.uses_reference
        else [None, None]
    )
    lengths = [
        torch.tensor([len(e.pair.chosen) for e in examples]),
        torch.tensor([len(e.pair.rejected) for e in examples]),
    ]
    return preference_loss(torch.from_numpy(chosen), torch.from_numpy(rejected), objective, *references, *lengths)


def validation_metrics(out: PreferenceLoss, objective: PreferenceObjective) -> dict[str, float]:
    metrics = preference_metrics(out, objective, "val", torch.mean) | {"val/loss": out.losses.mean()}
    return {name: float(value) for name, value in metrics.items()}


def examples_with_reference(
    reference: torch.nn.Module | None,
    reference_name: str,
    train_pairs: list[PairExample],
    eval_pairs: list[PairExample],
    pad_id: int,
    cfg: DPOConfig,
    run_dir: Path,
) -> tuple[list[DPOExample], list[DPOExample]]:
    """Training and validation pairs with their cached reference log-probabilities; without a
    reference (SimPO), the pairs alone: no reference forward pass runs and no cache is written."""
    if reference is None:
        return without_reference(train_pairs), without_reference(eval_pairs)
    return (
        visited_with_reference(reference, reference_name, train_pairs, pad_id, cfg, run_dir / REFERENCE_CACHE),
        reference_logprobs(
            reference, reference_name, eval_pairs, pad_id, cfg, run_dir / f"validation_{REFERENCE_CACHE}"
        ),
    )


def objective_note(objective: PreferenceObjective, reference_name: str) -> str:
    weights = ", ".join(
        f"{name} {value}" for name, value in objective._asdict().items() if name != "loss_type" and value
    )
    reference = f"reference policy: {reference_name}" if objective.uses_reference else "no reference policy"
    return f"loss: {objective.loss_type} ({weights}); {reference}"


def dpo_record(objective: PreferenceObjective, reference_name: str) -> dict[str, Any]:
    """What `rm-eval` needs to score the saved policy's implicit reward: the loss, its weights and the reference."""
    if not objective.uses_reference:
        return objective._asdict()
    reference_path = Path(reference_name).resolve() if Path(reference_name).is_dir() else reference_name
    return objective._asdict() | {"reference_model": str(reference_path)}


def sample_comparison(policy, reference, tokenizer, pairs: list[PairExample], cfg: DPOConfig) -> list[dict[str, Any]]:
    """Greedy responses of the reference and the DPO policy to validation prompts, with their lengths
    (DPO is known to lengthen responses: the first thing to look at)."""
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=0.0, seed=cfg.seed)
    queries = [p.query.ids for p in pairs]
    before = generate_texts(reference, tokenizer, queries, params, cfg.forward_batch_size, desc="sampling (reference)")
    after = generate_texts(policy, tokenizer, queries, params, cfg.forward_batch_size, desc="sampling (DPO policy)")
    return [
        {
            "prompt": reward_metrics.prompt_text(p.record),
            "human_chosen": p.record.chosen,
            "reference": b["text"],
            "dpo": a["text"],
            "reference_tokens": b["tokens"],
            "dpo_tokens": a["tokens"],
            "reference_has_eos": b["has_eos"],
            "dpo_has_eos": a["has_eos"],
        }
        for p, b, a in zip(pairs, before, after, strict=True)
    ]


def checkpoint_label(checkpoint: Path) -> str:
    """ "step N" of the checkpoint a run resumed from, as the line of a stopped run names it."""
    return f"step {json.loads((checkpoint / 'trainer.json').read_text())['step']}"


def run(cfg: DPOConfig) -> int:
    cfg, run_dir, checkpoint = start_run(cfg, "dpo")
    train_records, val_records, notes = split_comparisons(cfg.pair_selection)
    pairs_format = resolved_format(PAIRS, cfg.data_format, cfg.data, cfg.hf_split, cfg.fields)
    reference_name = cfg.reference_model or cfg.model
    objective = preference_objective(cfg)
    device = default_device()
    policy, tokenizer = trained_policy(cfg.model_source, cfg.lora, checkpoint)
    shared = shares_queries(policy, cfg.shared_prefix)
    record_settings(
        run_dir,
        {
            "data_format": pairs_format,
            "attention": {"policy": attention_implementation(policy)},
            "shared_prefix": {"policy": "on" if shared else "off"},
        },
    )
    reference = frozen_policy(cfg, policy, reference_name, device) if objective.uses_reference else None
    # long responses are cut as TRL's DPOTrainer cuts them, where their format allows (data/examples.py)
    train_pairs, train_note = prepare_training_pairs(cfg.lengths, tokenizer, train_records, cut_long=True)
    val_pairs, val_note = prepare_pairs(cfg.lengths, tokenizer, val_records, cut_long=True)
    notes += [
        f"train tokenization: {train_note}",
        f"validation tokenization: {val_note}",
        objective_note(objective, reference_name),
    ]
    print("\n".join(notes))
    pad_id = tokenizer.pad_token_id
    eval_pairs = val_pairs[: cfg.eval_pairs] if cfg.eval_pairs else val_pairs
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    # a signal ends the reference pass at once: its cache is written whole or not at all, and a restart redoes it
    continuing = (
        (checkpoint_label(checkpoint), resume_command("dpo", run_dir, processes))
        if checkpoint
        else (None, restart_command("dpo", run_dir, processes))
    )
    with stopping_at_once(run_dir, *continuing):
        train_examples, eval_examples = examples_with_reference(
            reference, reference_name, train_pairs, eval_pairs, pad_id, cfg, run_dir
        )

    def evaluate(current: torch.nn.Module, step: int) -> dict[str, float]:
        if not eval_examples:
            return {}
        return validation_metrics(held_out_loss(current, eval_examples, pad_id, cfg, objective), objective)

    stage = SupervisedStage(
        "dpo",
        policy.to(device),
        tokenizer,
        train_examples,
        lambda b: collate_dpo(b, pad_id, shared),
        make_dpo_loss(objective),
        evaluate,
        length=lambda example: example.pair.packed_width() if shared else example.width(),
    )
    # its log-probabilities are cached: off the device while the sharded policy trains
    if reference is not None and cfg.sharding_options.splits_models(processes):
        reference.to("cpu")
    result = train(cfg, stage, run_dir, checkpoint)
    if not is_main_process():
        return 0
    # the final checkpoint is written: a signal ends the evaluation at once, and resuming runs it again
    with stopping_at_once(run_dir, f"step {result['steps']}", resume_command("dpo", run_dir, processes)):
        if reference is not None:
            reference.to(device)
        final = result["model"]
        save_final_model(final, tokenizer, run_dir)
        (run_dir / "model" / DPO_RECORD).write_text(json.dumps(dpo_record(objective, reference_name), indent=2))
        evaluation: dict[str, Any] = {}
        extra: list[Table] = []
        if val_pairs:
            implicit = ImplicitRewardModel(final, reference, objective)
            evaluation = evaluate_reward_model(
                implicit,
                tokenizer,
                val_pairs,
                run_dir / "rm_eval",
                batch_size=cfg.forward_batch_size,
                probes=builtin_probes_for(val_records, "builtin"),
                limits=query_limits(cfg.max_query_length, cfg.max_article_query_length),
            )
            print(reward_report.headline(evaluation))
            samples = []
            # SimPO trained without a reference: the starting policy to compare with is loaded only now
            if cfg.eval_samples:
                starting = reference if reference is not None else frozen_policy(cfg, final, reference_name, device)
                samples = sample_comparison(final, starting, tokenizer, val_pairs[: cfg.eval_samples], cfg)
            write_jsonl(run_dir / "eval_samples.jsonl", samples)
            if samples:
                lengths = {who: float(np.mean([s[f"{who}_tokens"] for s in samples])) for who in ("reference", "dpo")}
                extra.append(
                    Table(
                        f"Greedy responses to {len(samples)} validation prompts (mean tokens: reference "
                        f"{lengths['reference']:.1f}, DPO {lengths['dpo']:.1f})",
                        samples[:10],
                        ["prompt", "human_chosen", "reference", "dpo", "reference_tokens", "dpo_tokens"],
                    )
                )
        plot_training_curves(read_metrics(run_dir), run_dir / "plots")
        write_rm_report(
            run_dir,
            "dpo",
            cfg.model,
            cfg.total_batch_size,
            notes,
            evaluation,
            run_dir / "rm_eval",
            f"{LOSS_NAMES[objective.loss_type]} (implicit reward)",
            extra,
        )
    print(f"model: {run_dir / 'model'}\nreport: {run_dir / 'report.html'}")
    return 0
