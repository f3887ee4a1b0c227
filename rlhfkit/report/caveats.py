"""Caveats computed from a report's own numbers: each function returns one line saying why a number
should not be read at face value, or "" when its check does not fire.

The checks: a judge whose measured agreement with humans is near or below chance; a reward model
no better than "always prefer the longer response"; a policy whose reward-model score or EOS rate
fell during training; an alarm that fired (naming the opening or ending that collapsed); a training
budget so far below the paper's that the numbers show the machinery, not alignment; an evaluation on
too few prompts to separate policies; the EOS trick deciding most rewards of reward functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHANCE = 0.5
NEAR_CHANCE = 0.55  # agreement at or below this is no evidence of a judge that tracks humans
FEW_PROMPTS = 50  # below this, a difference of a few points is inside any interval

# The embedded judge measured with `rlhfkit judge-eval` (docs/reproduction.md, "How far a local
# judge can be trusted"): shipped so that a report says it even where no judge-eval was run.
SHIPPED_JUDGE_AGREEMENT = {
    "hf-logprob:smollm2-135m": {
        "agreement": 0.440, "low": 0.393, "high": 0.490, "pairs": 200,
        "source": "shipped judge-eval on 200 TL;DR human comparisons, docs/reproduction.md",
    },
}

# Tables 3-5 of the paper: one epoch of SFT and RM data, 1M PPO episodes.
PAPER_BUDGET = {"sft": (116_722, "examples"), "rm": (92_858, "pairs"), "dpo": (92_858, "pairs"),
                "ppo": (1_000_000, "episodes"), "grpo": (1_000_000, "episodes"), "rloo": (1_000_000, "episodes")}
SMALL_BUDGET = 0.01  # under 1% of the paper's budget the curves show the code running, not a result
EOS_TRICK_DECIDES = 0.5  # past this share of responses without EOS, the trick's constant is most rewards


def measured_judge_agreement(spec: str, roots: list[Path]) -> dict[str, Any] | None:
    """The newest `judge_eval.json` under `roots` (each root, or a folder directly in it) measured for
    judge `spec`, else the shipped figure for the embedded judge, else None."""
    found = []
    for root in roots:
        for path in [root / "judge_eval.json", *root.glob("*/judge_eval.json")]:
            summary = read_json(path)
            if summary and summary.get("judge", {}).get("judge") == spec and "agreement" in summary:
                found.append((path.stat().st_mtime, path, summary["agreement"], summary.get("pairs")))
    if found:
        _, path, agreement, pairs = max(found, key=lambda item: item[0])
        return {"agreement": agreement["agreement"], "low": agreement.get("low"), "high": agreement.get("high"),
                "pairs": pairs, "source": f"judge-eval in {path.parent}"}
    return SHIPPED_JUDGE_AGREEMENT.get(spec)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def judge_caveat(spec: str, measured: dict[str, Any] | None) -> str:
    if not spec:
        return ""
    if measured is None or measured.get("agreement") is None:
        if spec.startswith("rm:"):
            return ""  # a reward-model judge is checked through the reward model's own held-out accuracy
        return (f"judge {spec} has no measured agreement with humans: run `rlhfkit judge-eval judge={spec}` "
                f"on human comparisons before reading its win rates")
    agreement, high = measured["agreement"], measured.get("high")
    if agreement > NEAR_CHANCE and (high is None or measured.get("low") is None or measured["low"] > CHANCE):
        return ""
    where = "below" if (high is not None and high < CHANCE) or agreement < CHANCE else "near"
    interval = f" [{measured['low']:.3f}, {high:.3f}]" if high is not None and measured.get("low") is not None else ""
    return (f"judge {spec} agrees with humans on {agreement:.3f}{interval} of {measured.get('pairs', '?')} pairs "
            f"({measured['source']}), {where} chance: its win rates measure the judge, not the policies")


def reward_model_caveat(accuracy: float | None, length_rule: float | None, difference_low: float | None = None) -> str:
    """An RM whose accuracy is at or below the always-longer rule, or whose paired difference from it
    cannot exclude 0, gives scores that a policy can raise by writing longer, not better."""
    if accuracy is None or length_rule is None:
        return ""
    if accuracy <= length_rule:
        return (f"reward model accuracy {accuracy:.3f} is at or below always-prefer-longer ({length_rule:.3f}): "
                f"its scores do not show quality beyond length")
    if difference_low is not None and difference_low <= 0:
        return (
            f"reward model accuracy {accuracy:.3f} is not distinguishable from always-prefer-longer "
            f"({length_rule:.3f}): "
            f"the paired interval of the difference includes 0"
        )
    return ""


def fell_caveat(what: str, before: float | None, after: float | None, since: str) -> str:
    if before is None or after is None or after >= before:
        return ""
    return f"{what} fell from {before:.3f} ({since}) to {after:.3f}"


def alarm_caveat(policy: str, alarms: dict[str, Any]) -> str:
    flags = alarms.get("flags") or []
    if not flags:
        return ""
    values = ", ".join(alarm_value(flag, alarms) for flag in flags if isinstance(alarms.get(flag), int | float))
    return f"{policy}: alarms fired ({values}): read its samples before its scores"


def alarm_value(flag: str, alarms: dict[str, Any]) -> str:
    """The flag and its value; for a template alarm also the text the responses share, so that a
    reader sees what collapsed."""
    collapsed = {
        "shared_opening_share": f'opening "{alarms.get("top_opening", "")}"',
        "shared_ending_share": f'ending "{alarms.get("top_ending", "")}"',
        "question_ending_share": 'ending in "?"',
    }.get(flag)
    return f"{flag} {alarms[flag]:.3f}" + (f" ({collapsed})" if collapsed else "")


def budget_caveat(stage: str, amount: float | None) -> str:
    if stage not in PAPER_BUDGET or not amount:
        return ""
    paper, unit = PAPER_BUDGET[stage]
    if amount >= SMALL_BUDGET * paper:
        return ""
    return (
        f"trained on {int(amount):,} {unit}, {100 * amount / paper:.2g}% of the paper's {paper:,}: "
        f"at this budget the numbers show the machinery, not alignment"
    )


def few_prompts_caveat(count: int | None, what: str = "prompts") -> str:
    if count is None or count >= FEW_PROMPTS:
        return ""
    return f"evaluated on {count} {what}: differences of a few points are inside the noise"


def reward_model_caveat_of(folder: Path) -> str:
    """The caveat of a reward model trained by `rlhfkit rm`, from the held-out evaluation it wrote
    beside its `model/` folder; "" for a model evaluated nowhere we can see."""
    result = read_json(folder.parent / "rm_eval" / "rm_eval.json") or read_json(folder / "rm_eval" / "rm_eval.json")
    overall = (result or {}).get("breakdown", {}).get("overall")
    if not overall:
        return ""
    return reward_model_caveat(overall.get("accuracy"), overall.get("length_rule"), overall.get("model_minus_rule_low"))


def eos_trick_caveat(eos_rates: list[float], replaces_function_rewards: bool) -> str:
    """Reward functions without a reward model, with the EOS trick on (Detail 23; `replaces_function_rewards`):
    where most training responses had no EOS (`eos_rates`: each update's share with one), the trick's constant
    replaced most of the functions' values, so the policy learned from it rather than from them."""
    if not replaces_function_rewards or not eos_rates:
        return ""
    missing = 1 - sum(eos_rates) / len(eos_rates)
    if missing <= EOS_TRICK_DECIDES:
        return ""
    return (
        f"the EOS trick (eos_trick=true) replaced the reward functions' values of {missing:.0%} of the training "
        "responses (those without EOS) by missing_eos_score: the policy learned from that constant more than from "
        "the functions; set eos_trick=false for reward functions alone (docs/rewards.md)"
    )
