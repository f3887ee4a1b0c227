"""report.html of `rlhfkit eval`: each policy beside the first one named (the starting policy in
the pipeline) and beside chance, the judge's measured agreement with humans next to its win rates; and its figure
of each policy's mean RM score against its KL to the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..plots import pyplot, save
from ..report.caveats import (
    alarm_caveat,
    fell_caveat,
    few_prompts_caveat,
    judge_caveat,
    measured_judge_agreement,
    reward_model_caveat_of,
)
from ..report.report import Report, key_values


def judge_agreement(spec: str, out: Path) -> dict[str, Any] | None:
    """The judge's agreement with humans from a judge-eval run beside this evaluation's folder or in
    ./runs, else the shipped figure (`caveats.SHIPPED_JUDGE_AGREEMENT`)."""
    roots = list(dict.fromkeys([out.parent.resolve(), Path("runs").resolve()]))
    return measured_judge_agreement(spec, roots)


def write_eval_report(out: Path, result: dict[str, Any], reward_model: str = "") -> Path:
    policies = result["policies"]
    names = list(policies)
    report = Report(
        "Policy evaluation",
        {
            "folder": str(out),
            "policies": ", ".join(names),
            "prompts": result["prompts"],
            "judge": result.get("judge", {}).get("judge"),
            "reward model": reward_model or None,
        },
    )
    report.caveat(few_prompts_caveat(result["prompts"]))
    if reward_model:
        report.caveat(reward_model_caveat_of(Path(reward_model)))
    judged = (
        judge_caveat(result["judge"]["judge"], result["judge"].get("agreement_with_humans"))
        if "judge" in result
        else ""
    )
    first = policies[names[0]]
    for name, s in policies.items():
        policy_numbers(report, name, s, names[0] if name != names[0] else "", first, judged)
        report.caveat(alarm_caveat(name, s["alarms"]))
    report.table("Policies", [policy_row(name, s) for name, s in policies.items()])
    report.table(
        "Prompt suite by category",
        [{"policy": n, "category": c, **v} for n, s in policies.items() for c, v in s.get("by_category", {}).items()],
        ["policy", "category", "prompts", "capability_pass_rate", "rm_score"],
    )
    report.table(
        "Token shift against the reference (Appendix F.2), KL and RM score",
        [
            {"policy": n, **s["token_shift"], "KL to reference": s.get("kl"), "RM score": s.get("rm_score")}
            for n, s in policies.items()
            if "token_shift" in s
        ],
        ["policy", "unshifted", "marginal", "shifted", "KL to reference", "RM score"],
    )
    for name, s in policies.items():
        report.table(
            f"{name}: win rate by log(length / reference length) (Figure 8)",
            s.get("length_bins", []),
            ["low", "high", "pairs", "votes", "win_rate"],
        )
    if "head_to_head" in result:
        matrix = result["head_to_head"]
        report.table(
            "Head to head (row beats column)",
            [{"row beats column": a} | {b: matrix[a].get(b, {}).get("rate") for b in names} for a in names],
            ["row beats column", *names],
        )
    if "judge" in result:
        report.table("Judge", key_values(result["judge"]), ["key", "value"])
    for name, s in policies.items():
        coloured = "".join(f"<p>{h}</p>" for h in s.get("shift_html", []))
        if coloured:
            report.sections.append(
                (f"{name}: tokens the reference ranks 1st (blue), 2nd-3rd (yellow), lower (red)", coloured)
            )
    report.figure("RM score against KL to the reference", out / "reward_vs_kl.png")
    return report.write(out)


def policy_numbers(
    report: Report, name: str, s: dict[str, Any], first_name: str, first: dict[str, Any], judged: str
) -> None:
    """Win rate beside chance (with the judge's caveat); RM score, EOS rate and ROUGE-L beside the
    first policy named, flagged where they fell."""
    rate = s.get("win_rate", {})
    if rate.get("rate") is not None:
        report.number(
            f"{name}: judge win rate vs reference summaries",
            (rate["rate"], rate["low"], rate["high"]),
            0.5,
            "chance",
            judged,
        )
    for key, label in (("rm_score", "RM score"), ("eos_rate", "EOS rate"), ("rouge_l", "ROUGE-L")):
        if key not in s:
            continue
        before = first.get(key) if first_name else None
        caveat = fell_caveat(f"{label}", before, s[key], first_name) if key != "rouge_l" else ""
        report.number(f"{name}: {label}", s[key], before, first_name, caveat)


def policy_row(name: str, s: dict[str, Any]) -> dict[str, Any]:
    rate, adjusted = s.get("win_rate", {}), s.get("length_adjusted", {})
    return {
        "policy": name,
        "words": s["words"],
        "EOS rate": s["eos_rate"],
        "ROUGE-L": s.get("rouge_l"),
        "RM score": s.get("rm_score"),
        "KL to reference": s.get("kl"),
        "win rate vs references": (rate.get("rate"), rate.get("low"), rate.get("high")),
        "win rate at equal length": adjusted.get("win_rate_at_equal_length"),
        "unparseable replies": rate.get("unparseable"),
        "failed calls (no reply)": rate.get("failed"),
        "alarms": ", ".join(s["alarms"]["flags"]) or "none",
    }


def plot_reward_vs_kl(points: dict[str, tuple[float, float]], path: Path) -> Path:
    """Each policy at (KL to the reference, mean RM score): the trade-off of the paper's Figure 7."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, (kl, score) in points.items():
        ax.scatter([kl], [score])
        ax.annotate(name, (kl, score), textcoords="offset points", xytext=(5, 5))
    ax.set(xlabel="KL to the reference (nats per response)", ylabel="mean RM score", title="RM score vs KL")
    ax.grid(alpha=0.3)
    return save(fig, path)
