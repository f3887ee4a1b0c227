"""Multi-process launch through accelerate: a real 2-process CPU run, and the command it builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

import rlhfkit
from rlhfkit import cli
from rlhfkit import command as command_path
from rlhfkit.config import to_yaml
from rlhfkit.launch import inside_launcher, launch_command
from rlhfkit.stages import resolve

from ..support.processes import launcher_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "ACCELERATE_PROCESS_ID", "MASTER_ADDR", "MASTER_PORT")


def test_dist_check_two_processes_agree():
    env = {k: v for k, v in launcher_env().items() if k not in LAUNCHER_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "rlhfkit", "dist-check", "--num-processes", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("dist-check ")]
    assert len(lines) == 2, proc.stdout
    results = [json.loads(line[len("dist-check ") :]) for line in lines]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["world_size"] == 2
        assert r["rank_sum"] == 3.0 == r["rank_sum_expected"]
        assert r["seeded_outputs_agree"] is True
        assert r["ok"] is True
        assert r["backend"] in ("gloo", "nccl")


def test_dist_check_single_process(capsys, monkeypatch):
    from accelerate.state import AcceleratorState

    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    try:
        assert cli.main(["dist-check"]) == 0
    finally:  # the accelerate state is a process-wide singleton; leave none behind for other tests
        AcceleratorState._reset_state(reset_partial_state=True)
    (line,) = capsys.readouterr().out.splitlines()
    result = json.loads(line.removeprefix("dist-check "))
    assert (result["world_size"], result["rank_sum"], result["ok"]) == (1, 1.0, True)


def test_launch_command_builds_accelerate_launch(monkeypatch):
    monkeypatch.setenv("RLHFKIT_PORT", "31234")
    cmd = launch_command(["sft", "--preset", "tldr-sft", "seed=2"], 3)
    assert cmd[:3] == [sys.executable, "-m", "rlhfkit.launch"]  # accelerate's launcher, quiet on a failed process
    assert cmd[cmd.index("--num_processes") + 1] == "3"
    assert cmd[cmd.index("--num_machines") + 1] == "1"
    assert cmd[cmd.index("--main_process_port") + 1] == "31234"
    assert cmd[cmd.index("--mixed_precision") + 1] == "no"
    assert "--multi_gpu" in cmd
    assert int(cmd[cmd.index("--num_cpu_threads_per_process") + 1]) >= 1
    assert cmd[-6:] == ["-m", "rlhfkit", "sft", "--preset", "tldr-sft", "seed=2"]


def launches_recorded(monkeypatch) -> list[tuple[list[str], int, dict | None]]:
    """Each launch the shells ask for, as (argv, processes, the config file it names, read while it exists)."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    calls = []

    def relaunch(argv: list[str], processes: int) -> int:
        config = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text()) if "--config" in argv else None
        calls.append((argv[: argv.index("--config")] if config else argv, processes, config))
        return 0

    monkeypatch.setattr(command_path, "relaunch", relaunch)
    return calls


def test_both_shells_launch_processes_on_the_config_this_process_resolved(monkeypatch, tmp_path):
    calls = launches_recorded(monkeypatch)
    assert cli.main(["sft", "--num-processes", "2", "seed=4"]) == 0
    assert cli.main(["rm", "--num_processes=4", "--preset", "hh-rm", "--head", "mean-mlp"]) == 0
    assert cli.main(["dist-check", "--num-processes", "2"]) == 0
    rlhfkit.sft(num_processes=2, seed=5, output_dir=str(tmp_path / "api"))
    (sft, two, cli_sft), (rm, four, cli_rm), dist_check, (api, two_again, api_sft) = calls
    assert (sft, two, rm, four, api, two_again) == (["sft"], 2, ["rm"], 4, ["sft"], 2)
    assert cli_sft == yaml.safe_load(to_yaml(resolve("sft", None, None, {"seed": "4"}), "sft"))
    assert (cli_rm["stage"], cli_rm["head"], cli_rm["data"]) == ("rm", "mean-mlp", resolve("rm", "hh-rm").data)
    assert (api_sft["seed"], api_sft["output_dir"]) == (5, str(tmp_path / "api"))
    assert dist_check == (["dist-check"], 2, None)


def test_cli_checks_the_config_before_launching_and_refuses_single_process_commands(monkeypatch, capsys):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    calls = launches_recorded(monkeypatch)
    assert cli.main(["sft", "--num-processes", "2", "lrate=1"]) == 2
    assert "unknown key 'lrate'" in capsys.readouterr().err
    assert cli.main(["data", "analyze", "--num_processes=4", "--dataset", "hh"]) == 2
    assert "runs in one process" in capsys.readouterr().err
    assert calls == []
    assert cli.main(["sft", "--num-processes", "2", "seed=4"]) == 0  # a checked command is launched through it
    assert [(argv, processes, config["seed"]) for argv, processes, config in calls] == [(["sft"], 2, 4)]


def test_inside_launcher_detection(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    assert not inside_launcher()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert inside_launcher()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("ACCELERATE_PROCESS_ID", "1")
    assert inside_launcher()


def test_more_processes_than_gpus_fall_back_to_cpu(monkeypatch):
    import torch

    from rlhfkit.distributed import processes_need_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert processes_need_cpu()  # two processes cannot share one GPU over NCCL
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert not processes_need_cpu()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert processes_need_cpu()
