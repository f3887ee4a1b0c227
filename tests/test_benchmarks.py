"""Smoke tests of the benchmark scripts (issue 10): each runs on a tiny model for a step or two and
prints its JSON line. Not timed: the numbers they print are only checked for shape."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(script: str, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_generation_benchmark_compares_with_transformers_generate_and_checks_greedy_outputs():
    rows = run_benchmark("generation.py", "--model", "tiny", "--batches", "1,3", "--repeats", "1", "--new-tokens", "6",
                         "--query-length", "160")
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        assert row["identical"] is True  # greedy decoding: token for token the same as generate's
        assert row["ours_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0 and row["speedup"] > 0
        assert row["ours_decoded_positions"] <= 6 and row["peak_memory_bytes"] > 0
