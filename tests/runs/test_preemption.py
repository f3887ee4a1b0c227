"""Preemption: SIGTERM / SIGINT during training finish the step, write a checkpoint,
print how to resume and exit 143 / 130; resuming ends exactly where an uninterrupted run does. A signal inside
a reward function, in the final evaluation or in DPO's reference pass stops the run as well."""

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.preemption import Interrupted, StopSignal, interruptible, resume_command
from rlhfkit.runlock import LOCK_FILE

from ..support.launches import launched, process_of_rank, wait_for_step
from ..support.processes import assert_same_files, assert_same_metrics, child_env, rlhfkit_command
from ..support.tiny import PRESETS, cli_args, preset_command, stage_args

SFT_STEPS = 6
STOPPED = re.compile(
    r"^rlhfkit: stopped by (\w+) after (step|update) (\d+); checkpoint written to (.+); resume with: (.+)$", re.M
)


def sft_command(dirs, out: Path) -> list[str]:
    return rlhfkit_command("sft", *cli_args(stage_args("sft", dirs, out, max_steps=SFT_STEPS, log_every=1)))


def interrupt_after_first_step(command: list[str], run_dir: Path, signum: int) -> tuple[int, str]:
    """Start `command`, send it `signum` once it is inside the training loop, and return its exit code and output."""
    log = run_dir.parent / f"{run_dir.name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=child_env(), stdout=out, stderr=subprocess.STDOUT)
        wait_for_step(proc, run_dir, 1, log)
        proc.send_signal(signum)
        proc.wait(timeout=300)
    return proc.returncode, log.read_text()


def latest_step(run_dir: Path) -> int:
    return json.loads((run_dir / "checkpoints" / "latest").read_text())["step"]


@pytest.fixture(scope="module")
def straight_sft(ppo_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run(sft_command(ppo_dirs, out), check=True, env=child_env(), capture_output=True)
    return out


# a signal, a checkpoint and a resume in child processes: the fault-injection suite; the default run keeps
# tests/onpolicy/test_distributed.py's SIGTERM to one of two processes
@pytest.mark.faults
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_sft_checkpoints_exits_and_resumes_bit_identical(ppo_dirs, straight_sft, tmp_path, signum, code):
    out = tmp_path / "run"
    returncode, output = interrupt_after_first_step(sft_command(ppo_dirs, out), out, signum)
    assert returncode == code, output[-3000:]
    stopped = STOPPED.findall(output)
    assert len(stopped) == 1, output[-3000:]
    name, unit, step, checkpoints, resume = stopped[0]
    assert (name, unit, checkpoints) == (signal.Signals(signum).name, "step", str(out / "checkpoints"))
    assert 1 <= int(step) < SFT_STEPS and latest_step(out) == int(step)
    assert resume == f"rlhfkit sft resume={out}"
    assert "Traceback" not in output and not (out / LOCK_FILE).exists()

    subprocess.run(
        rlhfkit_command(*shlex.split(resume)[1:]), check=True, env=child_env(), capture_output=True
    )  # the printed command
    assert_same_files(straight_sft, out, ["model/model.safetensors"])
    assert_same_metrics(straight_sft, out, SFT_STEPS)


@pytest.mark.faults  # a signal to a launched process; tests/onpolicy/test_distributed.py keeps one in the default run
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the launched processes through /proc")
def test_sigterm_to_one_of_two_processes_stops_both_after_the_same_step(ppo_dirs, tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    args = stage_args("sft", ppo_dirs, out, max_steps=SFT_STEPS, log_every=1, micro_batch_size=1, mixed_precision="no")
    with launched("sft", args, log) as (proc, mark):
        wait_for_step(proc, out, 1, log)
        os.kill(process_of_rank(mark, 1), signal.SIGTERM)  # rank 0 hears nothing: it must learn it from rank 1
        code = proc.wait(timeout=120)  # neither process is left waiting for the other
    [(name, _, step, _, resume)] = STOPPED.findall(log.read_text())
    assert (code, name, resume) == (143, "SIGTERM", f"rlhfkit sft resume={out} --num-processes 2")
    assert 1 <= int(step) < SFT_STEPS and latest_step(out) == int(step)
    assert not (out / LOCK_FILE).exists()


@pytest.mark.faults  # a signal and a resume in child processes: the fault-injection suite
def test_sigterm_during_grpo_checkpoints_the_update_and_resumes_to_the_end(ppo_dirs, tmp_path):
    out, updates = tmp_path / "run", 4
    args = stage_args("grpo", ppo_dirs, out, max_steps=updates, log_every=1)
    command = rlhfkit_command("grpo", "--preset", PRESETS["grpo"], *cli_args(args))
    returncode, output = interrupt_after_first_step(command, out, signal.SIGTERM)
    assert returncode == 143, output[-3000:]
    [(name, unit, update, checkpoints, resume)] = STOPPED.findall(output)
    assert (name, unit, checkpoints, resume) == (
        "SIGTERM",
        "update",
        str(out / "checkpoints"),
        f"rlhfkit grpo resume={out}",
    )
    assert 1 <= int(update) < updates and latest_step(out) == int(update)
    assert not (out / LOCK_FILE).exists()

    subprocess.run(rlhfkit_command(*shlex.split(resume)[1:]), check=True, env=child_env(), capture_output=True)
    assert latest_step(out) == updates and (out / "model" / "model.safetensors").is_file()


def test_stop_signal_keeps_the_first_signal_ignores_the_next_and_restores_the_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # e.g. while the checkpoint is written: neither ends the process
        time.sleep(0.01)  # the handlers run between bytecodes
        assert stop.signum == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before


def test_stop_signal_outside_the_main_thread_leaves_the_handlers_alone():
    before = signal.getsignal(signal.SIGTERM)
    errors = []

    def enter():
        try:
            with StopSignal() as stop:
                assert stop.signum is None and signal.getsignal(signal.SIGTERM) is before
        except Exception as e:  # a thread's exception would not fail the test by itself
            errors.append(e)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert errors == []


def test_resume_command_names_the_stage_and_its_processes_or_repeats_the_pipeline(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["rlhfkit", "sft", "--preset", "tldr-sft"])
    assert resume_command("sft", tmp_path / "my run") == f"rlhfkit sft 'resume={tmp_path}/my run'"
    assert resume_command("dpo", tmp_path, processes=4) == f"rlhfkit dpo resume={tmp_path} --num-processes 4"
    monkeypatch.setattr(sys, "argv", ["rlhfkit", "pipeline", "--preset", "quickstart", "output_dir=runs/p"])
    assert resume_command("rm", tmp_path / "rm") == "rlhfkit pipeline --preset quickstart output_dir=runs/p"


SIGNALLING_FUNCTION = '''
import os, signal, time
CALLS = []
def signals_on_call(prompts, completions, **columns):
    """Sends the signal in os.environ["SIGNAL_ON_CALL"] ("SIGTERM:2": on its 2nd call) to its own process,
    then hangs."""
    CALLS.append(1)
    name, _, call = os.environ.get("SIGNAL_ON_CALL", "").partition(":")
    if name and len(CALLS) == int(call):
        os.kill(os.getpid(), getattr(signal, name))
        time.sleep(60)
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def signalling_file(tmp_path):
    path = tmp_path / "rf.py"
    path.write_text(SIGNALLING_FUNCTION)
    return path


def test_interruptible_raises_at_once_inside_a_step_and_nowhere_else():
    with StopSignal() as stop, pytest.raises(Interrupted), interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a hanging call: the handler raises in it
    assert stop.signum == signal.SIGTERM
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        with pytest.raises(Interrupted), interruptible():  # a stop asked for before the call: the call never starts
            pytest.fail("called after the stop")
    with StopSignal(droppable=False) as stop, interruptible():  # several processes: recorded, as anywhere in a step
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
    assert stop.signum == signal.SIGTERM


@pytest.mark.faults  # a signal, a checkpoint and a resume: the fault-injection suite
def test_sigterm_inside_a_reward_function_checkpoints_the_update_before_and_resumes_bit_identical(
    ppo_dirs, signalling_file, tmp_path, capsys, monkeypatch
):
    options = {"reward_model": "", "reward_functions": f"{signalling_file}:signals_on_call", "max_steps": 2}
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert cli_main(preset_command("grpo", ppo_dirs, straight, **options)) == 0
    monkeypatch.setenv("SIGNAL_ON_CALL", "SIGTERM:2")  # in update 2's reward call, which then hangs
    with pytest.raises(SystemExit) as stopped:
        cli_main(preset_command("grpo", ppo_dirs, out, **options))
    err = capsys.readouterr().err
    assert stopped.value.code == 143 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGTERM after update 1; checkpoint written to {out / 'checkpoints'}; resume with: "
        f"rlhfkit grpo resume={out}"
    )
    assert json.loads((out / "checkpoints" / "latest").read_text())["step"] == 1

    monkeypatch.delenv("SIGNAL_ON_CALL")
    assert cli_main(["grpo", f"resume={out}"]) == 0
    assert sha256(out / "model" / "model.safetensors") == sha256(straight / "model" / "model.safetensors")
    assert metrics_without_timings(out) == metrics_without_timings(straight)


@pytest.mark.faults  # a run and its resume with an evaluation each: over 10 s
def test_sigint_in_the_final_evaluation_names_the_final_checkpoint_and_resuming_finishes(
    ppo_dirs, signalling_file, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    monkeypatch.setenv("SIGNAL_ON_CALL", "SIGINT:3")  # update 1, the SFT policy's answers, then the trained policy's
    with pytest.raises(SystemExit) as stopped:
        cli_main(preset_command("grpo", ppo_dirs, out, reward_functions=f"{signalling_file}:signals_on_call",
                               eval_samples=2))
    err = capsys.readouterr().err
    assert stopped.value.code == 130 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGINT after update 1; checkpoint written to {out / 'checkpoints'}; resume with: "
        f"rlhfkit grpo resume={out}"
    )
    assert not (out / "eval.json").exists()
    monkeypatch.delenv("SIGNAL_ON_CALL")
    assert cli_main(["grpo", f"resume={out}"]) == 0
    assert json.loads((out / "eval.json").read_text())["eval/posts"] == 2


@pytest.mark.faults  # a signal and a second run: the fault-injection suite
def test_sigterm_in_dpo_reference_pass_says_how_to_start_again_which_finishes(ppo_dirs, tmp_path, capsys, monkeypatch):
    from rlhfkit.trainers import dpo

    original = dpo.pair_logprobs_all

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return original(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(dpo, "pair_logprobs_all", signalled)
    with pytest.raises(SystemExit) as stopped:
        cli_main(["dpo", "--preset", PRESETS["dpo"], *cli_args(stage_args("dpo", ppo_dirs, out, max_steps=1))])
    err = capsys.readouterr().err
    restart = f"rlhfkit dpo --config {out / 'config.yaml'}"
    assert stopped.value.code == 143 and "Traceback" not in err
    assert (
        stop_line(err)
        == f"rlhfkit: stopped by SIGTERM before the run's first checkpoint; start it again with: {restart}"
    )
    monkeypatch.setattr(dpo, "pair_logprobs_all", original)
    assert cli_main(restart.split()[1:]) == 0
    assert (out / "model" / "model.safetensors").is_file()


def stop_line(err: str) -> str:
    """The one line saying how the run stopped: at the start of a line, or after the `\\r` of a progress bar
    cleared from the screen."""
    [line] = [part for line in err.splitlines() for part in line.split("\r") if part.startswith("rlhfkit: stopped by ")]
    return line


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def metrics_without_timings(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]
