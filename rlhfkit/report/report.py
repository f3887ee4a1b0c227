"""The one report builder: every stage and command writes its `report.html` through `Report`.

A report has the same sections in the same order whatever wrote it:
1. run summary (what ran, on what, for how long);
2. caveats: one line per reason not to take a number at face value, computed from the numbers
   themselves (`caveats.py`) and repeated in the note column beside the number it concerns;
3. headline numbers, each beside its trivial baseline (chance, always-prefer-longer, the policy
   before training) so that no number is read alone;
4. further tables, 5. figures, 6. samples, 7. the resolved configuration.

Every cell goes through `format_value`: numbers rounded to what they can carry, intervals as
"0.480 [0.41, 0.55]", "-" for a value that does not exist and "n/a" for one that is not a number;
nothing is ever shown as `None`, `inf` or JSON. Plots are embedded so the file can be mailed around.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..faults import room_for
from ..run_folder import read_resolved

PREVIEW_LINES, PREVIEW_CHARS = 3, 240  # a longer cell (a whole post) is collapsed behind its start
MISSING, NOT_A_NUMBER = "-", "n/a"
NON_NUMBERS = {"None", "nan", "NaN", "inf", "-inf", "+inf", "Infinity", "-Infinity"}  # Python's and JSON's spellings


@dataclass
class Number:
    """A headline number: `value` is a number, a (value, low, high) tuple (an interval) or text; `baseline` the
    trivial rule's value under the name `baseline_name`; `caveat` one line shown beside it."""

    metric: str
    value: Any
    baseline: Any = None
    baseline_name: str = ""
    caveat: str = ""


@dataclass
class Table:
    title: str
    rows: list[dict[str, Any]]
    columns: list[str] | None = None  # every key of the first row when not given

    def html(self) -> str:
        return table_html(self.rows, self.columns or (list(self.rows[0]) if self.rows else []))


@dataclass
class Report:
    """Collects the sections of one report; `write` renders them in the standard order."""

    title: str
    summary: dict[str, Any] = field(default_factory=dict)
    numbers: list[Number] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # those not tied to one headline number
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, Path]] = field(default_factory=list)
    samples: list[Table] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # trusted HTML (e.g. coloured tokens)
    config: str = ""

    def number(self, metric: str, value: Any, baseline: Any = None, baseline_name: str = "", caveat: str = "") -> None:
        self.numbers.append(Number(metric, value, baseline, baseline_name, caveat))

    def table(self, title: str, rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
        if rows:
            self.tables.append(Table(title, rows, columns))

    def figure(self, title: str, path: Path | None) -> None:
        if path is not None and Path(path).is_file():
            self.figures.append((title, Path(path)))

    def sample_table(self, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
        present = [c for c in columns if any(c in r for r in rows)]
        if rows and present:
            self.samples.append(Table(title, rows, present))

    def caveat(self, line: str) -> None:
        if line and line not in self.caveats:
            self.caveats.append(line)

    def all_caveats(self) -> list[str]:
        """Each distinct caveat once: those beside numbers prefixed with the numbers they concern."""
        concerned: dict[str, list[str]] = {}
        for n in self.numbers:
            if n.caveat:
                concerned.setdefault(n.caveat, []).append(n.metric)
        general = [c for c in self.caveats if c not in concerned]  # budget, sample size: they qualify every number
        return general + [f"{'; '.join(metrics)}: {caveat}" for caveat, metrics in concerned.items()]

    def body(self) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        if self.summary:
            parts.append(
                (
                    "Run summary",
                    table_html([{"what": k, "value": v} for k, v in self.summary.items()], ["what", "value"]),
                )
            )
        caveats = self.all_caveats()
        parts.append(("Caveats", caveats_html(caveats)))
        if self.numbers:
            parts.append(("Headline numbers beside their trivial baselines", numbers_html(self.numbers)))
        parts += [(t.title, t.html()) for t in self.tables]
        parts += self.sections
        parts += [(title, image_html(path)) for title, path in self.figures]
        parts += [(t.title, t.html()) for t in self.samples]
        if self.config:
            parts.append(
                (
                    "Configuration",
                    f"<details><summary>config.yaml</summary><pre>{html.escape(self.config)}</pre></details>",
                )
            )
        return parts

    def write(self, folder: Path) -> Path:
        """`report.html`, and beside it `report.json` with the headline numbers and caveats, which the
        pipeline's report gathers from every stage."""
        folder = Path(folder)
        resolved = read_resolved(folder)
        body = self.body() + resolved_section(resolved)
        record = {
            "title": self.title,
            "numbers": [finite(vars(n)) for n in self.numbers],
            "caveats": self.all_caveats(),
        } | ({"resolved": resolved} if resolved else {})
        size = sum(len(text) for _, text in body) + len(json.dumps(record, indent=2))
        again = f"run the command again (a training stage: with resume={folder})"
        with room_for(folder, "report.html and report.json", size, again):
            path = write_page(folder, self.title, body)
            (folder / "report.json").write_text(json.dumps(record, indent=2))
        return path

    def gather(self, stage: str, record: dict[str, Any]) -> None:
        """Another report's numbers and caveats (its `report.json`), each named after `stage`."""
        for n in record.get("numbers", []):
            value, baseline = (
                tuple(v) if isinstance(v, list) else v for v in (n["value"], n.get("baseline"))
            )  # JSON lost the tuples
            self.numbers.append(
                Number(f"{stage}: {n['metric']}", value, baseline, n.get("baseline_name", ""), n.get("caveat", ""))
            )
        for line in record.get("caveats", []):
            if not any(n.caveat and line.endswith(n.caveat) for n in self.numbers):
                self.caveat(f"{stage}: {line}")


def resolved_section(resolved: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run's `auto` options resolved to on its machine (resolved.yaml), which config.yaml leaves as
    `auto`: the facts that tell two machines' numbers apart."""
    if not resolved:
        return []
    rows = [{"setting": key, "value": setting_text(value)} for key, value in resolved.items()]
    return [("Settings resolved on this machine (resolved.yaml)", table_html(rows, ["setting", "value"]))]


def setting_text(value: Any) -> str:
    """A resolved setting as one cell: a per-model one (attention, shared_prefix) as `model: value, ...`."""
    if isinstance(value, dict):
        return ", ".join(f"{name}: {each}" for name, each in value.items())
    return str(value)


def caveats_html(lines: list[str]) -> str:
    if not lines:
        return ("<p>None of the checks fired (judge agreement, reward model against the length rule, scores and EOS "
                "rate against the start, alarms, training budget).</p>")
    return "<ul class='caveats'>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def numbers_html(numbers: list[Number]) -> str:
    rows = [
        {
            "metric": n.metric,
            "value": n.value,
            "trivial baseline": n.baseline_name or MISSING,
            "baseline value": n.baseline,
            "note": n.caveat,
        }
        for n in numbers
    ]
    return table_html(rows, ["metric", "value", "trivial baseline", "baseline value", "note"])


# ---------------------------------------------------------------------------------------------
# Cells


def format_number(value: float) -> str:
    """Digits a reader can use: 0.480, 1.23, 23.5, 87.8, 1,234; integers as integers."""
    if not math.isfinite(value):
        return NOT_A_NUMBER
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    if size >= 1e-3:
        return f"{value:.3f}"
    return f"{value:.1e}"


def format_interval(value: Any, low: Any, high: Any) -> str:
    if not all(isinstance(v, int | float) for v in (value, low, high)):
        return format_value(value)
    signed = min(value, low) < 0 < max(value, high)  # a difference either side of 0: every sign shown

    fraction = all(abs(v) <= 1 for v in (value, low, high))  # rates and accuracies: three decimals throughout

    def show(v: float) -> str:
        return ("+" if signed and v > 0 else "") + (f"{v:.3f}" if fraction else format_number(v))

    return f"{show(value)} [{show(low)}, {show(high)}]"


def format_value(value: Any) -> str:
    """Any table cell as text: see the module docstring."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return format_number(float(value))
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], int | float | None):
        return format_interval(*value)
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int | float | None) for v in value):
        return MISSING if None in value else f"[{format_number(value[0])}, {format_number(value[1])}]"
    if isinstance(value, dict):
        return "; ".join(f"{k} {format_value(v)}" for k, v in value.items()) or MISSING
    if isinstance(value, list):
        return ", ".join(format_value(v) for v in value) or MISSING
    text = str(value)
    return NOT_A_NUMBER if text.strip() in NON_NUMBERS else text


def table_html(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell_html(format_value(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def cell_html(text: str) -> str:
    """Short text as it is; long text as its first lines, the rest one click away, so a table of
    samples fits a screen."""
    lines = text.splitlines()
    if len(lines) <= PREVIEW_LINES and len(text) <= PREVIEW_CHARS:
        return html.escape(text)
    preview = "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS]
    return f"<details><summary>{html.escape(preview)} ...</summary>{html.escape(text)}</details>"


def key_values(mapping: dict[str, Any]) -> list[dict[str, Any]]:
    """A nested dictionary as (key, value) rows, inner keys joined by "/": a table instead of JSON."""
    rows: list[dict[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            rows += [{"key": f"{key}/{r['key']}", "value": r["value"]} for r in key_values(value)]
        else:
            rows.append({"key": str(key), "value": value})
    return rows


def image_html(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


STYLE = (
    "body{font-family:sans-serif;max-width:1300px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:13px;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:4px "
    "6px;vertical-align:top;white-space:pre-wrap;max-width:420px;text-align:left}"
    "th{background:#f4f4f4}img{max-width:100%;display:block;margin-bottom:1em}"
    "ul.caveats li{color:#8a4b00;margin-bottom:.3em}h2{border-bottom:1px solid "
    "#ddd;padding-bottom:.2em;margin-top:1.6em}"
)


def write_page(folder: Path, title: str, sections: list[tuple[str, str]]) -> Path:
    """`sections` are (heading, html) pairs, written as `folder/report.html`."""
    parts = [
        "<!DOCTYPE html><html><head><meta "
        f"charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
    ]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts += [f"<h2>{html.escape(h)}</h2>{body}" for h, body in sections]
    parts.append("</body></html>")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def config_text(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    return path.read_text() if path.is_file() else ""


def last_step(history: list[dict[str, Any]]) -> int:
    return int(max((r.get("step", 0) for r in history), default=0))


def trained_amount(history: list[dict[str, Any]], per_step: int) -> int:
    """Episodes where the stage logs them (on-policy), else optimizer steps x examples per step."""
    episodes = [r["episodes"] for r in history if isinstance(r.get("episodes"), int | float)]
    return int(max(episodes)) if episodes else last_step(history) * per_step


def training_summary(
    run_dir: Path, model: str, notes: list[str], history: list[dict[str, Any]], per_step: int, unit: str
) -> dict[str, Any]:
    # metrics are logged every log_every steps: a mean of the logged steps, not a sum
    seconds = [
        float(r[k])
        for r in history
        for k in ("perf/step_s", "perf/update_total_s")
        if isinstance(r.get(k), int | float)
    ]
    return {
        "run folder": str(run_dir),
        "model": model,
        "optimizer steps": last_step(history),
        f"{unit} trained on": trained_amount(history, per_step),
        "seconds per step (mean of the logged ones)": sum(seconds) / len(seconds) if seconds else None,
        "data": "\n".join(notes),
    }


def finite(value: Any) -> Any:
    """NaN and infinities as null, tuples as lists: strict JSON."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def scalar_items(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, number) for every number in nested dictionaries, e.g. ("policies/ppo/kl", 4.2)."""
    if isinstance(value, dict):
        return [item for key, inner in value.items() for item in scalar_items(inner, f"{prefix}{key}/")]
    return [(prefix.rstrip("/"), value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


def with_intervals(row: dict[str, Any]) -> dict[str, Any]:
    """`x`, `x_low` and `x_high` columns merged into one interval cell `x`."""
    merged = {}
    for key, value in row.items():
        if key.endswith(("_low", "_high")) and key.rsplit("_", 1)[0] in row:
            continue
        low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
        merged[key] = (value, low, high) if low is not None and high is not None else value
    return merged


def json_safe(value: Any) -> Any:
    """NaN/inf become null and numpy scalars plain numbers, so a command's JSON results are strict JSON."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
