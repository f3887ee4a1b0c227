"""`rlhfkit sft`: supervised fine-tuning on TL;DR reference summaries (Section 5, Detail 9, Table 3), or on
any prompt-completion or language-modelling data (docs/data-formats.md).

Next-token loss on the response tokens (leading space + summary + EOS, Detail 3) of right-padded
query+response rows (Detail 5), averaged over every response token of the effective batch.
At the end the held-out prompts are answered by the starting model and the SFT model and both
are scored with ROUGE-L against the reference completions (a language-modelling text has no prompt
to answer: only its validation loss is measured).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..adapters import save_final_model, trained_policy
from ..config import SFTConfig
from ..data import SFT as SFT_ROLE
from ..data import load_sft_data, resolved_format, usable
from ..data.collate import IGNORE_INDEX, right_pad_query_response
from ..data.examples import SFTExample, tokenize_sft, training_examples
from ..data.split import split_by_prompt
from ..devices import default_device, evaluation_mode, model_device
from ..generation import SamplingParams, generate_texts
from ..logprobs import target_logprobs
from ..plots import metric_series, plot_curves
from ..report.caveats import budget_caveat, fell_caveat, few_prompts_caveat
from ..report.report import Report, config_text, trained_amount, training_summary
from ..rouge import mean, rouge_l
from ..tracking import read_jsonl, read_metrics, write_jsonl
from .run import attention_implementation, is_main_process, record_settings, start_run
from .supervised import SupervisedStage, train


def collate_sft(examples: list[SFTExample], pad_id: int, loss_on_query: bool) -> dict[str, torch.Tensor]:
    batch = right_pad_query_response(
        [e.query.ids for e in examples], [e.response for e in examples], pad_id, loss_on_query
    )
    batch["loss_units"] = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(-1)
    batch.pop("response_mask")
    return batch


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Summed next-token cross-entropy over the labelled tokens, with logits formed only where a label is."""
    logprobs, _ = target_logprobs(
        model, batch["input_ids"], batch["attention_mask"], batch["labels"][:, 1:] != IGNORE_INDEX
    )
    return -logprobs.sum(), {}


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module, examples: list[SFTExample], pad_id: int, loss_on_query: bool, batch_size: int
) -> float:
    device = model_device(model)
    total, units = 0.0, 0
    with evaluation_mode(model):
        for i in range(0, len(examples), batch_size):
            collated = collate_sft(examples[i : i + batch_size], pad_id, loss_on_query)
            batch = {k: v.to(device) for k, v in collated.items()}
            total += sft_loss(model, batch)[0].item()
            units += int(batch["loss_units"].sum())
    return total / max(units, 1)


def summarise(model, tokenizer, examples: list[SFTExample], cfg: SFTConfig, label: str) -> list[dict]:
    params = SamplingParams(max_new_tokens=cfg.max_response_length, temperature=cfg.eval_temperature, seed=cfg.seed)
    return generate_texts(
        model, tokenizer, [e.query.ids for e in examples], params, cfg.micro_batch_size, desc=f"answering ({label})"
    )


def prompt_cell(example: SFTExample) -> dict[str, str]:
    """The prompt as the sample table shows it: a TL;DR post, else the query as the model read it."""
    if "post" in example.record.fields:
        return {"post": example.record.fields["post"]}
    return {"prompt": example.query.text}


def sample_rows(examples: list[SFTExample], base: list[dict] | None, tuned: list[dict]) -> list[dict[str, Any]]:
    refs = [e.record.summary.strip() for e in examples]
    tuned_rouge = rouge_l([t["text"] for t in tuned], refs)
    base_rouge = rouge_l([b["text"] for b in base], refs) if base else [None] * len(refs)
    rows = []
    for i, e in enumerate(examples):
        row = {"prompt_id": e.record.prompt_id, **prompt_cell(e), "reference": refs[i]}
        if base:
            row |= {"base": base[i]["text"], "base_has_eos": base[i]["has_eos"], "base_rouge_l": base_rouge[i]}
        row |= {"sft": tuned[i]["text"], "sft_has_eos": tuned[i]["has_eos"], "sft_rouge_l": tuned_rouge[i]}
        rows.append(row)
    return rows


def summary_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {"eval/posts": len(rows)}
    for who in ("base", "sft"):
        if rows and f"{who}_rouge_l" in rows[0]:
            out[f"eval/{who}_rouge_l"] = mean([r[f"{who}_rouge_l"] for r in rows])
            out[f"eval/{who}_eos_rate"] = mean([float(r[f"{who}_has_eos"]) for r in rows])
    return out


def write_sft_report(
    run_dir: Path, cfg: SFTConfig, metrics: dict[str, float], rows: list[dict], data_notes: list[str]
) -> Path:
    history = read_metrics(run_dir)
    report = Report(
        f"SFT run {run_dir.name}",
        training_summary(run_dir, cfg.model, data_notes, history, cfg.total_batch_size, "examples"),
        config=config_text(run_dir),
    )
    report.caveat(budget_caveat("sft", trained_amount(history, cfg.total_batch_size)))
    losses = metric_series(history, "train/loss")[1]
    if losses:
        report.number("training loss, last step", losses[-1], losses[0], "first step")
    if "val/loss" in metrics:
        report.number("validation loss", metrics["val/loss"])
    for metric, name in (("rouge_l", "ROUGE-L against the references"), ("eos_rate", "EOS rate")):
        if f"eval/sft_{metric}" in metrics:
            base = metrics.get(f"eval/base_{metric}")
            report.number(
                f"{name} (SFT model)",
                metrics[f"eval/sft_{metric}"],
                base,
                "the starting model" if base is not None else "",
                fell_caveat(name, base, metrics[f"eval/sft_{metric}"], "starting model"),
            )
    report.caveat(few_prompts_caveat(int(metrics["eval/posts"]), "held-out prompts") if "eval/posts" in metrics else "")
    report.figure(
        "Training curves",
        plot_curves(
            history, ["train/loss", "val/loss", "train/lr", "perf/tokens_per_s"], run_dir / "plots" / "loss.png", "SFT"
        ),
    )
    columns = ["post", "prompt", "reference", "base", "sft", "base_rouge_l", "sft_rouge_l"]
    report.sample_table("Samples: prompt / reference / base model / SFT model", rows[:10], columns)
    return report.write(run_dir)


def run(cfg: SFTConfig) -> int:
    cfg, run_dir, checkpoint = start_run(cfg, "sft")
    loaded = load_sft_data(cfg.data_format, cfg.data, cfg.hf_split, cfg.fields)
    records, load_log = usable(loaded, cfg.data, "examples", f"data_format={cfg.data_format}")
    data_format = resolved_format(SFT_ROLE, cfg.data_format, cfg.data, cfg.hf_split, cfg.fields)
    train_records, val_records = split_by_prompt(
        records, lambda r: r.prompt_id, validation_size=cfg.validation_posts, seed=cfg.seed
    )
    model, tokenizer = trained_policy(cfg.model_source, cfg.lora, checkpoint)
    record_settings(run_dir, {"data_format": data_format, "attention": {"policy": attention_implementation(model)}})
    # long completions are cut as TRL's SFTTrainer cuts them, where their format allows (data/examples.py)
    train_examples, train_log = training_examples(
        tokenize_sft(train_records, tokenizer, cfg.max_query_length, cfg.max_response_length, cut_long=True),
        cfg.max_query_length,
        "training examples",
    )
    val_examples, val_log = tokenize_sft(
        val_records, tokenizer, cfg.max_query_length, cfg.max_response_length, cut_long=True
    )
    notes = [
        f"loaded: {load_log.summary('examples')}",
        f"split by prompt: {len(train_records)} train, {len(val_records)} validation examples",
        f"train tokenization: {train_log.summary('examples')}; queries truncated: "
        f"{sum(e.query.truncated for e in train_examples)}",
        f"validation tokenization: {val_log.summary('examples')}",
    ]
    print("\n".join(notes))
    eval_examples = val_examples[: cfg.eval_samples]
    answered = [e for e in eval_examples if e.query.ids]  # a text without a prompt has nothing to answer
    base_path = run_dir / "samples_base.jsonl"
    if answered and not base_path.exists() and checkpoint is None and is_main_process():
        write_jsonl(base_path, summarise(model.to(default_device()), tokenizer, answered, cfg, "base model"))

    if not val_examples:
        print("rlhfkit: no held-out examples (validation_posts=0 or too little data): no val/loss is computed")

    def evaluate(current: torch.nn.Module, step: int) -> dict[str, float]:
        # the loss of every held-out example; only the generations are limited to eval_samples
        if not val_examples:
            return {}
        return {
            "val/loss": validation_loss(
                current, val_examples, tokenizer.pad_token_id, cfg.loss_on_query, cfg.micro_batch_size
            )
        }

    stage = SupervisedStage(
        "sft",
        model,
        tokenizer,
        train_examples,
        lambda batch: collate_sft(batch, tokenizer.pad_token_id, cfg.loss_on_query),
        sft_loss,
        evaluate,
        length=lambda example: example.width(),
    )
    result = train(cfg, stage, run_dir, checkpoint)
    if not is_main_process():
        return 0
    final = result["model"]
    save_final_model(final, tokenizer, run_dir)
    metrics = {k: v for k, v in result["last_metrics"].items() if k.startswith("val/")}
    rows: list[dict] = []
    if answered:
        base = read_jsonl(base_path) if base_path.exists() else None
        rows = sample_rows(answered, base, summarise(final, tokenizer, answered, cfg, "SFT model"))
        write_jsonl(run_dir / "samples.jsonl", rows)
        metrics |= summary_metrics(rows)
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=2))
    report = write_sft_report(run_dir, cfg, metrics, rows, notes)
    print(json.dumps(metrics, indent=2))
    print(f"model: {run_dir / 'model'}\nreport: {report}")
    return 0
