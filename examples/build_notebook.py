"""Write python_api.ipynb from python_api.py, whose cells are marked `# %%` (code) and `# %% [markdown]` (text whose
lines start with `# `), so that the notebook and the script cannot drift apart: edit the script, then run
`python examples/build_notebook.py`. tests/test_examples.py checks the notebook is the script's and runs both.
The notebook is written without outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SCRIPT, NOTEBOOK = HERE / "python_api.py", HERE / "python_api.ipynb"


def cells_of(script: str) -> list[tuple[str, str]]:
    """(kind, source) of each `# %%` cell of `script`: kind "markdown" or "code"."""
    cells = []
    for chunk in script.split("# %%")[1:]:
        header, _, body = chunk.partition("\n")
        if header.strip() == "[markdown]":
            text = [line[2:] if line.startswith("# ") else line.removeprefix("#") for line in body.strip().splitlines()]
            cells.append(("markdown", "\n".join(text)))
        else:
            cells.append(("code", body.strip()))
    return cells


def notebook_of(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        for kind, source in cells
    ]
    for number, cell in enumerate(notebook.cells):
        cell.id = f"cell-{number}"  # stable ids: the file changes only when a cell does
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def notebook_cells(path: Path) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nbformat.read(path, as_version=4).cells]


if __name__ == "__main__":
    nbformat.write(notebook_of(cells_of(SCRIPT.read_text())), NOTEBOOK)
    print(f"wrote {NOTEBOOK}", file=sys.stderr)
