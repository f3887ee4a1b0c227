"""Runs in child processes: forked and killed runs, straight and resumed runs compared file by file."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from .tiny import cli_args


def child_env() -> dict[str, str]:
    """This process's environment for a child run: no progress bars, one thread."""
    return {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}


def rlhfkit_command(*args: str) -> list[str]:
    """`python -m rlhfkit ARGS`, for a run in a child process."""
    return [sys.executable, "-m", "rlhfkit", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_env() -> dict[str, str]:
    """The environment of a child run under `--num-processes N`: none of this process's launcher
    variables, and a port of its own so that runs never meet."""
    env = {k: v for k, v in child_env().items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    return env | {"RLHFKIT_PORT": str(free_port())}


# one-process runs forked from a warm process: each `python -m rlhfkit` child spends about 5 of its seconds
# importing torch, transformers and rlhfkit; a child forked from a process that imported them once is a
# process all the same (a SIGKILL kills it, an exit code ends it) and starts in a fraction of a second

WARM_MODULES = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.tokenization_auto",
    "matplotlib.pyplot",
    "rlhfkit.api",
    "rlhfkit.checkpoint",
    "rlhfkit.cli",
    "rlhfkit.stages",
]


class ForkedRun:
    """`rlhfkit ARGS` in a child forked from the warm process, its output in files; `poll`, `wait`, `kill`
    and `returncode` as a `subprocess.Popen` has them (a signal's death is minus its number)."""

    def __init__(self, args: list[str], env: dict[str, str], output: Path):
        self.stdout_path, self.stderr_path = output.with_suffix(".stdout"), output.with_suffix(".stderr")
        self.process = warm_context().Process(
            target=forked_main, args=(args, env, str(self.stdout_path), str(self.stderr_path))
        )
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(["rlhfkit"], timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def outputs(self) -> tuple[str, str]:
        return self.stdout_path.read_text(errors="replace"), self.stderr_path.read_text(errors="replace")


@functools.cache
def warm_context():
    """The forkserver context of this test process, started once with WARM_MODULES imported and the
    environment of child runs (tqdm reads its variables when it is imported)."""
    import multiprocessing
    import multiprocessing.forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WARM_MODULES)
    saved = dict(os.environ)
    os.environ.update(child_env() | {"MPLBACKEND": "Agg"})
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return context


def forked_main(args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """The child's body: this run's environment and output files, one thread as `child_env` asks, the
    command, then the exit handlers that `python -m rlhfkit` would run (multiprocessing's children skip them)."""
    import atexit

    from rlhfkit.cli import main

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    try:
        code = main(args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    sys.exit(code)


def start_forked(args: list[str], output: Path, env: dict[str, str] | None = None) -> ForkedRun:
    """`rlhfkit ARGS` started in a forked child (its stdout and stderr beside `output`)."""
    return ForkedRun(list(args), env or child_env(), output)


def run_forked(
    args: list[str], output: Path, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """`rlhfkit ARGS` run to its end in a forked child; its exit code and output as `subprocess.run` gives them."""
    child = start_forked(args, output, env)
    code = child.wait(timeout=600)
    stdout, stderr = child.outputs()
    done = subprocess.CompletedProcess(["rlhfkit", *args], code, stdout, stderr)
    if check:
        assert code == 0, f"rlhfkit {' '.join(args)} ended {code}: {stderr[-3000:]}"
    return done


def kill_after_checkpoint(args: list[str], run_dir: Path, step: int, env: dict[str, str]) -> int:
    """Start `rlhfkit ARGS`, SIGKILL it as soon as its checkpoint `step` (or a later one) is complete, and
    return the step of the newest complete checkpoint it left."""
    proc = start_forked(args, run_dir.with_name(run_dir.name + "-killed"), env)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and json.loads(latest.read_text())["step"] >= step:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.kill()
    proc.wait()
    return json.loads(latest.read_text())["step"]


def straight_and_resumed(
    stage: str, preset: str | None, args: dict, tmp_path: Path, kill_at: int
) -> tuple[Path, Path]:
    """Run `rlhfkit <stage>` (under `preset`, when one is named) once straight through, and once SIGKILLed after
    checkpoint `kill_at` then resumed; return both run directories for comparison."""

    def command(out: Path, **extra) -> list[str]:
        chosen = ["--preset", preset] if preset else []
        return [stage, *chosen, *cli_args(args | extra | {"output_dir": str(out)})]

    env, straight, killed = child_env(), tmp_path / "straight", tmp_path / "killed"
    run_forked(command(straight), tmp_path / "straight-log", env, check=True)
    kill_after_checkpoint(command(killed, save_every=1), killed, kill_at, env)
    run_forked([stage, f"resume={killed}"], tmp_path / "resumed-log", env, check=True)
    return straight, killed


def assert_same_files(a: Path, b: Path, files: list[str]) -> None:
    from safetensors.torch import load_file

    for name in files:
        left, right = load_file(a / name), load_file(b / name)
        assert left.keys() == right.keys(), name
        for key in left:
            assert torch.equal(left[key], right[key]), (name, key)


def assert_same_metrics(a: Path, b: Path, steps: int) -> list[dict]:
    """Every logged number but the timings is identical; returns the straight run's rows."""
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (a, b)]
    assert sorted({r["step"] for r in rows[1]}) == sorted({r["step"] for r in rows[0]})
    assert max(r["step"] for r in rows[1]) == steps
    for left, right in zip(*rows, strict=True):
        drop = ("perf/",)
        assert {k: v for k, v in left.items() if not k.startswith(drop)} == {
            k: v for k, v in right.items() if not k.startswith(drop)
        }
    return rows[0]


def sft_losses_on_fixed_batch(model, batch, lr: float, steps: int) -> list[float]:
    """Per-token SFT loss after each of `steps` AdamW steps on the same batch."""
    from rlhfkit.trainers.sft import sft_loss

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-5)
    losses = []
    for _ in range(steps):
        loss_sum, _ = sft_loss(model, batch)
        loss = loss_sum / batch["loss_units"].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
