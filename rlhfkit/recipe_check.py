"""`rlhfkit recipe check`: a recipe's runs held against its expected numbers.

A recipe folder (recipes/<name>/) holds `expected.json`: per variant (the full recipe, its short version for
CI), the root folder its commands write and the numbers they must end with. Each number names a file under
the root, a path into it, the value the recipe's own run measured and the band a correct run stays in:

    {"file": "eval/accuracy.json", "path": "tables.all[policy=grpo].greedy_minus_first_low",
     "expected": 0.05, "low": 0.0001, "high": 1}

A path is keys separated by dots; a number indexes a list (`-1` is the last row of metrics.jsonl, read as a
list of rows), and `[field=value]` picks the list's row whose field holds that value. The command prints each
number beside its expected value and band, and exits 1 when any is outside its band or missing, so that a
slow test fails when a change breaks learning.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .config import RecipeCheckConfig
from .errors import ConfigError

SELECTOR = re.compile(r"^(?P<key>[^\[]*)\[(?P<field>[^=\]]+)=(?P<value>[^\]]*)\]$")
# what each number of a variant holds, and of what kind
NUMBER_KEYS = {"name": str, "file": str, "path": str, "expected": float, "low": float, "high": float}


def read_document(path: Path) -> Any:
    """A JSON file, or JSON lines (metrics.jsonl, samples) as the list of their rows."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def step(value: Any, part: str) -> Any:
    """One part of a path applied to `value`; KeyError when it leads nowhere."""
    selected = SELECTOR.match(part)
    if selected:
        rows = step(value, selected["key"]) if selected["key"] else value
        for row in rows:
            if str(row.get(selected["field"])) == selected["value"]:
                return row
        raise KeyError(part)
    if isinstance(value, list):
        try:
            return value[int(part)]
        except (ValueError, IndexError):
            raise KeyError(part) from None
    return value[part]


def lookup(root: Path, number: dict[str, Any]) -> float | None:
    """The number `number` names under `root`, or None when its file or path does not exist."""
    path = root / number["file"]
    if not path.is_file():
        return None
    value = read_document(path)
    try:
        for part in number["path"].split("."):
            value = step(value, part)
    except (KeyError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def load_expected(path: Path, variant: str) -> dict[str, Any]:
    """The variant's root and numbers, or one line naming the file and what in it is wrong."""
    if path.is_dir():
        path = path / "expected.json"
    if not path.is_file():
        raise ConfigError(f"expected={path}: no such file (a recipe folder holds expected.json)")
    document = read_expected(path)
    variants = document.get("variants") if isinstance(document, dict) else None
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f'expected={path} has no "variants" (an object of variants, each with its root and numbers)')
    if variant not in variants:
        raise ConfigError(f"variant={variant!r}: {path} has {', '.join(variants)}")
    problem = variant_problem(variants[variant])
    if problem is not None:
        raise ConfigError(f"expected={path}: variant {variant!r} {problem}")
    return variants[variant]


def read_expected(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"expected={path} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"expected={path} is not UTF-8 text; give the recipe's expected.json") from None


def variant_problem(variant: Any) -> str | None:
    """What a variant lacks to be checked (its numbers, each with NUMBER_KEYS), or None."""
    if not isinstance(variant, dict):
        return "is not an object with root and numbers"
    if not isinstance(variant.get("root", ""), str):
        return 'has a "root" that is not a folder name'
    numbers = variant.get("numbers")
    if not isinstance(numbers, list) or not numbers:
        return 'has no "numbers" (a list of the numbers to check)'
    for i, entry in enumerate(numbers):
        lacking = [
            key for key, kind in NUMBER_KEYS.items() if not isinstance(entry, dict) or not is_a(entry.get(key), kind)
        ]
        if lacking:
            return f"numbers[{i}] lacks {', '.join(lacking)} (each number holds {', '.join(NUMBER_KEYS)})"
    return None


def is_a(value: Any, kind: type) -> bool:
    """Whether `value` is a `kind`: a number is an int or a float, never a bool."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def run_root(cfg: RecipeCheckConfig, variant: dict[str, Any]) -> Path:
    """The folder the recipe's commands wrote: root=, else the variant's own; one line when it does not exist."""
    if cfg.root:
        root, said = Path(cfg.root), f"root={cfg.root}"
    elif variant.get("root"):
        root, said = Path(variant["root"]), f"the root {variant['root']} that {cfg.expected} names"
    else:
        raise ConfigError(
            f"{cfg.expected} names no root for variant {cfg.variant!r}: give root= (the folder its runs wrote)"
        )
    if not root.is_dir():
        raise ConfigError(
            f"{said}: no such folder; run the recipe's commands first (its README.md), or give root= the folder "
            "they wrote"
        )
    return root


def checked_rows(root: Path, numbers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for number in numbers:
        measured = lookup(root, number)
        inside = measured is not None and number["low"] <= measured <= number["high"]
        given = {key: number[key] for key in ("name", "expected", "low", "high")}
        rows.append(given | {"measured": measured, "inside": inside})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["name"]) for r in rows)
    lines = [f"{'number':<{width}}  {'measured':>9}  {'expected':>9}  band"]
    for r in rows:
        measured = "missing" if r["measured"] is None else f"{r['measured']:.4f}"
        band = f"[{r['low']:g}, {r['high']:g}]  {'ok' if r['inside'] else 'OUT OF BAND'}"
        lines.append(f"{r['name']:<{width}}  {measured:>9}  {r['expected']:>9.4f}  {band}")
    return "\n".join(lines)


def run(cfg: RecipeCheckConfig) -> int:
    if not cfg.expected:
        raise ConfigError("recipe check needs expected= (a recipe folder or its expected.json)")
    variant = load_expected(Path(cfg.expected), cfg.variant)
    root = run_root(cfg, variant)
    rows = checked_rows(root, variant["numbers"])
    print(f"recipe {cfg.expected} ({cfg.variant}), runs in {root}:")
    print(table(rows))
    out = sum(not r["inside"] for r in rows)
    print(f"{len(rows) - out} of {len(rows)} numbers inside their bands" + (f"; {out} outside" if out else ""))
    return 1 if out else 0
