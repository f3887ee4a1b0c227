"""`rlhfkit rm-eval`: a reward model, or a DPO policy's implicit reward, read from its folder and evaluated on
the comparisons of `data` by `evaluate.evaluate_reward_model`, into its own folder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from ..config import RMEvalConfig
from ..data import load_pairs, usable
from ..data.examples import prepare_pairs, query_limits
from ..data.split import filter_comparisons, split_by_prompt
from ..devices import default_device
from ..errors import ConfigError
from ..models import SCALAR_CONFIG
from ..reward_models import DPO_RECORD, load_implicit_reward_model, load_reward_model
from . import report as reward_report
from .evaluate import builtin_probes_for, evaluate_reward_model


def load_pair_scorer(cfg: RMEvalConfig) -> tuple[torch.nn.Module, Any]:
    """A reward model, or a DPO policy whose implicit reward is scored the same way (Detail 19)."""
    folder = Path(cfg.model)
    if (
        folder.is_dir()
        and not (folder / SCALAR_CONFIG).is_file()
        and ((folder / DPO_RECORD).is_file() or cfg.reference_model)
    ):
        return load_implicit_reward_model(folder, cfg.reference_model, cfg.beta, cfg.trust_remote_code)
    return load_reward_model(cfg.model, cfg.trust_remote_code)


def run_eval(cfg: RMEvalConfig) -> int:
    if not cfg.model or not cfg.data:
        raise ConfigError("rm-eval needs model=<reward model or DPO policy folder> and data=<comparisons>")
    model, tokenizer = load_pair_scorer(cfg)
    model = model.to(default_device())
    loaded = load_pairs(cfg.data_format, cfg.data, cfg.hf_split, cfg.fields)
    records, log = usable(loaded, cfg.data, "pairs", f"data_format={cfg.data_format}")
    records = filter_comparisons(records, cfg.splits, cfg.batches)
    if cfg.side != "all":
        train_side, val_side = split_by_prompt(
            records, lambda r: r.prompt_id, validation_fraction=cfg.validation_fraction, seed=cfg.seed
        )
        records = val_side if cfg.side == "validation" else train_side
    records = records[: cfg.max_pairs] if cfg.max_pairs else records
    examples, note = prepare_pairs(cfg.lengths, tokenizer, records)
    print(f"loaded: {log.summary('pairs')}; scoring: {note}")
    if not examples:
        raise ConfigError(
            f"no pairs left to evaluate (filters splits={cfg.splits} batches={cfg.batches} side={cfg.side}; "
            f"loaded: {log.summary('pairs')}; scoring: {note})"
        )
    out = Path(cfg.out) if cfg.out else Path("runs") / f"rm-eval-{datetime.now():%Y%m%d-%H%M%S}"
    limits = query_limits(cfg.max_query_length, cfg.max_article_query_length)
    probes = builtin_probes_for(records, cfg.probes)
    result = evaluate_reward_model(
        model,
        tokenizer,
        examples,
        out,
        batch_size=cfg.batch_size,
        probes=probes,
        limits=limits,
        errors=cfg.errors,
        bins=cfg.calibration_bins,
        dump=cfg.dump_logits,
        length_penalty=cfg.length_penalty,
        seed=cfg.seed,
    )
    print(reward_report.headline(result))
    print(f"wrote {out / 'rm_eval.json'}")
    return 0
