"""Helpers the test modules share (fixtures live in conftest.py): the shared data, every stage's tiny
options, commands for child processes, straight-versus-resumed runs, and a chat server that speaks the
OpenAI and Anthropic protocols."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlhfkit.environments import Environment, Reply

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("RLHFKIT_SHARED_DATA", REPO.parent / "shared" / "data"))

# ---------------------------------------------------------------- the shared data


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


# ---------------------------------------------------------------- a user's mistake through the command line


def one_error_line(argv: list[str], capsys) -> str:
    """The one stderr line of `rlhfkit ARGV`, which must exit with 2; the Python API, given the same command and
    options, must raise a user error with the same message (and leave the same files: the caller checks after)."""
    from rlhfkit.cli import main

    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rlhfkit: error: "), err
    message = lines[0].removeprefix("rlhfkit: error: ")
    raised = api_error(argv)
    capsys.readouterr()
    assert raised in (message, None), f"the CLI said:\n  {message}\nthe Python API raised:\n  {raised}"
    return lines[0]


def api_error(argv: list[str]) -> str | None:
    """The message of the user error `rlhfkit.run` raises for the command and options of `rlhfkit ARGV`; None for
    a command line the API has no counterpart of (its words or syntax are wrong, or the command takes no options)."""
    import rlhfkit
    from rlhfkit.cli import find_command, parse_args
    from rlhfkit.errors import UserError

    try:
        command, rest = find_command(argv)
        parsed = parse_args(command, rest)
    except UserError:
        return None
    if command.config is None or parsed.help:
        return None
    with pytest.raises(UserError) as raised:
        rlhfkit.run(
            command.name,
            preset=parsed.preset,
            config_file=parsed.config_file,
            num_processes=parsed.num_processes,
            **parsed.overrides,
        )
    return str(raised.value)


def files_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` (the lock aside) with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".rlhfkit.lock"}


# ---------------------------------------------------------------- every stage's tiny options

PRESETS = {
    "sft": "tldr-sft",
    "rm": "tldr-rm",
    "dpo": "tldr-dpo",
    "ppo": "tldr-ppo",
    "grpo": "tldr-grpo",
    "rloo": "tldr-rloo",
    "reinforce": "tldr-reinforce-pp",
    "pipeline": "quickstart",
}

# which entry of a test's inputs (the `ppo_dirs` fixture: policy, rm, posts, pairs) each stage option reads
ON_POLICY_INPUTS = {"model": "policy", "reward_model": "rm", "data": "posts"}
INPUTS = {
    "sft": {"model": "policy", "data": "posts"},
    "rm": {"model": "policy", "data": "pairs"},
    "dpo": {"model": "policy", "data": "pairs"},
    "ppo": ON_POLICY_INPUTS,
    "grpo": ON_POLICY_INPUTS,
    "rloo": ON_POLICY_INPUTS,
    "reinforce": ON_POLICY_INPUTS,
    "pipeline": {"model": "policy", "sft_data": "posts", "comparisons": "pairs"},
}

# a few rows per step on 2-layer d=64 models at a learning rate that moves them, nothing else logged
TINY_COMMON = {"max_query_length": 128, "learning_rate": 1e-3, "report_to": ""}
TINY_PAIRS = TINY_COMMON | {"validation_fraction": 0.2, "total_batch_size": 8, "micro_batch_size": 4, "eval_pairs": 0}
TINY_ON_POLICY = TINY_COMMON | {
    "validation_posts": 8,
    "eval_samples": 0,
    "total_batch_size": 8,
    "micro_batch_size": 4,
    "generation_batch_size": 8,
    "forward_batch_size": 4,
    "max_steps": 2,
    "max_response_length": 10,
    "sample_every": 0,
}
TINY_PIPELINE_STAGE = {"max_query_length": 128, "report_to": ""}
TINY = {
    "sft": TINY_COMMON | {"validation_posts": 8, "eval_samples": 0, "total_batch_size": 4, "micro_batch_size": 2},
    "rm": TINY_PAIRS | {"sft_data": ""},  # no reference summaries: the Detail 15 bias stays as trained
    "dpo": TINY_PAIRS | {"forward_batch_size": 4, "max_steps": 3, "eval_samples": 2},
    "ppo": TINY_ON_POLICY,
    "grpo": TINY_ON_POLICY | {"samples_per_prompt": 4},
    "rloo": TINY_ON_POLICY | {"samples_per_prompt": 4},
    "reinforce": TINY_ON_POLICY,
    "pipeline": {
        "eval_posts": 4,
        "sft": TINY_PIPELINE_STAGE
        | {"validation_posts": 8, "eval_samples": 0, "total_batch_size": 4, "micro_batch_size": 4, "max_steps": 2},
        "rm": TINY_PIPELINE_STAGE
        | {"total_batch_size": 4, "micro_batch_size": 2, "max_steps": 2, "eval_pairs": 8, "normalization_samples": 8},
        "ppo": TINY_PIPELINE_STAGE
        | {
            "validation_posts": 8,
            "eval_samples": 2,
            "total_batch_size": 4,
            "micro_batch_size": 4,
            "generation_batch_size": 4,
            "forward_batch_size": 4,
            "max_steps": 2,
            "max_response_length": 8,
            "save_every": 1,
        },
    },
}


def stage_args(stage: str, inputs: dict[str, Path], out: Path | None, **extra: Any) -> dict[str, Any]:
    """The options of a tiny, fast `stage` run on `inputs` (policy, rm, posts, pairs: those the stage
    reads) writing to `out`; `extra` options win. For `resolve(stage, ...)` or, through `cli_args`, a
    command line."""
    wired = {option: str(inputs[name]) for option, name in INPUTS[stage].items()}
    return wired | {"output_dir": str(out)} | TINY[stage] | extra


def cli_args(options: dict[str, Any]) -> list[str]:
    """`key=value` arguments; a mapping (a pipeline stage's options) in YAML flow style, as typed."""
    return [f"{key}={flow_yaml(value) if isinstance(value, dict) else value}" for key, value in options.items()]


def flow_yaml(mapping: dict) -> str:
    return yaml.safe_dump(mapping, default_flow_style=True, sort_keys=False, width=sys.maxsize).strip()


# ---------------------------------------------------------------- runs in child processes


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


def straight_and_resumed(stage: str, preset: str, args: dict, tmp_path: Path, kill_at: int) -> tuple[Path, Path]:
    """Run `rlhfkit <stage>` once straight through, and once SIGKILLed after checkpoint `kill_at`
    then resumed; return both run directories for comparison."""

    def command(out: Path, **extra) -> list[str]:
        return [stage, "--preset", preset, *cli_args(args | extra | {"output_dir": str(out)})]

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


# ---------------------------------------------------------------- a chat server for the API judges

JUDGE_TIMEOUT = 0.5  # seconds the tests give an API judge per request; the scripted "slow" reply takes twice as long


def preference_for(prompt: str) -> str:
    """The scripted judge: prefers whichever shown summary contains "good"."""
    shown_a = prompt.split("Summary A:\n", 1)[1].split("\n\nSummary B:", 1)[0]
    return f"Comparison: one summary is good.\nPreferred: {'A' if 'good' in shown_a else 'B'}"


class ProtocolServer:
    """A chat server on 127.0.0.1 speaking the OpenAI (`POST /v1/chat/completions`) or Anthropic
    (`POST /v1/messages`) protocol. Request n takes action `script[n]` ("ok" once the script runs out):

    ok            a well-formed reply with the text `reply(prompt)` (by default preferring the shown
                  summary that contains "good")
    429 / 500     that status (429 with `Retry-After: <retry_after>`)
    401           an authentication error whose body echoes the key, as some servers do
    slow          an ok reply after twice the client's timeout
    bad_json      status 200, JSON content type, a truncated body
    no_preferred  a well-formed reply without the `Preferred:` line
    echo_key      a well-formed reply whose text contains the key it was sent
    """

    def __init__(self, protocol: str, delay: float = 0.0, reply: Callable[[str], str] = preference_for):
        self.protocol = protocol
        self.delay = delay  # seconds every request takes, so concurrent requests overlap
        self.reply = reply
        self.script: list[str] = []
        self.retry_after = "0"
        self.bodies: list[dict] = []  # every request's JSON body, in arrival order
        self.keys_seen: set[str] = set()
        self.active = self.max_active = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), ProtocolHandler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        root = f"http://127.0.0.1:{self.httpd.server_port}"
        return root + "/v1" if self.protocol == "openai" else root  # the Anthropic SDK adds /v1 itself

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def prompts(self) -> list[str]:
        return [body["messages"][0]["content"] for body in self.bodies]

    def next_action(self, body: dict, key: str) -> str:
        with self.lock:
            self.bodies.append(body)
            self.keys_seen.add(key)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            return self.script.pop(0) if self.script else "ok"

    def finished(self) -> None:
        with self.lock:
            self.active -= 1

    def body(self, text: str) -> dict:
        if self.protocol == "openai":
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": "judge-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
            }
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "judge-model",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }


class ProtocolHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        server: ProtocolServer = self.server.owner
        expected = "/v1/chat/completions" if server.protocol == "openai" else "/v1/messages"
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
        action = server.next_action(request, key)
        try:
            time.sleep(server.delay + (2 * JUDGE_TIMEOUT if action == "slow" else 0))
            if self.path != expected:
                self.send(404, {"error": {"message": f"no route {self.path}"}})
            elif action in ("ok", "slow"):
                self.send(200, server.body(server.reply(request["messages"][0]["content"])))
            elif action == "no_preferred":
                self.send(200, server.body("Both summaries are fine."))
            elif action == "echo_key":
                self.send(200, server.body(f"You sent {key}.\nPreferred: A"))
            elif action == "bad_json":
                self.send_raw(200, b'{"choices": [{"message": ')
            elif action == "401":
                self.send(
                    401, {"error": {"type": "authentication_error", "message": f"Incorrect API key provided: {key}"}}
                )
            else:
                headers = {"Retry-After": server.retry_after} if action == "429" else {}
                self.send(int(action), {"error": {"type": "server_error", "message": f"scripted {action}"}}, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a slow reply
        finally:
            server.finished()

    def send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self.send_raw(status, json.dumps(payload).encode(), headers)

    def send_raw(self, status: int, data: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in {
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
            **(headers or {}),
        }.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass  # keep test output free of access logs


# ---------------------------------------------------------------- multi-process launches


def marked_processes(mark: str) -> dict[int, str]:
    """pid -> RANK ("" for none) of every process whose environment carries RLHFKIT_TEST_RUN=`mark`."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            variables = dict(v.partition("=")[::2] for v in environ.read_bytes().decode(errors="replace").split("\0"))
            if variables.get("RLHFKIT_TEST_RUN") == mark:
                found[int(environ.parent.name)] = variables.get("RANK", "")
    return found


def process_of_rank(mark: str, rank: int) -> int:
    [pid] = [pid for pid, r in marked_processes(mark).items() if r == str(rank)]
    return pid


def kill_marked(mark: str) -> None:
    """After a failed test: a launch's processes are not children of the test, so none may be left behind."""
    for pid in marked_processes(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path | None = None) -> None:
    """Until metrics.jsonl shows step `step` or later (step 0 is logged before the loop)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if metrics.exists() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise AssertionError(f"step {step} never logged: {log.read_text()[-3000:] if log else ''}")


@contextlib.contextmanager
def launched(stage: str, args: dict[str, Any], log: Path, processes: int = 2):
    """`rlhfkit <stage> --preset <its preset> ARGS --num-processes N` started with its output in `log`;
    yields (the launch, the mark its processes carry, for `process_of_rank`). No process of it outlives
    the block: they are not children of the test, so a failed test would leave them running."""
    mark = f"{os.getpid()}-{time.time_ns()}"
    command = rlhfkit_command(stage, "--preset", PRESETS[stage], *cli_args(args), "--num-processes", str(processes))
    with log.open("w") as output:
        proc = subprocess.Popen(
            command, env=launcher_env() | {"RLHFKIT_TEST_RUN": mark}, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            yield proc, mark
        finally:
            kill_marked(mark)
            if proc.poll() is None:
                proc.kill()


def run_in_this_process(stage: str, args: dict[str, Any]) -> Path:
    """`rlhfkit <stage> --preset <its preset> ARGS` on one process, in this one: a reference run needs no
    child process (and none of the seconds a child spends importing torch). Returns the run folder."""
    from rlhfkit.cli import main

    assert main([stage, "--preset", PRESETS[stage], *cli_args(args)]) == 0, f"{stage} {args}"
    return Path(args["output_dir"])


def launch(
    stage: str, args: dict[str, Any], processes: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`rlhfkit <stage> --preset <its preset> ARGS`, under `--num-processes N` when N > 1, run to the end. A
    launch past its time limit takes its processes with it, as `launched` does."""
    launcher = ["--num-processes", str(processes)] if processes > 1 else []
    mark = f"{os.getpid()}-{time.time_ns()}"
    try:
        return subprocess.run(
            rlhfkit_command(stage, "--preset", PRESETS[stage], *cli_args(args), *launcher),
            env=(env or launcher_env()) | {"RLHFKIT_TEST_RUN": mark},
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        kill_marked(mark)


def launched_straight_and_resumed(
    stage: str, args: dict[str, Any], tmp_path: Path, kill_after: int
) -> tuple[Path, Path]:
    """A 2-process `stage` run straight through (in args' output_dir), and the same SIGKILLed and resumed
    (`launched_killed_and_resumed`); returns both run directories for comparison."""
    done = launch(stage, args, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(args["output_dir"]), launched_killed_and_resumed(stage, args, tmp_path, kill_after)


def launched_killed_and_resumed(stage: str, args: dict[str, Any], tmp_path: Path, kill_after: int) -> Path:
    """A 2-process `stage` run with `args` in tmp_path/killed, SIGKILLed in the process that writes the
    checkpoints once step `kill_after` is logged, then resumed on 2 processes; returns its run directory."""
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    with launched(stage, args | {"output_dir": str(killed), "save_every": 1}, log) as (proc, mark):
        wait_for_step(proc, killed, kill_after, log)
        os.kill(process_of_rank(mark, 0), signal.SIGKILL)
        assert proc.wait(timeout=60) != 0
    resumed = subprocess.run(
        rlhfkit_command(stage, f"resume={killed}", "--num-processes", "2"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return killed


# ---------------------------------------------------------------- one update's gradient, however the batch is split


class GlooProcesses:
    """What the on-policy update asks of an accelerator, over an initialised gloo process group."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.process_index, self.num_processes = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.is_main_process = self.process_index == 0

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        out = tensor.clone()
        torch.distributed.all_reduce(
            out, torch.distributed.ReduceOp.MAX if reduction == "max" else torch.distributed.ReduceOp.SUM
        )
        return out

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        torch.distributed.all_gather(parts, tensor)
        return torch.cat(parts)

    def wait_for_everyone(self) -> None:
        torch.distributed.barrier()


def collected(models, prompts: list[list[int]], cfg, update: int, kl_coef: float, texts=None, stream=None, counts=None):
    """Update `update`'s rollout with its advantages, as `OnPolicySteps.step` collects it in one process
    without autocast; dynamic sampling's tallies go to `counts`."""
    from rlhfkit.onpolicy.advantages import compute_advantages
    from rlhfkit.onpolicy.collect import RolloutSetup, collect

    batch = collect(RolloutSetup(models, prompts, cfg, "no", texts=texts), update, {}, stream=stream, counts=counts)
    return compute_advantages(batch, cfg, kl_coef)


def synthetic_rollout(policy, pad_id: int, temperature: float, seed: int = 0, group: int = 2):
    """8 episodes, `group` samples of each prompt, with responses of 1 to 6 tokens (three cut at 6
    without EOS), a left-padded first query, rollout log-probabilities a little off the policy's
    (ratios != 1, some clipped), a reference further off, and per-sequence advantages with per-token
    noise."""
    from rlhfkit.onpolicy.scoring import policy_logprobs
    from rlhfkit.rollout import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    rows, width = 8, 6
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    query_ids = torch.randint(10, policy.config.vocab_size - 1, (rows // group, 4), generator=g)
    query_ids = query_ids.repeat_interleave(group, dim=0)
    query_mask = torch.ones(rows, 4, dtype=torch.long)
    query_mask[:group, :2] = 0
    query_ids[:group, :2] = pad_id
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    responses = torch.randint(10, policy.config.vocab_size - 1, (rows, width), generator=g).masked_fill(~mask, pad_id)
    batch = RolloutBatch(torch.arange(rows) // group, query_ids, query_mask, responses, mask, lengths < width)
    with torch.no_grad():
        current = policy_logprobs(policy, batch, temperature)[0]
    noise = lambda scale: scale * torch.randn(rows, width, generator=g)  # noqa: E731
    advantages = torch.randn(rows, 1, generator=g) + noise(0.3)
    batch.logprobs = (current + noise(0.15)) * mask
    batch.ref_logprobs = (current + noise(0.3)) * mask
    batch.advantages = advantages * mask
    return batch


def one_update_gradient(
    model_dir: Path, options: dict[str, Any], micro_batch_size: int, accelerator=None, lora_rank: int = 0
) -> dict[str, torch.Tensor]:
    """The gradient of one update's loss on `synthetic_rollout` under the GRPO config with `options`:
    the weights' change under SGD at learning rate 1, with `micro_batch_size` rows per pass and the
    rows of the processes of `accelerator` (None: one process). With `lora_rank`, of a LoRA adapter
    (seeded values, its B not zero, as after some training) on the frozen policy: the adapter's change."""
    import dataclasses

    from rlhfkit.config import GRPOConfig
    from rlhfkit.distributed import ONE_PROCESS
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.scoring import OnPolicyModels
    from rlhfkit.onpolicy.update import Optimizers, update_on_rollout

    defaults = {"num_minibatches": 1, "update_epochs": 1, "kl_coef": 0.1, "kl_placement": "loss", "entropy_coef": 0.01}
    cfg = dataclasses.replace(
        GRPOConfig(), **(defaults | options), micro_batch_size=micro_batch_size, max_response_length=6
    )
    policy, tokenizer = load_policy(str(model_dir))
    if lora_rank:
        from rlhfkit.adapters import add_adapter
        from rlhfkit.config import LoraOptions

        policy = add_adapter(policy, LoraOptions(rank=lora_rank, alpha=2 * lora_rank, dropout=0.0, target_modules=[]))
        generator = torch.Generator().manual_seed(0)
        for name, param in policy.named_parameters():
            if "lora_" in name:  # the same adapter in every call, its B not zero
                param.data = 0.1 * torch.randn(param.shape, generator=generator)
    policy.train()
    batch = synthetic_rollout(policy, tokenizer.pad_token_id, cfg.temperature, group=cfg.samples_per_prompt)
    before = {k: v.detach().clone() for k, v in policy.named_parameters() if v.requires_grad}
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    models = OnPolicyModels(policy, policy, None, None, tokenizer)
    update_on_rollout(models, optimizers, batch, cfg, 1, "no", cfg.kl_coef, accelerator or ONE_PROCESS)
    return {k: before[k] - v.detach() for k, v in policy.named_parameters() if k in before}


def k1_update(model_dir: Path, reuse: bool, options: dict[str, Any] | None = None, accelerator=None):
    """(gradient, metrics, old log-probabilities) of one K = 1 GRPO update (SGD at learning rate 1) on
    `synthetic_rollout` with old log-probabilities that are the policy's own: from a separate pass, or
    (`reuse`) from the update's forward, summed across the processes of `accelerator`."""
    import dataclasses

    from rlhfkit.config import GRPOConfig
    from rlhfkit.distributed import ONE_PROCESS
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.scoring import OnPolicyModels, policy_logprobs
    from rlhfkit.onpolicy.update import Optimizers, update_on_rollout

    cfg = dataclasses.replace(
        GRPOConfig(), update_epochs=1, num_minibatches=1, micro_batch_size=4, kl_coef=0.1, max_response_length=6,
        **(options or {}),
    )
    policy, tokenizer = load_policy(str(model_dir))
    policy.train()
    batch = synthetic_rollout(policy, tokenizer.pad_token_id, cfg.temperature, group=cfg.samples_per_prompt)
    with torch.no_grad():
        batch.logprobs = policy_logprobs(policy, batch, cfg.temperature)[0] * batch.mask
    old = torch.zeros_like(batch.logprobs) if reuse else None
    if reuse:
        batch.logprobs = None
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    models = OnPolicyModels(policy, policy, None, None, tokenizer)
    metrics = update_on_rollout(
        models, optimizers, batch, cfg, 1, "no", cfg.kl_coef, accelerator or ONE_PROCESS, old_logprobs=old
    )
    gradient = {k: before[k] - v.detach() for k, v in policy.named_parameters()}
    return gradient, metrics, old if reuse else batch.logprobs


def k1_reuse_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """A gloo process of `world`: `k1_update` with reuse; process 0 saves (gradient, old log-probabilities)."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gradient, _, old = k1_update(Path(model_dir), reuse=True, accelerator=GlooProcesses())
        if rank == 0:
            torch.save((gradient, old), out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def assert_same_gradient(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    """Two `one_update_gradient`s agree up to float32 summation order, and the update moved something."""
    scale = max(float(w.abs().max()) for w in want.values())
    assert scale > 1e-4, "the update moved nothing: the comparison would prove nothing"
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6 * max(1.0, scale), rtol=1e-4, msg=f"{what}: {key}")


def split_invariance_worker(
    rank: int, world: int, port: int, model_dir: str, cases: list[dict[str, Any]], micro: int, out: str
) -> None:
    """A gloo process of `world`: the gradient of every case in `cases`; process 0 saves them to `out`."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gradients = [one_update_gradient(Path(model_dir), case, micro, GlooProcesses()) for case in cases]
        if rank == 0:
            torch.save(gradients, out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def rollout_setup(stage: str, inputs: dict[str, Any], out: Path, preset: str | None = None, **extra: Any):
    """(config, models, training prompts' ids, PromptTexts) of a tiny `stage` run on `inputs`
    (`stage_args`), loaded as the trainer loads them, on the CPU."""
    from rlhfkit.onpolicy import evaluation, trainer
    from rlhfkit.stages import resolve

    cfg = resolve(stage, preset or PRESETS[stage], None, stage_args(stage, inputs, out, **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, [e.query.ids for e in train], trainer.PromptTexts.of(train)


def sampled_rollout(setup, update: int = 0, accelerator=None):
    """Update `update`'s rollout (sampled, scored, gathered across `accelerator`'s processes) of
    `rollout_setup`'s run, in fp32."""
    from rlhfkit.distributed import ONE_PROCESS
    from rlhfkit.onpolicy.collect import RolloutSetup, collect

    cfg, models, prompts, texts = setup
    return collect(RolloutSetup(models, prompts, cfg, "no", accelerator or ONE_PROCESS, texts), update, {})


def sampled_rollout_worker(rank: int, world: int, port: int, cases: list, out: str) -> None:
    """A gloo process of `world`: the rollout of every (stage, inputs, options) of `cases` at update 1;
    process 0 saves each one's (prompts, responses, mask) to `out`."""
    import tempfile

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rollouts = []
        for stage, inputs, options in cases:
            with tempfile.TemporaryDirectory() as folder:
                setup = rollout_setup(stage, inputs, Path(folder) / "run", **options)
                batch = sampled_rollout(setup, 1, GlooProcesses())
            rollouts.append((batch.prompts, batch.responses, batch.mask))
        if rank == 0:
            torch.save(rollouts, out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# ---------------------------------------------------------------- decoding


class SamplingLogprobs:
    """The log-probability of each token `generation.generate` picks, under the logits it was picked
    from at the sampling temperature: the decoding steps' own numbers, which generation keeps no copy
    of (the trainers recompute log-probabilities in one forward pass). Tests compare two ways of
    decoding, or decoding and that forward pass, by them."""

    def __init__(self, monkeypatch):
        from rlhfkit import generation
        from rlhfkit.ops import logprobs_from_logits

        self.steps: list[torch.Tensor] = []
        pick_next = generation.pick_next

        def recording(logits, params, generators, pad_id=None):
            token = pick_next(logits, params, generators, pad_id)
            self.steps.append(logprobs_from_logits(logits, token, params.temperature))
            return token

        monkeypatch.setattr(generation, "pick_next", recording)

    def of(self, run) -> torch.Tensor:
        """(B, R) for `run`, the latest `generate` call's result; 0 after each row's EOS. Forgets them."""
        width = run.responses.size(1)
        logprobs = torch.stack(self.steps[-width:], dim=1)  # after a fallback to eager steps, the eager pass's
        self.steps.clear()
        return logprobs * (torch.arange(width, device=logprobs.device).unsqueeze(0) < run.lengths.unsqueeze(1))


def staggered_eos_model(rows: int = 8, finish_at: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7), seed: int = 0):
    """(model, tokenizer, query ids, query mask, eos id): a tiny random Llama whose greedy answers to
    `rows` random left-padded queries emit EOS at the steps `finish_at` (row i at finish_at[i], the last
    rows never), so rows finish one by one and decoding passes through every smaller bucket.

    Weights drawn wide make every row's greedy answer differ; then the (tied) embedding of a token no
    query holds is solved for (least squares) so that its logit is +30 at each row's chosen step and -30
    at every step before it; it is never an input before it is emitted, so nothing earlier changes."""
    from rlhfkit.data.collate import left_pad_queries
    from rlhfkit.generation import SamplingParams, generate
    from rlhfkit.tiny_models import tiny_policy

    model, tokenizer = tiny_policy(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.5, generator=generator)
    model.eval()
    lengths = torch.randint(5, 30, (rows,), generator=generator).tolist()
    queries = [torch.randint(100, 40000, (n,), generator=generator).tolist() for n in lengths]
    batch = left_pad_queries(queries, tokenizer.pad_token_id)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    eos, steps = 49000, max(finish_at) + 2
    probe = generate(
        model,
        ids,
        mask,
        SamplingParams(max_new_tokens=steps, temperature=0, decoding="eager"),
        -1,
        tokenizer.pad_token_id,
    )
    with torch.no_grad():
        hidden = model.model(
            input_ids=torch.cat([ids, probe.responses], dim=1),
            attention_mask=torch.cat([mask, torch.ones_like(probe.responses)], dim=1),
        ).last_hidden_state
        states, targets = [], []
        for row in range(rows):
            last = finish_at[row] if row < len(finish_at) else steps - 1
            for step in range(last + 1):
                states.append(hidden[row, ids.size(1) - 1 + step])
                targets.append(30.0 if row < len(finish_at) and step == last else -30.0)
        solved = torch.linalg.lstsq(
            torch.stack(states).double(), torch.tensor(targets, dtype=torch.float64).unsqueeze(1)
        ).solution
        model.get_input_embeddings().weight[eos] = solved.squeeze(1).float()
    return model, tokenizer, ids, mask, eos


SYNCING = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.unique,
    torch.Tensor.unique,
}


class HostSyncDetector(torch.overrides.TorchFunctionMode):
    """Raises on any call that makes the host wait for a CUDA device's result (a Python number, a
    data-dependent shape, an explicit copy to the host): what a CUDA graph cannot record. Seen on a CPU
    too, where every tensor is already on the host (so `.to(device)` cannot be told apart there)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked_index = func is torch.Tensor.__getitem__ and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
        )
        if func in SYNCING or masked_index:
            raise AssertionError(f"host synchronisation: {getattr(func, '__name__', func)}")
        return func(*args, **kwargs)


class FixedTextEnv(Environment):
    """A test environment: every `pause_every` sampled tokens (0: never) it inserts `tool_text` inside the
    policy's turn; each turn the policy ends with EOS it answers with the user message `text`, `user_turns`
    times, then ends the episode, rewarding it (policy tokens of its last turn) mod 3."""

    component_names = ("insertions",)
    has_reward = True

    def __init__(self, start, tokenizer, user_turns: int = 2, pause_every: int = 0, text: str = "Fixed reply.",
                 tool_text: str = " [ok]"):
        super().__init__(start, tokenizer)
        self.user_turns, self.pause_every, self.text, self.tool_text = user_turns, pause_every, text, tool_text
        self.seen = self.insertions = 0

    def components(self):
        return {"insertions": self.insertions}

    def pauses_after(self, turn_text: str) -> bool:
        self.seen += 1
        return bool(self.pause_every) and self.seen % self.pause_every == 0

    def respond(self, turn_ids, turn_text, ended_by_eos):
        self.insertions += 1
        if not ended_by_eos:
            return self.inline(self.tool_text)
        if not self.user_turns:
            return Reply.end(reward=float(len(turn_ids) % 3))
        self.user_turns -= 1
        return self.message("user", self.text)


def eos_prone_policy(seed: int = 0, eos_logit: float = 6.0):
    """(model, tokenizer): a tiny random Llama (untied head) that ends a turn with EOS about one step in
    ten: every token's embedding carries a large constant in dimension 0, so the final hidden state does
    too, and only EOS's head row reads that dimension, so EOS's logit is about `eos_logit` everywhere."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.models import disable_dropout, load_tokenizer
    from rlhfkit.tiny_models import tiny_config
    from rlhfkit.vocab import match_vocab

    tokenizer = load_tokenizer("smollm2-135m")
    config = tiny_config(tokenizer)
    config.tie_word_embeddings = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    match_vocab(model, tokenizer)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 1.0
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        head[tokenizer.eos_token_id, 0] = eos_logit / config.hidden_size**0.5
    return disable_dropout(model), tokenizer


CHAT_PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Tell me a joke about cats, please."}],
]


def episode_setup(tokenizer, prompts=CHAT_PROMPTS):
    """(query ids, PromptTexts) of chat `prompts`, as an on-policy run reads them."""
    from rlhfkit.data.formats import encode_rendered, render_chat
    from rlhfkit.onpolicy.scoring import PromptTexts

    queries = [encode_rendered(tokenizer, render_chat(tokenizer, p)) for p in prompts]
    return queries, PromptTexts(list(prompts), [{} for _ in prompts], [f"prompt {i}" for i in range(len(prompts))])


def sample_fixed_episodes(model, tokenizer, budget: int = 60, group: int = 4, seed: int = 0, check: bool = True,
                          decoding: str = "eager", temperature: float = 0.7, **env_args):
    """`group` FixedTextEnv episodes of each of `CHAT_PROMPTS`, sampled as an on-policy run samples them."""
    from rlhfkit.environments import EpisodePlan, EpisodePrompt
    from rlhfkit.generation import SampleKeys, SamplingParams, sample_responses

    queries, texts = episode_setup(tokenizer)
    plan = EpisodePlan(FixedTextEnv, env_args, max_turns=8, timeout=0.0, check_tokens=check, run_seed=seed)
    params = SamplingParams(max_new_tokens=budget, temperature=temperature, decoding=decoding)
    with torch.no_grad():
        return sample_responses(model, queries, params, tokenizer, 2 * group,
                                SampleKeys(seed), samples_per_prompt=group,
                                episodes=plan, prompts=[EpisodePrompt(prompt, {}) for prompt in texts.prompts])


def environment_run_models(model, tokenizer, cfg):
    """OnPolicyModels of an environment-rewarded run: `model` trained, an identical frozen reference."""
    import copy

    from rlhfkit.environments import episode_plan
    from rlhfkit.onpolicy.scoring import OnPolicyModels, RewardSources

    reference = copy.deepcopy(model).eval().requires_grad_(False)
    return OnPolicyModels(
        model, reference, None, None, tokenizer, RewardSources.from_config(cfg), episode_plan(cfg.episode_options)
    )
