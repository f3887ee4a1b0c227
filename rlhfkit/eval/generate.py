"""`rlhfkit generate`: a policy's responses to one side of the prompt split (with ROUGE-L against the
references), or its answers to a prompt suite (`prompt_suite.py`), one JSON line per prompt in `out`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import GenerateConfig
from ..data import load_prompts, usable
from ..data.examples import tokenize_sft
from ..data.formats import encode_query
from ..data.split import split_by_prompt
from ..devices import default_device
from ..errors import ConfigError
from ..generation import SamplingParams, generate_texts
from ..models import load_policy
from ..rouge import mean, rouge_l
from ..tracking import write_jsonl
from .prompt_suite import as_dialogue, load_suite


def run_generate(cfg: GenerateConfig) -> int:
    """`rlhfkit generate`: responses (and ROUGE-L against the references) for one side of the prompt
    split, or answers to a prompt suite."""
    if cfg.prompt_suite:
        return answer_prompt_suite(cfg)
    if not cfg.data:
        raise ConfigError("generate needs data=... (prompts: hub id, files or folders) or prompt_suite=...")
    loaded = load_prompts(cfg.prompt_format, cfg.data, cfg.hf_split, cfg.fields)
    records, log = usable(loaded, cfg.data, "prompts", f"prompt_format={cfg.prompt_format}")
    if cfg.split != "all":
        train_records, val_records = split_by_prompt(records, lambda r: r.prompt_id,
                                                     validation_size=cfg.validation_posts, seed=cfg.seed)
        records = val_records if cfg.split == "validation" else train_records
    records = records[: cfg.num_samples] if cfg.num_samples else records
    model, tokenizer = load_policy(cfg.model, cfg.trust_remote_code)
    model = model.to(default_device())
    examples, tok_log = tokenize_sft(records, tokenizer, cfg.max_query_length, 10**9)
    print(f"loaded: {log.summary('prompts')}; queries: {tok_log.summary('prompts')}; "
          f"generating for {len(examples)} prompts")
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed)
    outputs = generate_texts(model, tokenizer, [e.query.ids for e in examples], params, cfg.batch_size)
    scores = rouge_l([o["text"] for o in outputs], [e.record.summary.strip() for e in examples])
    rows = [
        {"prompt_id": e.record.prompt_id, "query": e.query.text, "query_ids": e.query.ids,
         "reference": e.record.summary.strip(), **o, "rouge_l": s}
        for e, o, s in zip(examples, outputs, scores, strict=True)
    ]
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(cfg.out), rows)
    eos_rate = mean([float(o["has_eos"]) for o in outputs])
    print(json.dumps({"posts": len(rows), "rouge_l": mean(scores), "eos_rate": eos_rate}))
    return 0


def answer_prompt_suite(cfg: GenerateConfig) -> int:
    """Each suite prompt as one HH-RLHF user turn; rows carry the category and, for capability
    prompts, whether an accepted answer appears (`rlhfkit eval` breaks results down by category)."""
    prompts = load_suite(cfg.prompt_suite)
    model, tokenizer = load_policy(cfg.model, cfg.trust_remote_code)
    model = model.to(default_device())
    queries = [encode_query(tokenizer, "hh", {"dialogue": as_dialogue(p.prompt)}, cfg.max_query_length)
               for p in prompts]
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed)
    outputs = generate_texts(model, tokenizer, [q.ids for q in queries], params, cfg.batch_size,
                             desc="answering the suite")
    rows = [{"prompt_id": p.id, "category": p.category, "query": q.text, "query_ids": q.ids, "reference": "",
             **o, "capability_pass": p.passes(o["text"])}
            for p, q, o in zip(prompts, queries, outputs, strict=True)]
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(Path(cfg.out), rows)
    checked = [r["capability_pass"] for r in rows if r["capability_pass"] is not None]
    pass_rate = mean([float(c) for c in checked]) if checked else None
    print(json.dumps({"prompts": len(rows), "capability_pass_rate": pass_rate}))
    return 0
