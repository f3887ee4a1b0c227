"""examples/: the Python API notebook is its script's cells, runs top to bottom in a real Jupyter kernel (nbclient),
shows its tables and plots inline, and trains exactly what the script trains."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from ..support.data import DATA, REPO
from ..support.processes import assert_same_metrics

EXAMPLES = REPO / "examples"
STEPS = {"sft": 6, "rm": 2, "ppo": 2, "grpo": 2}  # each stage's max_steps in the example at EXAMPLE_SIZE=tiny


def build_notebook_module():
    spec = importlib.util.spec_from_file_location("build_notebook", EXAMPLES / "build_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_notebook_is_the_scripts_cells_without_outputs():
    build = build_notebook_module()
    assert build.notebook_cells(build.NOTEBOOK) == build.cells_of(build.SCRIPT.read_text()), (
        "examples/python_api.ipynb differs from python_api.py: run `python examples/build_notebook.py`"
    )
    notebook = nbformat.read(build.NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.slow  # about 2 minutes: the script's runs, then the notebook's
def test_the_notebook_runs_in_a_kernel_and_trains_bit_identically_to_the_script(tmp_path, monkeypatch):
    # one thread each, as every child run of the suite: with a test beside it on each core, more threads only wait
    environment = {"RLHFKIT_SHARED_DATA": str(DATA), "MPLBACKEND": "Agg", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    script_out, notebook_out = tmp_path / "script", tmp_path / "notebook"
    script = subprocess.run(
        [sys.executable, "python_api.py"],
        cwd=EXAMPLES,
        env=os.environ | environment | {"EXAMPLE_OUT": str(script_out)},
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stderr[-3000:]
    for key, value in (environment | {"EXAMPLE_OUT": str(notebook_out)}).items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    monkeypatch.delenv("MPLBACKEND")  # a kernel draws inline by default
    notebook = nbformat.read(EXAMPLES / "python_api.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    ).execute()

    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert any("text/html" in o.get("data", {}) and "objective/kl" in o["data"]["text/html"] for o in outputs)
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # the PPO and GRPO plots, inline
    for stage, steps in STEPS.items():
        script_run, notebook_run = script_out / stage, notebook_out / stage
        assert_same_metrics(script_run, notebook_run, steps)
        weights = sorted((script_run / "model").glob("*.safetensors"))
        assert weights, stage
        for path in weights:
            assert (notebook_run / "model" / path.name).read_bytes() == path.read_bytes(), (stage, path.name)
