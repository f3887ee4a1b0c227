"""Module boundaries (DESIGN.md, layers): dependencies point downwards only, and no package file
outgrows 500 lines. Read from the import statements themselves (top level or inside a function), so
a boundary cannot be crossed silently by a late import."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlhfkit"
MAX_LINES = 500
# a file or folder of the package -> the packages none of its files may import
FORBIDDEN = {
    "eval": ("rlhfkit.trainers",),
    "data": ("rlhfkit.eval", "rlhfkit.trainers"),
    "scoring.py": ("rlhfkit.eval", "rlhfkit.trainers"),
    "plots.py": ("rlhfkit.eval", "rlhfkit.trainers"),
}


def imports_of(source: str, package: list[str]) -> list[tuple[int, str]]:
    """(line, module) of every import in `source`, a module of `package`, relative imports made
    absolute; `from m import n` gives both m and m.n, since n may be a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def file_imports(path: Path) -> list[tuple[int, str]]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return imports_of(path.read_text(), parts[:-1])  # an __init__.py's package is its folder, like a module's


def files_under(name: str) -> list[Path]:
    target = PACKAGE / name
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_relative_imports_are_resolved_against_the_importing_package():
    source = "from .. import ops\nfrom ..trainers.reward import run\n\ndef f():\n    from .rm_eval import run_eval\n"
    assert {module for _, module in imports_of(source, ["rlhfkit", "eval"])} == {
        "rlhfkit", "rlhfkit.ops", "rlhfkit.trainers.reward", "rlhfkit.trainers.reward.run", "rlhfkit.eval.rm_eval",
        "rlhfkit.eval.rm_eval.run_eval"}
    assert (5, "rlhfkit.eval.rm_eval") in imports_of(source, ["rlhfkit", "eval"])  # a late import counts too


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer):
    crossings = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
                 for path in files_under(layer) for line, module in file_imports(path)
                 if any(within(module, package) for package in FORBIDDEN[layer])]
    assert not crossings, "\n".join(crossings)


def test_no_package_file_over_500_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility: {long}"
