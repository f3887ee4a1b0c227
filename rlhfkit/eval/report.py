"""Run reports: a self-contained `report.html` (plots embedded), its HTML tables and images.
The figures themselves are drawn in `plots.py`."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

PREVIEW_LINES, PREVIEW_CHARS = 3, 240  # a longer cell (a whole post) is collapsed behind its start


def table_html(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell_html(format_cell(r.get(c, '')))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def cell_html(text: str) -> str:
    """Short text as it is; long text as its first lines, the rest one click away, so a table of
    samples fits a screen."""
    lines = text.splitlines()
    if len(lines) <= PREVIEW_LINES and len(text) <= PREVIEW_CHARS:
        return html.escape(text)
    preview = "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS]
    return f"<details><summary>{html.escape(preview)} ...</summary>{html.escape(text)}</details>"


def format_cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def image_html(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def write_report(run_dir: Path, title: str, sections: list[tuple[str, str]]) -> Path:
    """`sections` are (heading, html) pairs; plots are embedded so the file can be mailed around."""
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px;vertical-align:top;"
        "white-space:pre-wrap;max-width:420px}img{max-width:100%}"
    )
    parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>"]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts += [f"<h2>{html.escape(h)}</h2>{body}" for h, body in sections]
    parts.append("</body></html>")
    path = run_dir / "report.html"
    path.write_text("\n".join(parts))
    return path
