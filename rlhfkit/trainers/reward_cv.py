"""Post-disjoint K-fold cross-validation of a reward model (`rlhfkit rm cross_validation_folds=K`).

A held-out tenth of the TL;DR comparisons is 180 pairs: a 95% interval of about +-0.07 on accuracy,
too wide to tell a reward model from the always-prefer-longer rule when both sit near 0.65.
Cross-validation scores every training pair once, each with a model that never saw its prompt, so the
intervals are computed over all of them. The fold models are trained exactly as the final model is
(same config, same starting weights, length balancing inside their own training pairs only), scored on
their fold, and discarded; the final model is then trained on every training pair as usual.

A fold that finished leaves `cross_validation/fold-K.json` (its pairs' indices and scores), so running
the same command again in the same folder after an interruption trains only the folds that did not.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import write_json_atomic
from ..config import RMConfig
from ..data.examples import PairExample, length_balanced_indices, response_length_columns
from ..data.split import prompt_folds
from ..errors import ConfigError
from ..report.report import Table
from ..reward_eval import report as reward_report
from ..reward_eval.evaluate import evaluate_rewards
from ..reward_models import ScalarModel
from .supervised import SupervisedStage, train

# (fresh model, indices of its training pairs) -> the stage that trains it
StageFactory = Callable[[ScalarModel, list[int]], SupervisedStage]
PairScorer = Callable[
    [ScalarModel, list[PairExample], str], tuple[np.ndarray, np.ndarray]
]  # (model, pairs, bar) -> (chosen, rejected)


def rerun_command(run_dir: Path) -> str:
    """The command line that continues an interrupted cross-validation: the same one, into the same folder."""
    return shlex.join(["rlhfkit", *sys.argv[1:], f"output_dir={run_dir}"])


# options that change neither a fold model nor its scores: a fold file written under other values still holds
OUTSIDE_THE_FOLDS = {
    "output_dir",
    "resume",
    "overwrite",
    "report_to",
    "save_every",
    "eval_every",
    "eval_pairs",
    "keep_checkpoints",
    "log_every",
    "sft_data",
    "normalization_samples",
}


def fold_recipe(cfg: RMConfig) -> dict[str, Any]:
    """The options a fold file was trained under, compared when the file is read back."""
    return json.loads(
        json.dumps({k: v for k, v in dataclasses.asdict(cfg).items() if k not in OUTSIDE_THE_FOLDS}, default=str)
    )


def read_fold(path: Path) -> dict[str, Any] | None:
    """A finished fold's file, or None when there is none or it cannot be read (then the fold is retrained)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fold_training_indices(cfg: RMConfig, examples: list[PairExample], indices: list[int]) -> list[int]:
    if not cfg.length_balance:
        return indices
    kept, _ = length_balanced_indices([examples[i] for i in indices], cfg.seed)
    return [indices[j] for j in kept]


def train_fold(
    cfg: RMConfig,
    initial: ScalarModel,
    make_stage: StageFactory,
    score: PairScorer,
    examples: list[PairExample],
    train_idx: list[int],
    held_idx: list[int],
    fold_dir: Path,
) -> dict[str, Any]:
    """Train one fold's model from a copy of the starting weights; its scores of the held-out pairs."""
    fold_cfg = dataclasses.replace(cfg, save_every=0, eval_every=0, keep_checkpoints=1)
    fold_dir.mkdir(parents=True, exist_ok=True)
    result = train(
        fold_cfg, make_stage(copy.deepcopy(initial), train_idx), fold_dir, resume=rerun_command(fold_dir.parents[1])
    )
    chosen, rejected = score(result["model"], [examples[i] for i in held_idx], f"scoring {fold_dir.name}")
    shutil.rmtree(fold_dir / "checkpoints", ignore_errors=True)  # a fold model is a measurement, not a product
    return {
        "indices": held_idx,
        "chosen": chosen.tolist(),
        "rejected": rejected.tolist(),
        "trained_pairs": len(train_idx),
        "recipe": fold_recipe(cfg),
    }


def out_of_fold_scores(
    cfg: RMConfig,
    initial: ScalarModel,
    make_stage: StageFactory,
    score: PairScorer,
    examples: list[PairExample],
    out: Path,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(chosen, rejected) scores of every example from the fold model that did not train on it, and notes."""
    folds = prompt_folds([e.record.prompt_id for e in examples], cfg.cross_validation_folds, cfg.seed)
    chosen, rejected = np.full(len(examples), np.nan), np.full(len(examples), np.nan)
    notes = []
    for k in range(cfg.cross_validation_folds):
        held = [i for i, f in enumerate(folds) if f == k]
        saved = out / f"fold-{k}.json"
        fold = read_fold(saved)
        if fold is not None and fold.get("recipe") == fold_recipe(cfg):
            notes.append(f"fold {k}: scores read from {saved} (finished earlier)")
        else:
            if fold is not None:
                notes.append(f"fold {k}: {saved} was trained with other options; retrained")
            train_idx = fold_training_indices(cfg, examples, [i for i, f in enumerate(folds) if f != k])
            fold = train_fold(cfg, initial, make_stage, score, examples, train_idx, held, out / f"fold-{k}")
            write_json_atomic(saved, fold)
        if fold["indices"] != held:
            raise ConfigError(
                f"{saved} holds other pairs than fold {k} of this data: delete {out} to cross-validate again"
            )
        chosen[held], rejected[held] = fold["chosen"], fold["rejected"]
        notes.append(f"fold {k}: trained on {fold['trained_pairs']} pairs, scored {len(held)} held-out pairs")
    return chosen, rejected, notes


def cross_validate(
    cfg: RMConfig,
    initial: ScalarModel,
    make_stage: StageFactory,
    score: PairScorer,
    examples: list[PairExample],
    run_dir: Path,
) -> dict[str, Any]:
    """Cross-validate, write `cross_validation/rm_eval.json` and its plots (the `rm-eval` files), print
    the headline; the evaluation."""
    out = run_dir / "cross_validation"
    out.mkdir(parents=True, exist_ok=True)
    chosen, rejected, notes = out_of_fold_scores(cfg, initial, make_stage, score, examples, out)
    lengths_c, lengths_r = (np.array(column) for column in response_length_columns(examples))
    result = evaluate_rewards(
        [e.record for e in examples], chosen, rejected, lengths_c, lengths_r, "tokens", seed=cfg.seed
    )
    result["protocol"] = (
        f"post-disjoint {cfg.cross_validation_folds}-fold cross-validation: every pair scored by a model "
        "trained without its prompt"
    )
    result["folds"] = notes
    reward_report.write_rm_eval(out, result, chosen, rejected, lengths_c, lengths_r)
    print(
        f"cross-validation ({cfg.cross_validation_folds} folds of prompts, {len(examples)} "
        f"pairs):\n{reward_report.headline(result)}"
    )
    return result


def cross_validation_tables(run_dir: Path) -> list[Table]:
    """The report's cross-validation table, when the run cross-validated (in this process or an earlier one)."""
    path = run_dir / "cross_validation" / "rm_eval.json"
    if not path.is_file():
        return []
    result = json.loads(path.read_text())
    cells = reward_report.accuracy_cells(result["breakdown"]["overall"]) | {"protocol": result["protocol"]}
    rows = [{"metric": k, "value": v} for k, v in cells.items()] + [
        {"metric": f"fold {i}", "value": fold} for i, fold in enumerate(result["folds"])
    ]
    return [
        Table(
            "Cross-validation (every training pair, scored by a fold model that never saw its prompt)",
            rows,
            ["metric", "value"],
        )
    ]
