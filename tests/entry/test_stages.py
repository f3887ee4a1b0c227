"""The stage registry: every command's config, presets and runner come from `rlhfkit.stages`, and the
CLI and the pipeline run what it declares."""

from __future__ import annotations

import dataclasses
import inspect
from importlib import resources

import pytest
import yaml

from rlhfkit import cli, pipeline_command
from rlhfkit.config import preset_names
from rlhfkit.errors import ConfigError
from rlhfkit.stages import STAGES, multi_process_names, pipeline_commands, resolve, run_resolved

CONFIGURED = [stage for stage in STAGES.values() if stage.config is not None]


def preset_stage(name: str) -> str:
    return yaml.safe_load((resources.files("rlhfkit.presets") / f"{name}.yaml").read_text())["stage"]


def fake_runner(monkeypatch, stage: str, code: int = 0) -> list:
    """Swap the registered runner of `stage` for one that records the config it is given."""
    calls = []
    monkeypatch.setitem(
        STAGES, stage, dataclasses.replace(STAGES[stage], runner=lambda: lambda cfg: calls.append(cfg) or code)
    )
    return calls


@pytest.mark.parametrize("stage", CONFIGURED, ids=lambda s: s.name)
def test_every_stage_resolves_its_defaults_and_each_of_its_presets(stage):
    assert resolve(stage.name, None, None, {}) == stage.config()
    for preset in stage.presets:
        assert isinstance(resolve(stage.name, preset, None, {}), stage.config), preset


def test_every_shipped_preset_is_registered_under_the_stage_it_declares():
    registered = {preset: stage.name for stage in STAGES.values() for preset in stage.presets}
    assert sorted(registered) == preset_names()
    assert {preset: preset_stage(preset) for preset in registered} == registered


@pytest.mark.parametrize("stage", STAGES.values(), ids=lambda s: s.name)
def test_every_runner_imports_and_takes_one_argument(stage):
    runner = stage.runner()
    assert callable(runner)
    inspect.signature(runner).bind(None)  # the CLI and the pipeline call runner(config)


@pytest.mark.parametrize("stage", [s for s in CONFIGURED if s.presets], ids=lambda s: s.name)
def test_stage_help_lists_its_presets(stage, capsys):
    assert cli.main([*stage.words, "--help"]) == 0
    listed = [
        line.split()[0]
        for line in capsys.readouterr().out.split("presets (--preset NAME):\n")[1].split("\n\n")[0].splitlines()
    ]
    assert listed == list(stage.presets)


def test_cli_runs_the_registered_runner_on_the_resolved_config(monkeypatch):
    calls = fake_runner(monkeypatch, "sft", code=4)
    assert cli.main(["sft", "--preset", "tldr-sft", "seed=9"]) == 4
    assert calls == [resolve("sft", "tldr-sft", None, {"seed": "9"})]


def test_single_process_refusal_names_the_multi_process_stages(monkeypatch, capsys):
    for launcher_variable in ("LOCAL_RANK", "ACCELERATE_PROCESS_ID"):  # as if typed outside any launcher
        monkeypatch.delenv(launcher_variable, raising=False)
    assert cli.main(["report", "--num-processes", "2"]) == 2
    expected = f"report runs in one process; --num-processes (num_processes= in Python) is for {multi_process_names()}"
    assert expected in capsys.readouterr().err
    assert multi_process_names().endswith(" and dist-check")


def test_pipeline_runs_each_stage_through_the_registry(monkeypatch, tmp_path):
    calls = fake_runner(monkeypatch, "sft")
    (tmp_path / "sft").mkdir()  # the run folder a real stage makes
    cfg = resolve(
        "pipeline", None, None, {"stages": "sft", "output_dir": str(tmp_path), "model": "m", "sft_data": "posts.jsonl"}
    )
    assert run_resolved("pipeline", cfg) == 0
    assert [(c.model, c.data, c.output_dir) for c in calls] == [("m", ["posts.jsonl"], str(tmp_path / "sft"))]
    assert (tmp_path / "sft" / pipeline_command.DONE).is_file()


def test_pipeline_stops_on_a_stage_that_fails(monkeypatch):
    fake_runner(monkeypatch, "rm", code=3)
    with pytest.raises(ConfigError, match="rm stopped with exit code 3"):
        pipeline_command.call(pipeline_commands(), "rm", resolve("rm", None, None, {}))


TRAINING_STAGES = [stage for stage in STAGES.values() if stage.shardings]


@pytest.mark.parametrize("sharding", ["fsdp2", "zero2", "zero3"])
@pytest.mark.parametrize("stage", TRAINING_STAGES, ids=lambda s: s.name)
def test_a_stage_and_its_memory_plan_accept_or_refuse_a_sharding_alike(stage, sharding, monkeypatch):
    """The command and `rlhfkit plan stage=...` go through the one check of the registry's declaration."""
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under --num-processes 2
    outcomes = []
    for name, overrides in (
        (stage.name, {"sharding": sharding}),
        ("plan", {"stage": stage.name, "sharding": sharding}),
    ):
        try:
            resolve(name, None, None, overrides)
            outcomes.append("accepted")
        except ConfigError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "accepted") == (sharding in stage.shardings), outcomes[0]


def test_plan_refuses_a_stage_that_trains_nothing_naming_those_that_do():
    with pytest.raises(ConfigError, match=r"stage=generate: choose one of sft, rm, dpo, ppo, grpo, rloo, reinforce"):
        resolve("plan", None, None, {"stage": "generate"})


def test_every_stage_the_pipeline_runs_has_its_options_field_and_unknown_ones_are_refused():
    commands = pipeline_commands()
    defaults = resolve("pipeline", None, None, {})
    for stage in (*commands.policy_stages, *{s for reads in commands.reads.values() for s in reads}):
        assert isinstance(defaults.options_of(stage), dict), stage
        resolve("pipeline", None, None, {"stages": stage})
    with pytest.raises(
        ConfigError,
        match=r"stages: generate is not a pipeline stage; choose from sft, rm, dpo, ppo, grpo, rloo, reinforce, eval",
    ):
        resolve("pipeline", None, None, {"stages": "sft,generate"})
