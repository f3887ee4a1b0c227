"""`rlhfkit eval`: policies compared through their samples on the same held-out prompts.

Input: one JSON-lines file per policy as `rlhfkit generate` writes it (prompt_id, query, reference,
text, tokens, has_eos), named `name=path`. Only prompts present in every file are compared. Output:
- per policy: ROUGE-L, length, EOS rate, the reward-hacking alarms (`alarms.py`), and with a judge
  its win rate against the reference summaries with a bootstrap interval, by bins of
  log(length / reference length) (Figure 8) and adjusted to equal length (`winrate.py`);
- with a judge and two or more policies: the head-to-head matrix (row beats column; seed 002's table);
- with `rm_judge` besides `judge`: how often the reward model and the judge prefer the same
  response of the same pairs (Detail 17's preference consistency).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from ..config import EvalConfig, parse_named
from ..data.records import DataFormatError, decode_json, open_text, reading
from ..errors import ConfigError
from ..models import load_policy
from ..report.caveats import alarm_value
from ..report.report import json_safe
from ..reward_models import load_reward_model
from ..rouge import mean, rouge_l
from ..scoring import score_texts
from . import policy_stats
from .alarms import alarms, words
from .eval_report import judge_agreement, plot_reward_vs_kl, write_eval_report
from .judges import ApiOptions, Pair, Verdict, make_judge
from .winrate import length_adjusted_win_rate, length_bins, win_rate

SAMPLE_FIELDS = ("prompt_id", "query", "reference", "text")
OUTCOME = {"A": "win", "B": "loss", "tie": "tie", "unparseable": "unparseable"}


def parse_named_paths(specs: list[str], key: str = "samples", folders: bool = False) -> dict[str, Path]:
    named = {}
    for name, path in parse_named(specs, key, f"ppo=runs/ppo/{'model' if folders else 'samples.jsonl'}").items():
        exists = Path(path).is_dir() if folders else Path(path).is_file()
        if not exists:
            raise ConfigError(
                f"{key}: {path} (for {name}) does not exist" + ("" if folders else "; write it with `rlhfkit generate`")
            )
        named[name] = Path(path)
    return named


def read_samples(path: Path) -> dict[str, dict[str, Any]]:
    """A policy's samples by prompt id, from the JSON lines `rlhfkit generate` writes; any other file fails
    in one line naming it and the line."""
    rows = {}
    with reading(str(path)), open_text(str(path), newline="\n") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                row = sample_row(line, f"{path}:{number}")
                rows[str(row["prompt_id"])] = row
    return rows


def sample_row(line: str, where: str) -> dict[str, Any]:
    try:
        row = decode_json(line)
    except json.JSONDecodeError as e:
        raise DataFormatError(
            f"{where}: not JSON lines ({e.msg}); give the JSON-lines file `rlhfkit generate` writes"
        ) from None
    if not isinstance(row, dict):
        raise DataFormatError(
            f"{where}: a JSON {type(row).__name__}, not a sample; give the JSON-lines file `rlhfkit generate` writes"
        )
    missing = [f for f in SAMPLE_FIELDS if f not in row]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}; give a file written by `rlhfkit generate`")
    return row


def common_prompts(samples: dict[str, dict[str, dict[str, Any]]], limit: int) -> list[str]:
    """Prompt ids present in every file, in the first file's order."""
    first, *others = samples.values()
    ids = [pid for pid in first if all(pid in other for other in others)]
    if not ids:
        raise ConfigError(
            "the sample files share no prompt_id: generate them on the same posts (same data, split and seed)"
        )
    return ids[:limit] if limit else ids


def outcomes_of(verdicts: list[Verdict]) -> list[str]:
    """Verdicts about (A = the policy, B = the other side) as the policy's win/loss/tie/unparseable, or
    failed where the call got no reply."""
    return ["failed" if v.error else OUTCOME[v.winner] for v in verdicts]


def has_references(rows: list[dict[str, Any]]) -> bool:
    """Summaries of posts have reference summaries; answers to a prompt suite do not."""
    return all(str(r["reference"]).strip() for r in rows)


def policy_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    texts, references = [r["text"] for r in rows], [r["reference"] for r in rows] if has_references(rows) else None
    has_eos = [bool(r.get("has_eos", True)) for r in rows]
    summary = {
        "prompts": len(rows),
        "words": mean([len(words(t)) for t in texts]),
        "eos_rate": mean([float(e) for e in has_eos]),
        "alarms": alarms(texts, [r["query"] for r in rows], references, has_eos),
    }
    if references is not None:
        summary |= {
            "rouge_l": mean(rouge_l(texts, references)),
            "reference_words": mean([len(words(t)) for t in references]),
        }
    return summary


def by_category(rows: list[dict[str, Any]], rm_scores: list[float] | None) -> dict[str, dict[str, Any]]:
    """Prompt-suite rows: count, capability pass rate and mean RM score per category."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["category"], []).append(i)
    result = {}
    for category, members in groups.items():
        passes = [float(rows[i]["capability_pass"]) for i in members if rows[i].get("capability_pass") is not None]
        result[category] = {
            "prompts": len(members),
            "capability_pass_rate": mean(passes) if passes else None,
            "rm_score": mean([rm_scores[i] for i in members]) if rm_scores else None,
        }
    return result


def versus_references(judge, rows: list[dict[str, Any]], seed: int) -> tuple[dict[str, Any], list[Verdict]]:
    verdicts = judge.judge([Pair(r["query"], r["text"], r["reference"]) for r in rows])
    judge.require_a_verdict()
    outcomes = outcomes_of(verdicts)
    lengths = [max(1, len(words(r["text"]))) for r in rows]
    reference_lengths = [max(1, len(words(r["reference"]))) for r in rows]
    return {
        "win_rate": asdict(win_rate(outcomes, seed=seed)),
        "length_bins": length_bins(outcomes, lengths, reference_lengths),
        "length_adjusted": length_adjusted_win_rate(outcomes, lengths, reference_lengths, seed=seed),
    }, verdicts


def head_to_head(
    judge, samples: dict[str, dict[str, dict[str, Any]]], ids: list[str], seed: int
) -> dict[str, dict[str, Any]]:
    """matrix[a][b]: a's win rate against b on the same prompts (each unordered pair judged once)."""
    names = list(samples)
    matrix: dict[str, dict[str, Any]] = {a: {} for a in names}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pairs = [Pair(samples[a][p]["query"], samples[a][p]["text"], samples[b][p]["text"]) for p in ids]
            outcomes = outcomes_of(judge.judge(pairs))
            judge.require_a_verdict()
            result = win_rate(outcomes, seed=seed)
            matrix[a][b] = asdict(result)
            flipped = [{"win": "loss", "loss": "win"}.get(o, o) for o in outcomes]
            matrix[b][a] = asdict(win_rate(flipped, seed=seed))
    return matrix


def preference_consistency(first: list[Verdict], second: list[Verdict]) -> dict[str, Any]:
    """Detail 17: share of pairs, decided by both judges, where they prefer the same response."""
    both = [
        (a.winner, b.winner)
        for a, b in zip(first, second, strict=True)
        if a.winner in ("A", "B") and b.winner in ("A", "B")
    ]
    return {"pairs": len(both), "consistency": mean([float(a == b) for a, b in both]) if both else None}


class ModelStats:
    """The reward model and the reference policy, loaded once, applied to each policy's samples."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self.models = parse_named_paths(cfg.models, "models", folders=True)
        self.reward = load_reward_model(cfg.reward_model) if cfg.reward_model else None
        self.reference = load_policy(cfg.reference_model) if cfg.reference_model else None

    def of(self, name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        has_eos = [bool(r.get("has_eos", True)) for r in rows]
        if self.reward is not None:
            model, tokenizer = self.reward
            q, responses = policy_stats.encoded_samples(tokenizer, rows)
            scores = score_texts(
                model, tokenizer.pad_token_id, q, responses, self.cfg.batch_size, f"RM scores ({name})", has_eos=has_eos
            )
            stats["rm_scores"] = scores.tolist()
            stats["rm_score"] = mean(stats["rm_scores"])
        if self.reference is not None:
            reference, tokenizer = self.reference
            q, responses = policy_stats.encoded_samples(tokenizer, rows)
            ranks = [
                policy_stats.token_ranks(reference, qi, ri) if ri else [] for qi, ri in zip(q, responses, strict=True)
            ]
            stats["token_shift"] = policy_stats.shift_shares(ranks)
            stats["shift_html"] = [
                policy_stats.shift_html(tokenizer, r, k)
                for r, k in list(zip(responses, ranks, strict=True))[: self.cfg.shift_samples]
            ]
            if name in self.models:
                policy, _ = load_policy(str(self.models[name]))
                stats["kl"] = float(
                    policy_stats.kl_to_reference(
                        policy, reference, q, responses, tokenizer.pad_token_id, self.cfg.batch_size
                    ).mean()
                )
        return stats


def run(cfg: EvalConfig) -> int:
    if not cfg.samples:
        raise ConfigError("eval needs samples=name=path[,name=path...] (files written by `rlhfkit generate`)")
    named = parse_named_paths(cfg.samples)
    samples = {name: read_samples(path) for name, path in named.items()}
    ids = common_prompts(samples, cfg.max_prompts)
    out = Path(cfg.out) if cfg.out else Path("runs") / f"eval-{datetime.now():%Y%m%d-%H%M%S}"
    print(f"comparing {', '.join(named)} on {len(ids)} common prompts")
    result: dict[str, Any] = {"prompts": len(ids), "policies": {}}
    judge = (
        make_judge(
            cfg.judge,
            template=cfg.template or None,
            cache_dir=cfg.cache_dir,
            seed=cfg.seed,
            options=ApiOptions(
                concurrency=cfg.concurrency,
                timeout=cfg.timeout,
                input_price=cfg.input_price,
                output_price=cfg.output_price,
            ),
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size,
        )
        if cfg.judge
        else None
    )
    rm_judge = (
        make_judge(cfg.rm_judge, cache_dir=cfg.cache_dir, seed=cfg.seed, batch_size=cfg.batch_size)
        if cfg.rm_judge
        else None
    )
    model_stats = ModelStats(cfg)
    for name in named:
        rows = [samples[name][p] for p in ids]
        summary = policy_summary(rows) | model_stats.of(name, rows)
        rm_scores = summary.pop("rm_scores", None)
        if all("category" in r for r in rows):
            summary["by_category"] = by_category(rows, rm_scores)
        if judge is not None and has_references(rows):
            versus, verdicts = versus_references(judge, rows, cfg.seed)
            summary |= versus
            if rm_judge is not None:
                rm_verdicts = rm_judge.judge([Pair(r["query"], r["text"], r["reference"]) for r in rows])
                summary["rm_judge_consistency"] = preference_consistency(verdicts, rm_verdicts)
        result["policies"][name] = summary
    if judge is not None and len(named) > 1:
        result["head_to_head"] = head_to_head(judge, samples, ids, cfg.seed)
    out.mkdir(parents=True, exist_ok=True)  # once a judge has answered: a judge out of reach leaves no folder
    if judge is not None:
        result["judge"] = judge.describe() | {
            "stats": judge.stats.as_dict(),
            "agreement_with_humans": judge_agreement(cfg.judge, out),
        }
    if any("kl" in s and "rm_score" in s for s in result["policies"].values()):
        points = {n: (s["kl"], s["rm_score"]) for n, s in result["policies"].items() if "kl" in s and "rm_score" in s}
        plot_reward_vs_kl(points, out / "reward_vs_kl.png")
    write_eval_report(out, result, cfg.reward_model)
    for summary in result["policies"].values():
        summary.pop("shift_html", None)  # HTML for the report, not data
    (out / "eval.json").write_text(json.dumps(json_safe(result), indent=2))
    print(headline(result))
    if judge is not None:
        judge.warn_of_failures()
    print(f"wrote {out / 'eval.json'}")
    return 0


def headline(result: dict[str, Any]) -> str:
    lines = []
    for name, s in result["policies"].items():
        line = f"{name}: {s['words']:.1f} words, EOS {s['eos_rate']:.2f}"
        if "rouge_l" in s:
            line += f", ROUGE-L {s['rouge_l']:.3f} (references {s['reference_words']:.1f} words)"
        if "rm_score" in s:
            line += f", RM score {s['rm_score']:.3f}"
        for category, c in s.get("by_category", {}).items():
            if c["capability_pass_rate"] is not None:
                line += f", {category} pass rate {c['capability_pass_rate']:.2f}"
        rate = s.get("win_rate", {})
        if rate.get("rate") is not None:
            line += f", win rate vs references {rate['rate']:.3f} [{rate['low']:.3f}, {rate['high']:.3f}]"
        if rate:
            line += f", unparseable {rate['unparseable']}, failed calls {rate['failed']}"
        if s["alarms"]["flags"]:
            line += f", alarms: {', '.join(alarm_value(flag, s['alarms']) for flag in s['alarms']['flags'])}"
        lines.append(line)
    return "\n".join(lines)
