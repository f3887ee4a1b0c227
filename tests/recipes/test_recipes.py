"""Each recipe's short version (`recipes/<name>/run.sh short`), run as a user runs it and held against its own
expected bands by its last command (`rlhfkit recipe check`): a change that stops the embedded model from learning
fails here. With learning switched off (`run.sh short learning_rate=0`) the check exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.data import REPO
from ..support.processes import child_env

pytestmark = pytest.mark.slow


def recipes_with_a_short_version() -> list[str]:
    return sorted(
        path.parent.name
        for path in (REPO / "recipes").glob("*/expected.json")
        if "short" in json.loads(path.read_text())["variants"]
    )


@pytest.mark.parametrize("recipe", recipes_with_a_short_version())
def test_the_short_version_of_each_recipe_ends_inside_its_expected_bands(recipe, tmp_path):
    env = child_env() | {"ROOT": str(tmp_path / "runs"), "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                         f"{os.environ['PATH']}"}
    run = subprocess.run(
        ["bash", f"recipes/{recipe}/run.sh", "short"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    report = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    assert "numbers inside their bands" in run.stdout and "OUT OF BAND" not in run.stdout, report
