"""`rlhfkit rm` and `rlhfkit rm-eval`: reward-model training and evaluation (Section 6, Details 10-18, Table 4).

The reward model is the SFT backbone plus a scalar head (Details 10-11); the reward is read at
the EOS token (Detail 12); the loss is -log sigmoid(r_chosen - r_rejected); after training the
head bias is set so the SFT reference summaries score 0 on average (Detail 15).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import ops
from ..config import ConfigError, PairConfig, RMConfig, RMEvalConfig
from ..data import load_pairs, load_sft
from ..data.collate import pack_pairs, right_pad_query_response
from ..data.examples import (
    PairExample,
    length_balanced_indices,
    query_limits,
    response_length_columns,
    tokenize_pairs,
    tokenize_sft,
)
from ..data.split import split_by_prompt
from ..data.tldr import Comparison
from ..devices import evaluation_mode
from ..eval import plots, rm_metrics, rm_report
from ..eval.probes import DEFAULT_PROBES, load_probes, probe_items, probe_table
from ..eval.report import image_html, table_html, write_report
from ..models import (
    DPO_RECORD,
    SCALAR_CONFIG,
    ScalarModel,
    freeze_below_top_layers,
    load_implicit_reward_model,
    load_policy,
    load_reward_model,
)
from ..tracking import read_metrics
from .engine import Stage, autocast_precision, is_main_process, save_final_model, start_run, train
from .reward_cv import cross_validate
from .reward_features import FeatureCache, collate_features


def filter_comparisons(records: list[Comparison], splits: list[str], batches: list[str]) -> list[Comparison]:
    return [r for r in records if (not splits or r.split in splits) and (not batches or r.batch in batches)]


def collate_scored(queries: list[list[int]], responses: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded query+response rows (Detail 5) with a mask of the response tokens."""
    batch = right_pad_query_response(queries, responses, pad_id)
    batch.pop("labels")
    return batch


def collate_pairs(examples: list[PairExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Chosen rows first, then rejected rows, in one right-padded batch of 2B rows (DPO's layout)."""
    queries = [e.query.ids for e in examples] * 2
    responses = [e.chosen for e in examples] + [e.rejected for e in examples]
    batch = collate_scored(queries, responses, pad_id)
    batch["loss_units"] = torch.ones(len(examples), dtype=torch.long)
    return batch


def response_lengths(examples: list[PairExample]) -> dict[str, torch.Tensor]:
    """`PairExample.response_lengths` of a batch, as the `chosen_lengths` and `rejected_lengths` tensors."""
    chosen, rejected = response_length_columns(examples)
    return {"chosen_lengths": torch.tensor(chosen, dtype=torch.long), "rejected_lengths": torch.tensor(rejected, dtype=torch.long)}


def collate_packed_pairs(examples: list[PairExample], pad_id: int) -> dict[str, torch.Tensor]:
    """One packed row per pair (`collate.pack_pairs`): the query is read once for both responses."""
    batch = pack_pairs([e.query.ids for e in examples], [e.chosen for e in examples], [e.rejected for e in examples], pad_id)
    return batch | response_lengths(examples) | {"loss_units": torch.ones(len(examples), dtype=torch.long)}


MODEL_INPUTS = ("input_ids", "attention_mask", "pair_mask", "position_ids", "chosen_mask", "rejected_mask",
                "chosen_features", "rejected_features")


def pair_scores(model: ScalarModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})


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

    def pair_loss_fn(model: ScalarModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


pairwise_loss_fn = make_pair_loss()


@torch.no_grad()
def score_texts(model: ScalarModel, pad_id: int, queries: list[list[int]], responses: list[list[int]], batch_size: int, desc: str) -> np.ndarray:
    """Rewards of query+response rows, in input order (batched longest-first to pad less)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(queries)), key=lambda i: -(len(queries[i]) + len(responses[i])))
    out = np.zeros(len(queries), dtype=np.float64)
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=len(order) <= batch_size):
        idx = order[start : start + batch_size]
        batch = collate_scored([queries[i] for i in idx], [responses[i] for i in idx], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        out[idx] = model(batch["input_ids"], batch["attention_mask"], batch["response_mask"]).cpu().numpy()
    model.train(was_training)
    return out


@torch.no_grad()
def score_pairs(model: ScalarModel, pad_id: int, examples: list[PairExample], batch_size: int, desc: str = "scoring",
                features: FeatureCache | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) rewards in input order."""
    scores = score_pair_heads(model, pad_id, examples, batch_size, desc, features)
    return scores["chosen"], scores["rejected"]


@torch.no_grad()
def score_pair_heads(model: ScalarModel, pad_id: int, examples: list[PairExample], batch_size: int, desc: str = "scoring",
                     features: FeatureCache | None = None) -> dict[str, np.ndarray]:
    """Every head's scores of the chosen and rejected responses, in input order: `chosen`, `rejected`
    and, for an ODIN model, `chosen_length`, `rejected_length`. A packed row per pair, batched longest
    first; with a feature cache of the model's frozen backbone the heads read the cached features."""
    items = features.features(model, pad_id, examples, batch_size) if features is not None else examples
    if features is not None:
        collate, width = collate_features, (lambda item: item.width())
    elif isinstance(model, ScalarModel):
        collate, width = (lambda b: collate_packed_pairs(b, pad_id)), (lambda item: item.packed_width())
    else:  # DPO's implicit reward (Detail 19) reads next-token predictions, which a packed row would shift: a row per response
        collate, width = (lambda b: collate_pairs(b, pad_id)), (lambda item: item.width())
    order = sorted(range(len(items)), key=lambda i: -width(items[i]))
    device = next(model.parameters()).device
    out: dict[str, np.ndarray] = {}
    with evaluation_mode(model):
        for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=len(order) <= batch_size):
            rows = order[start : start + batch_size]
            scores = head_scores(model, {k: v.to(device) for k, v in collate([items[i] for i in rows]).items()})
            for name, values in scores.items():
                out.setdefault(name, np.zeros(len(items)))[rows] = values.float().cpu().numpy()
    return out


def head_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if "pair_mask" in batch or "chosen_features" in batch:
        return {k: v for k, v in pair_scores(model, batch).items() if v.dim() == 1}
    chosen, rejected = model(batch["input_ids"], batch["attention_mask"], batch["response_mask"]).chunk(2)
    return {"chosen": chosen, "rejected": rejected}


@torch.no_grad()
def normalize_to_references(model: ScalarModel, tokenizer, sft_data: list[str], cfg: RMConfig) -> dict[str, float]:
    """Detail 15: shift the head bias so the SFT reference summaries average a reward of 0."""
    records, log = load_sft(sft_data, hf_split="train")
    examples, _ = tokenize_sft(records[: cfg.normalization_samples], tokenizer, cfg.max_query_length, cfg.max_response_length)
    rewards = score_texts(model, tokenizer.pad_token_id, [e.query.ids for e in examples], [e.response for e in examples],
                          cfg.micro_batch_size * 2, "normalising (Detail 15)")
    before = float(rewards.mean())
    model.output_bias.data -= before
    return {"reference_mean_before": before, "references": len(examples), "bias": float(model.output_bias.item())}


def dump_reward_logits(model: ScalarModel, tokenizer, examples: list[PairExample], out: Path) -> list[dict[str, Any]]:
    """Detail 13: the head's output at every response position; only the EOS one is a valid reward."""
    dumps = []
    for e in examples:
        batch = collate_scored([e.query.ids], [e.chosen], tokenizer.pad_token_id)
        device = next(model.parameters()).device
        with torch.no_grad():
            scores = model.per_token_scores(batch["input_ids"].to(device), batch["attention_mask"].to(device))[0].cpu()
        start = len(e.query.ids)
        tokens = [tokenizer.decode([t]) for t in e.chosen]  # readable text, not byte-level pieces
        dumps.append({"tokens": tokens, "scores": scores[start : start + len(e.chosen)].tolist(), "eos_index": len(e.chosen) - 1})
    (out / "reward_logits.json").write_text(json.dumps(dumps, indent=2))
    if dumps:
        plot_reward_logits(dumps[0], out / "reward_logits.png")
    return dumps


def plot_reward_logits(dump: dict[str, Any], path: Path) -> None:
    fig, ax = plots.pyplot().subplots(figsize=(max(6, 0.25 * len(dump["tokens"])), 3.5))
    colors = ["tab:red" if i == dump["eos_index"] else "tab:gray" for i in range(len(dump["tokens"]))]
    ax.bar(range(len(dump["scores"])), dump["scores"], color=colors)
    ax.set_xticks(range(len(dump["tokens"])), dump["tokens"], rotation=90, fontsize=7)
    ax.set(title="Reward logits per response token (red: EOS, the only valid reward; Detail 13)", ylabel="head output")
    plots.save(fig, path)


def score_probes(model: ScalarModel, tokenizer, probes_path: str, limits: dict[str, int]) -> list[dict[str, Any]]:
    from ..data.formats import encode_completion, encode_query

    if not probes_path:
        return []
    probes = load_probes(DEFAULT_PROBES if probes_path == "builtin" else probes_path)
    items = probe_items(probes)
    queries = [encode_query(tokenizer, it["task"], it["fields"], limits[it["task"]]).ids for it in items]
    responses = [encode_completion(tokenizer, it["text"]) for it in items]
    scores = score_texts(model, tokenizer.pad_token_id, queries, responses, 8, "probes")
    return probe_table(probes, scores.tolist())


def builtin_probes_for(data_format: str, probes: str) -> str:
    """The shipped probes are TL;DR posts: they say nothing about an HH reward model."""
    return "" if probes == "builtin" and data_format != "tldr-comparisons" else probes


def evaluate_reward_model(
    model: ScalarModel, tokenizer, examples: list[PairExample], out: Path, *, batch_size: int, probes: str,
    limits: dict[str, int], errors: int = 20, bins: int = 10, dump: int = 1, length_penalty: float = 0.0, seed: int = 0,
    features: FeatureCache | None = None,
) -> dict[str, Any]:
    """Everything `rm_eval.json` holds, plus plots, confident errors, probes and Detail 13 dumps. With
    `length_penalty` alpha every reward is score - alpha x response tokens, as PPO would see it."""
    out.mkdir(parents=True, exist_ok=True)
    heads = score_pair_heads(model, tokenizer.pad_token_id, examples, batch_size, features=features)
    chosen, rejected = heads["chosen"], heads["rejected"]
    lengths = response_lengths(examples)
    lengths_c, lengths_r = lengths["chosen_lengths"].numpy(), lengths["rejected_lengths"].numpy()
    if length_penalty:
        chosen = ops.length_penalised_scores(torch.from_numpy(chosen), lengths["chosen_lengths"], length_penalty).numpy()
        rejected = ops.length_penalised_scores(torch.from_numpy(rejected), lengths["rejected_lengths"], length_penalty).numpy()
    comparisons = [e.record for e in examples]
    result = rm_metrics.evaluate_rewards(comparisons, chosen, rejected, lengths_c, lengths_r, "tokens", bins, errors, seed=seed)
    result["length_penalty"] = length_penalty
    if "chosen_length" in heads:  # ODIN: is the pair still modelled once both heads are summed?
        both = heads["chosen"] + heads["chosen_length"] > heads["rejected"] + heads["rejected_length"]
        result["odin_reward_plus_length_head"] = rm_metrics.accuracy_with_baseline(
            both.astype(float), rm_metrics.length_rule_hits(lengths_c, lengths_r), rm_metrics.chosen_shorter_mask(lengths_c, lengths_r), seed)
    probe_rows = score_probes(model, tokenizer, probes, limits)
    rm_report.write_rm_eval(out, result, chosen, rejected, lengths_c, lengths_r, probe_rows=probe_rows or None)
    if dump and model.head_type == "eos-linear":
        dump_reward_logits(model, tokenizer, examples[:dump], out)
    return result


def prepare_pairs(cfg, tokenizer, records: list[Comparison]) -> tuple[list[PairExample], str]:
    limits = query_limits(cfg.max_query_length, cfg.max_article_query_length)
    examples, log = tokenize_pairs(records, tokenizer, limits, cfg.max_response_length)
    return examples, log.summary("pairs")


def split_comparisons(cfg: PairConfig) -> tuple[list[Comparison], list[Comparison], list[str]]:
    """(training comparisons, validation comparisons, notes): filters, then the split by prompt that
    `rlhfkit rm-eval side=validation` repeats, then at most max_pairs training pairs."""
    records, load_log = load_pairs(cfg.data_format, cfg.data, cfg.hf_split)
    notes = [f"loaded: {load_log.summary('pairs')}"]
    if cfg.validation_splits:
        train_records, val_records, split_notes = split_by_upstream_split(cfg, filter_comparisons(records, [], cfg.batches))
        notes += split_notes
    else:
        records = filter_comparisons(records, cfg.splits, cfg.batches)
        if not records:
            raise ConfigError(f"no comparisons left after splits={cfg.splits} batches={cfg.batches}")
        train_records, val_records = split_by_prompt(records, lambda r: r.prompt_id, validation_fraction=cfg.validation_fraction, seed=cfg.seed)
        notes += [
            f"after split/batch filters: {len(records)} pairs",
            f"split by prompt: {len(train_records)} train pairs ({len({r.prompt_id for r in train_records})} prompts), "
            f"{len(val_records)} validation pairs ({len({r.prompt_id for r in val_records})} prompts), no prompt on both sides",
        ]
    if cfg.max_pairs and len(train_records) > cfg.max_pairs:
        train_records = train_records[: cfg.max_pairs]
        notes.append(f"training on the first {cfg.max_pairs} training pairs (max_pairs)")
    return train_records, val_records, notes


def split_by_upstream_split(cfg: PairConfig, records: list[Comparison]) -> tuple[list[Comparison], list[Comparison], list[str]]:
    """Split-disjoint protocol: validate on the upstream `validation_splits` (TL;DR valid1, whose
    summaries come from other policies than valid2's, Detail 6), train on `splits` (empty: every other
    split). Validation pairs whose prompt is also trained on are dropped and counted, so validation is
    prompt-disjoint as well."""
    validation = [r for r in records if r.split in cfg.validation_splits]
    train = [r for r in records if r.split not in cfg.validation_splits and (not cfg.splits or r.split in cfg.splits)]
    if not validation or not train:
        found = sorted({r.split or "(none)" for r in records})
        raise ConfigError(f"validation_splits={cfg.validation_splits} splits={cfg.splits} leave {len(train)} training and "
                          f"{len(validation)} validation pairs; the data has splits {found}")
    trained = {r.prompt_id for r in train}
    disjoint = [r for r in validation if r.prompt_id not in trained]
    notes = [f"split-disjoint: {len(train)} training pairs from splits {cfg.splits or 'other than ' + str(cfg.validation_splits)}, "
             f"{len(disjoint)} validation pairs from {cfg.validation_splits}; {len(validation) - len(disjoint)} validation pairs "
             "dropped because their prompt is also in training"]
    return train, disjoint, notes


def configure_model(model: ScalarModel, cfg: RMConfig) -> str:
    """Freeze the backbone below the top `trainable_layers` blocks; a note for the run log."""
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


def run(cfg: RMConfig, _parsed: Any = None) -> int:
    run_dir, checkpoint = start_run(cfg, "rm")
    train_records, val_records, notes = split_comparisons(cfg)
    if checkpoint:
        model, tokenizer = load_reward_model(checkpoint / "model", cfg.trust_remote_code)
        model.train()
    else:
        policy, tokenizer = load_policy(cfg.model, cfg.trust_remote_code, allow_pickle=cfg.allow_pickle)
        model = ScalarModel.from_policy(policy, cfg.head, cfg.length_head)
    notes.append(configure_model(model, cfg))
    all_train_examples, train_note = prepare_pairs(cfg, tokenizer, train_records)
    val_examples, val_note = prepare_pairs(cfg, tokenizer, val_records)
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
    items = features.features(model, pad_id, all_train_examples, cfg.micro_batch_size) if features is not None else all_train_examples

    def score(current: ScalarModel, examples: list[PairExample], desc: str) -> tuple[np.ndarray, np.ndarray]:
        return score_pairs(current, pad_id, examples, cfg.micro_batch_size, desc, features)

    def evaluate(current: ScalarModel, step: int) -> dict[str, float]:
        if not eval_examples:
            return {}
        c, r = score(current, eval_examples, "validating")
        return {"val/accuracy": rm_metrics.pairwise_accuracy(c, r), "val/loss": rm_metrics.pairwise_loss(c, r), "val/margin": float((c - r).mean())}

    def make_stage(current: ScalarModel, indices: list[int], validate=None) -> Stage:
        loss = make_pair_loss(cfg.length_head_weight, cfg.orthogonality_weight)
        picked = [items[i] for i in indices]
        if features is not None:
            return Stage("rm", current, tokenizer, picked, collate_features, loss, validate)
        return Stage("rm", current, tokenizer, picked, lambda b: collate_packed_pairs(b, pad_id), loss, validate, length=lambda e: e.packed_width())

    if cfg.cross_validation_folds and not checkpoint:  # a checkpoint means the final model's training had begun: CV was done
        cross_validate(cfg, model, make_stage, score, all_train_examples, run_dir)
    result = train(cfg, make_stage(model, train_idx, evaluate), run_dir, checkpoint)
    if not is_main_process():
        return 0
    final: ScalarModel = result["model"]
    normalization = normalize_to_references(final, tokenizer, cfg.sft_data, cfg) if cfg.sft_data else {"skipped": "no sft_data given"}
    notes.append(f"reward normalisation (Detail 15): {normalization}")
    save_final_model(final, tokenizer, run_dir)
    (run_dir / "normalization.json").write_text(json.dumps(normalization, indent=2))
    limits = query_limits(cfg.max_query_length, cfg.max_article_query_length)
    evaluation: dict[str, Any] = {}
    if val_examples:
        evaluation = evaluate_reward_model(final, tokenizer, val_examples, run_dir / "rm_eval", batch_size=cfg.micro_batch_size,
                                           probes=builtin_probes_for(cfg.data_format, "builtin"), limits=limits, seed=cfg.seed,
                                           features=features)
        print(rm_report.headline(evaluation))
    else:
        notes.append("no validation pairs (validation_fraction=0): evaluate with `rlhfkit rm-eval`")
    plots.plot_training_curves(read_metrics(run_dir), run_dir / "plots")
    write_rm_report(run_dir, notes, evaluation, run_dir / "rm_eval", extra_sections=cross_validation_sections(run_dir))
    print(f"model: {run_dir / 'model'}\nreport: {run_dir / 'report.html'}")
    return 0


def write_rm_report(run_dir: Path, notes: list[str], evaluation: dict[str, Any], eval_dir: Path, title: str = "Reward model",
                    extra_sections: list[tuple[str, str]] = ()) -> Path:
    cells: dict[str, Any] = {}
    if "breakdown" in evaluation:
        cells = rm_report.accuracy_cells(evaluation["breakdown"]["overall"])
        cells["intervals"] = rm_report.protocol_note(evaluation)
    overview = table_html([{"metric": k, "value": v} for k, v in cells.items()], ["metric", "value"])
    sections = [("Data", "<br>".join(notes)), ("Validation accuracy", overview)]
    for name in ("confidence", "batch", "split", "task"):
        groups = evaluation.get("breakdown", {}).get(name, {})
        if groups:
            rows = [{name: g, **rm_report.accuracy_cells(stats)} for g, stats in groups.items()]
            sections.append((f"Accuracy by {name} (Detail 16)", table_html(rows, list(rows[0]))))
    for png in sorted([*(run_dir / "plots").glob("*.png"), *eval_dir.glob("*.png")]):
        sections.append((png.stem.replace("_", " "), image_html(png)))
    if (eval_dir / "probes.md").exists():
        sections.append(("Probes", f"<pre>{(eval_dir / 'probes.md').read_text()}</pre>"))
    sections += list(extra_sections)
    sections.append(("Resolved config", f"<pre>{(run_dir / 'config.yaml').read_text()}</pre>"))
    return write_report(run_dir, f"{title} run {run_dir.name}", sections)


def cross_validation_sections(run_dir: Path) -> list[tuple[str, str]]:
    """The report's cross-validation table, when the run cross-validated (in this process or an earlier one)."""
    path = run_dir / "cross_validation" / "rm_eval.json"
    if not path.is_file():
        return []
    result = json.loads(path.read_text())
    cells = rm_report.accuracy_cells(result["breakdown"]["overall"]) | {"protocol": result["protocol"]}
    rows = [{"metric": k, "value": v} for k, v in cells.items()]
    return [("Cross-validation (every training pair, scored by a fold model that never saw its prompt)",
             table_html(rows, ["metric", "value"]) + "<br>" + "<br>".join(result["folds"]))]


def load_pair_scorer(cfg: RMEvalConfig) -> tuple[torch.nn.Module, Any]:
    """A reward model, or a DPO policy whose implicit reward is scored the same way (Detail 19)."""
    folder = Path(cfg.model)
    if folder.is_dir() and not (folder / SCALAR_CONFIG).is_file() and ((folder / DPO_RECORD).is_file() or cfg.reference_model):
        return load_implicit_reward_model(folder, cfg.reference_model, cfg.beta, cfg.trust_remote_code)
    return load_reward_model(cfg.model, cfg.trust_remote_code)


def run_eval(cfg: RMEvalConfig, _parsed: Any = None) -> int:
    if not cfg.model or not cfg.data:
        raise ConfigError("rm-eval needs model=<reward model or DPO policy folder> and data=<comparisons>")
    model, tokenizer = load_pair_scorer(cfg)
    if torch.cuda.is_available():
        model = model.cuda()
    records, log = load_pairs(cfg.data_format, cfg.data, cfg.hf_split)
    records = filter_comparisons(records, cfg.splits, cfg.batches)
    if cfg.side != "all":
        train_side, val_side = split_by_prompt(records, lambda r: r.prompt_id, validation_fraction=cfg.validation_fraction, seed=cfg.seed)
        records = val_side if cfg.side == "validation" else train_side
    records = records[: cfg.max_pairs] if cfg.max_pairs else records
    examples, note = prepare_pairs(cfg, tokenizer, records)
    print(f"loaded: {log.summary('pairs')}; scoring: {note}")
    if not examples:
        raise ConfigError(f"no pairs left to evaluate (filters splits={cfg.splits} batches={cfg.batches} side={cfg.side})")
    out = Path(cfg.out) if cfg.out else Path("runs") / f"rm-eval-{datetime.now():%Y%m%d-%H%M%S}"
    limits = query_limits(cfg.max_query_length, cfg.max_article_query_length)
    probes = builtin_probes_for(cfg.data_format, cfg.probes)
    result = evaluate_reward_model(model, tokenizer, examples, out, batch_size=cfg.batch_size, probes=probes, limits=limits,
                                   errors=cfg.errors, bins=cfg.calibration_bins, dump=cfg.dump_logits,
                                   length_penalty=cfg.length_penalty, seed=cfg.seed)
    print(rm_report.headline(result))
    print(f"wrote {out / 'rm_eval.json'}")
    return 0
