"""benchmarks/gpu_suite.sh run as a child, the way a device call runs it, and the JSON lines it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_suite.sh"


def run_gpu_suite(
    *args: str, env: dict[str, str], timeout: float = 600
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """(the finished run, the JSON lines it printed). `env` adds to this process's environment; the suite's
    `python3` is this interpreter, as on the GPU machine it is the image's."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", str(SUITE), *args],
        env=os.environ | {"PATH": path, "TQDM_DISABLE": "1"} | env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
