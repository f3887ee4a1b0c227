"""The shared data (../shared/data) and data the tests write for themselves."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLHFKIT_SHARED_DATA", REPO.parent / "shared" / "data"))


def data_file(*parts: str) -> Path:
    """A file of ../shared/data. Without it a test skips, saying why; under CI (CI=true) it fails, so a
    run whose data went missing cannot pass by skipping a third of the suite."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        missing = f"{path} not found: the tests expect ../shared/data beside the repository"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing} (CI=true: a missing data file fails instead of skipping)")
        pytest.skip(missing)
    return path


def first_lines(dest: Path, n: int, *parts: str) -> Path:
    """The first `n` lines of the gzipped shared-data file `parts`, written as a plain file at `dest`."""
    with gzip.open(data_file(*parts), "rt") as f:
        dest.write_text("".join(line for _, line in zip(range(n), f, strict=False)))
    return dest


def write_sft_csv(path: Path, rows: list[dict]) -> Path:
    """TL;DR SFT rows as a CSV file with the upstream columns (other keys are dropped)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["subreddit", "title", "post", "summary"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as a JSON-lines file at `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
