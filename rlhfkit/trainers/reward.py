"""`rlhfkit rm`: reward-model training (Section 6, Details 10-15, Table 4).

The reward model is the SFT backbone plus a scalar head (Details 10-11); the reward is read at
the EOS token (Detail 12, `rlhfkit.scoring`); the loss is -log sigmoid(r_chosen - r_rejected); after
training the head bias is set so the SFT reference summaries score 0 on average (Detail 15). The
final model is evaluated by the reward-model evaluation library `rlhfkit rm-eval` runs (`rlhfkit.reward_eval.evaluate`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import ops
from ..adapters import add_adapter, is_adapted, save_final_model, trainable_summary
from ..config import RMConfig
from ..data import AUTO, PAIRS, load_sft_data, resolved_format, usable
from ..data.examples import (
    PairExample,
    length_balanced_indices,
    prepare_pairs,
    prepare_training_pairs,
    query_limits,
    tokenize_sft,
)
from ..data.split import split_comparisons
from ..errors import ConfigError
from ..models import load_policy
from ..plots import plot_training_curves
from ..reward_eval import metrics as reward_metrics
from ..reward_eval import report as reward_report
from ..reward_eval.evaluate import builtin_probes_for, evaluate_reward_model, write_rm_report
from ..reward_features import FeatureCache, collate_features
from ..reward_models import ScalarModel, freeze_below_top_layers, load_reward_model
from ..scoring import collate_packed_pairs, pair_scores, score_pairs, score_texts
from ..tracking import read_metrics
from .reward_cv import cross_validate, cross_validation_tables
from .run import attention_implementation, autocast_precision, is_main_process, record_settings, start_run
from .supervised import SupervisedStage, train


def pair_metrics(margin: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "train/accuracy": (margin > 0).float().sum(),
        "train/chosen_reward": chosen.detach().sum(),
        "train/rejected_reward": rejected.detach().sum(),
        "train/margin": margin.detach().sum(),
    }


def make_pair_loss(length_weight: float = 1.0, orthogonality_weight: float = 1.0):
    """Sum over pairs of -log sigmoid(r_chosen - r_rejected), with accuracy and reward sums alongside.

    With an ODIN length head the pair loss reads quality + length, plus, per pair, length_weight x
    (|corr(quality, length)| - corr(length head, length)) and orthogonality_weight x |W_Q . W_L|; the
    accuracy and rewards logged are the quality head's, the reward RL uses."""

    def pair_loss_fn(
        model: ScalarModel, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores = pair_scores(model, batch)
        chosen, rejected = scores["chosen"], scores["rejected"]
        margin = chosen - rejected
        extras = pair_metrics(margin, chosen, rejected)
        if "chosen_length" not in scores:
            return -F.logsigmoid(margin).sum(), extras
        total_margin = margin + scores["chosen_length"] - scores["rejected_length"]
        quality = torch.cat([chosen, rejected])
        length_scores = torch.cat([scores["chosen_length"], scores["rejected_length"]])
        lengths = torch.cat([batch["chosen_lengths"], batch["rejected_lengths"]]).float()
        decorrelation = ops.disentangled_length_loss(quality, length_scores, lengths).float()
        pairs = margin.numel()
        extras |= {
            "train/odin_accuracy": (total_margin > 0).float().sum(),
            "train/quality_length_corr": pairs * ops.pearson(quality.detach(), lengths).float(),
            "train/length_head_corr": pairs * ops.pearson(length_scores.detach(), lengths).float(),
            "train/head_overlap": pairs * scores["orthogonality"].detach(),
        }
        regulariser = length_weight * decorrelation + orthogonality_weight * scores["orthogonality"]
        return -F.logsigmoid(total_margin).sum() + pairs * regulariser, extras

    return pair_loss_fn


@torch.no_grad()
def normalize_to_references(model: ScalarModel, tokenizer, sft_data: list[str], cfg: RMConfig) -> dict[str, float]:
    """Detail 15: shift the head bias so the SFT reference summaries (any SFT data format) average a reward of 0."""
    records, log = usable(
        load_sft_data(AUTO, sft_data, "train", cfg.fields),
        sft_data,
        "reference summaries",
        "sft_data (SFT data, its format detected)",
    )
    examples, _ = tokenize_sft(
        records[: cfg.normalization_samples], tokenizer, cfg.max_query_length, cfg.max_response_length
    )
    rewards = score_texts(
        model,
        tokenizer.pad_token_id,
        [e.query.ids for e in examples],
        [e.response for e in examples],
        cfg.micro_batch_size * 2,
        "normalising (Detail 15)",
    )
    before = float(rewards.mean())
    model.output_bias.data -= before
    return {"reference_mean_before": before, "references": len(examples), "bias": float(model.output_bias.item())}


def load_trained_reward_model(cfg: RMConfig, checkpoint: Path | None) -> tuple[ScalarModel, Any]:
    """The reward model to train (Detail 10: from the SFT policy's backbone, a fresh head), or the
    checkpoint's when resuming; with LoRA the backbone is always rebuilt from `model=` and the
    adapter and heads read from the checkpoint."""
    if checkpoint and not cfg.lora.enabled:
        model, tokenizer = load_reward_model(checkpoint / "model", cfg.trust_remote_code)
        return model.train(), tokenizer
    if cfg.lora.enabled and cfg.trainable_layers >= 0:
        raise ConfigError(
            f"lora_rank={cfg.lora_rank} with trainable_layers={cfg.trainable_layers}: choose one way to "
            "limit training (set trainable_layers=-1 with LoRA, or lora_rank=0)"
        )
    policy, tokenizer = load_policy(cfg.model, cfg.trust_remote_code, allow_pickle=cfg.allow_pickle)
    model = ScalarModel.from_policy(policy, cfg.head, cfg.length_head)
    if cfg.lora.enabled:
        model = add_adapter(model, cfg.lora, checkpoint / "model" if checkpoint else None)
    return model, tokenizer


def configure_model(model: ScalarModel, cfg: RMConfig) -> str:
    """Freeze the backbone below the top `trainable_layers` blocks; a note for the run log."""
    if is_adapted(model):
        return f"LoRA rank {cfg.lora_rank} on the backbone, heads fully trained: {trainable_summary(model)}"
    if cfg.trainable_layers < 0:
        return f"training every parameter ({sum(p.numel() for p in model.parameters()):,})"
    trainable = freeze_below_top_layers(model, cfg.trainable_layers)
    return f"training the top {cfg.trainable_layers} blocks and the heads: {trainable:,} parameters"


def frozen_features(cfg: RMConfig, model: ScalarModel, run_dir: Path) -> FeatureCache | None:
    """With the whole backbone frozen (trainable_layers=0), its features of every pair, read once."""
    if cfg.trainable_layers != 0:
        return None
    path = Path(cfg.feature_cache) if cfg.feature_cache else run_dir / "features.pt"
    return FeatureCache(model, autocast_precision(cfg), path)


def run(cfg: RMConfig) -> int:
    cfg, run_dir, checkpoint = start_run(cfg, "rm")
    train_records, val_records, notes = split_comparisons(cfg.pair_selection)
    pairs_format = resolved_format(PAIRS, cfg.data_format, cfg.data, cfg.hf_split, cfg.fields)
    model, tokenizer = load_trained_reward_model(cfg, checkpoint)
    record_settings(run_dir, {"data_format": pairs_format, "attention": {"reward": attention_implementation(model)}})
    notes.append(configure_model(model, cfg))
    all_train_examples, train_note = prepare_training_pairs(cfg.lengths, tokenizer, train_records)
    val_examples, val_note = prepare_pairs(cfg.lengths, tokenizer, val_records)
    notes += [f"train tokenization: {train_note}", f"validation tokenization: {val_note}"]
    train_idx = list(range(len(all_train_examples)))
    if cfg.length_balance:
        train_idx, balance_note = length_balanced_indices(all_train_examples, cfg.seed)
        notes.append(balance_note)
    print("\n".join(notes))
    eval_examples = val_examples[: cfg.eval_pairs] if cfg.eval_pairs else val_examples
    features = frozen_features(cfg, model, run_dir)
    pad_id = tokenizer.pad_token_id
    # the items the heads train on: the pairs themselves, or their cached backbone features
    items = (
        features.features(model, pad_id, all_train_examples, cfg.micro_batch_size)
        if features is not None
        else all_train_examples
    )

    def score(current: ScalarModel, examples: list[PairExample], desc: str) -> tuple[np.ndarray, np.ndarray]:
        return score_pairs(current, pad_id, examples, cfg.micro_batch_size, desc, features)

    def evaluate(current: ScalarModel, step: int) -> dict[str, float]:
        if not eval_examples:
            return {}
        c, r = score(current, eval_examples, "validating")
        return {
            "val/accuracy": reward_metrics.pairwise_accuracy(c, r),
            "val/loss": reward_metrics.pairwise_loss(c, r),
            "val/margin": float((c - r).mean()),
        }

    def make_stage(current: ScalarModel, indices: list[int], validate=None) -> SupervisedStage:
        loss = make_pair_loss(cfg.length_head_weight, cfg.orthogonality_weight)
        picked = [items[i] for i in indices]
        if features is not None:
            return SupervisedStage("rm", current, tokenizer, picked, collate_features, loss, validate)
        return SupervisedStage(
            "rm",
            current,
            tokenizer,
            picked,
            lambda b: collate_packed_pairs(b, pad_id),
            loss,
            validate,
            length=lambda e: e.packed_width(),
        )

    # a checkpoint means the final model's training had begun: CV was done
    if cfg.cross_validation_folds and not checkpoint:
        cross_validate(cfg, model, make_stage, score, all_train_examples, run_dir)
    result = train(cfg, make_stage(model, train_idx, evaluate), run_dir, checkpoint)
    if not is_main_process():
        return 0
    final: ScalarModel = result["model"]
    normalization = (
        normalize_to_references(final, tokenizer, cfg.sft_data, cfg)
        if cfg.sft_data
        else {"skipped": "no sft_data given"}
    )
    notes.append(f"reward normalisation (Detail 15): {normalization}")
    save_final_model(final, tokenizer, run_dir)
    (run_dir / "normalization.json").write_text(json.dumps(normalization, indent=2))
    limits = query_limits(cfg.max_query_length, cfg.max_article_query_length)
    evaluation: dict[str, Any] = {}
    if val_examples:
        evaluation = evaluate_reward_model(
            final,
            tokenizer,
            val_examples,
            run_dir / "rm_eval",
            batch_size=cfg.micro_batch_size,
            probes=builtin_probes_for(val_records, "builtin"),
            limits=limits,
            seed=cfg.seed,
            features=features,
        )
        print(reward_report.headline(evaluation))
    else:
        notes.append("no validation pairs (validation_fraction=0): evaluate with `rlhfkit rm-eval`")
    plot_training_curves(read_metrics(run_dir), run_dir / "plots")
    write_rm_report(
        run_dir,
        "rm",
        cfg.model,
        cfg.total_batch_size,
        notes,
        evaluation,
        run_dir / "rm_eval",
        extra=cross_validation_tables(run_dir),
    )
    print(f"model: {run_dir / 'model'}\nreport: {run_dir / 'report.html'}")
    return 0
