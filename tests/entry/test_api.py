"""The Python API (rlhfkit.api): the same runs as the command line from in-memory data, loaded models and
reward functions defined in Python; results read back as tables and objects; user errors raised, never
printed (tests/support/mistakes.one_error_line walks every bad-input case of the CLI through the API as well)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlhfkit
from rlhfkit.api import data_file
from rlhfkit.reward_models import load_reward_model

from ..support.mistakes import tokenizer_of
from ..support.processes import assert_same_metrics, free_port
from ..support.tiny import PRESETS, cli_args, stage_args


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def brevity(prompts, completions, **columns) -> list[float]:  # also written to a file for the command line
    return [-len(c) / 10 for c in completions]


BREVITY_SOURCE = """
def brevity(prompts, completions, **columns):
    return [-len(c) / 10 for c in completions]
"""


def test_grpo_on_objects_from_python_makes_the_metrics_of_the_same_run_from_the_command_line(ppo_dirs, tmp_path):
    """An in-memory Dataset, a loaded policy with its tokenizer, a loaded reward model, and a reward function defined
    here beside a built-in one: the metrics and weights of the command line's run on the same data in a file, the
    models' folders and the function in a module file, at the same seed."""
    from rlhfkit.cli import main

    options = stage_args("grpo", ppo_dirs, None, eos_trick="false", reward_functions=None)
    options.pop("output_dir"), options.pop("reward_functions")
    (tmp_path / "my_rewards.py").write_text(BREVITY_SOURCE)

    cli_run = tmp_path / "cli"
    argv = ["grpo", "--preset", PRESETS["grpo"], *cli_args(options)]
    functions = f"reward_functions={tmp_path / 'my_rewards.py'}:brevity,length"
    assert main([*argv, functions, f"output_dir={cli_run}"]) == 0

    def brevity(prompts, completions, **columns):  # defined in a function: not importable, held as an object
        return [-len(c) / 10 for c in completions]

    model = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    tokenizer = AutoTokenizer.from_pretrained(ppo_dirs["policy"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    objects = {
        "model": model,
        "reward_model": load_reward_model(ppo_dirs["rm"]),  # (rlhfkit's reward model, its tokenizer)
        "data": datasets.Dataset.from_list(rows_of(ppo_dirs["posts"])),
    }
    result = rlhfkit.grpo(
        preset=PRESETS["grpo"],
        **(options | objects),
        tokenizer=tokenizer,
        reward_functions=[brevity, "length"],
        output_dir=tmp_path / "api",
    )
    assert len(result.metrics) == 2 and "rewards/brevity" in result.metrics
    resumed = rlhfkit.run("grpo", resume=str(cli_run))  # resume: a finished run, read back
    assert_same_metrics(resumed.run_dir, result.run_dir, 2)
    a, b = load_file(cli_run / "model" / "model.safetensors"), load_file(result.model_path / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the caller's model is untouched
    config = (result.run_dir / "config.yaml").read_text()
    assert "python:model-" in config and "python:reward_model-" in config and "python:brevity" in config


def test_dpo_with_its_reference_as_a_loaded_model_trains_as_with_the_reference_folder(ppo_dirs, tmp_path):
    """reference_model= as a (model, tokenizer) pair: the same reference log-probabilities, hence the same run, as
    the folder it was loaded from (DPO caches them under a key that names the reference: its fingerprint)."""
    options = stage_args("dpo", ppo_dirs, None, max_steps=2, eval_samples=0)
    options.pop("output_dir")
    by_folder = rlhfkit.dpo(
        preset=PRESETS["dpo"], reference_model=str(ppo_dirs["policy"]), output_dir=tmp_path / "folder", **options
    )
    reference = (
        AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"]),
        AutoTokenizer.from_pretrained(ppo_dirs["policy"]),
    )
    by_object = rlhfkit.dpo(preset=PRESETS["dpo"], reference_model=reference, output_dir=tmp_path / "object", **options)
    assert_same_metrics(by_folder.run_dir, by_object.run_dir, 2)
    assert "python:reference_model-" in (by_object.run_dir / "config.yaml").read_text()


def test_in_memory_data_is_one_file_named_by_its_content_whatever_holds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path))
    rows = [{"prompt": "2+2=", "answer": 4}, {"prompt": "3+3=", "answer": 6}]
    as_list = data_file(rows, "data", "")
    assert data_file(datasets.Dataset.from_list(rows), "data", "") == as_list
    assert data_file(pd.DataFrame(rows), "data", "") == as_list
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    )
    assert data_file(splits, "data", "") == as_list  # the train split unless hf_split names another
    assert data_file(splits, "data", "test") != as_list
    assert Path(as_list).parent == tmp_path / "data" and rows_of(Path(as_list)) == rows
    with pytest.raises(rlhfkit.ConfigError, match="has no split 'validation' \\(it has train, test\\)"):
        data_file(splits, "data", "validation")
    missing = data_file(pd.DataFrame([{"prompt": "a", "score": 1.0}, {"prompt": "b", "score": math.nan}]), "data", "")
    assert rows_of(Path(missing))[1]["score"] is None  # pandas' missing value is JSON's null


def test_a_config_object_runs_returns_its_results_and_resumes_from_python(ppo_dirs, tmp_path):
    out = tmp_path / "run"
    config = rlhfkit.SFTConfig(
        model=str(ppo_dirs["policy"]),
        data=[str(ppo_dirs["posts"])],
        output_dir=str(out),
        max_steps=1,
        save_every=1,
        validation_posts=8,
        eval_samples=2,
        total_batch_size=4,
        micro_batch_size=2,
        max_query_length=128,
        learning_rate=1e-3,
        report_to="",
    )
    result = rlhfkit.sft(config)
    assert result.run_dir == out and result.config.max_steps == 1 and config.max_steps == 1
    training = result.metrics.dropna(subset=["train/loss"])  # evaluations are rows of their own
    assert training["step"].tolist() == [1] and "val/loss" in result.metrics
    assert isinstance(result.model, torch.nn.Module) and result.tokenizer.pad_token == "[PAD]"
    assert result.headline and result.evaluation  # report.json's numbers, eval.json
    resumed = rlhfkit.sft(resume=str(out), max_steps=2)  # the folder is no longer locked by this process's first call
    resumed_training = resumed.metrics.dropna(subset=["train/loss"])
    assert resumed_training["step"].tolist() == [1, 2]
    assert resumed_training["train/loss"].iloc[0] == training["train/loss"].iloc[0]
    with pytest.raises(rlhfkit.ConfigError, match="a config object or preset=/config_file=, not both"):
        rlhfkit.sft(config, preset="tldr-sft")


def test_a_model_object_without_its_tokenizer_is_refused_naming_both_ways_to_give_it(ppo_dirs, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    with pytest.raises(rlhfkit.ConfigError, match=r"model is a loaded model without its tokenizer: give tokenizer="):
        rlhfkit.sft(**stage_args("sft", ppo_dirs, tmp_path / "run", model=model))
    tokenizer = AutoTokenizer.from_pretrained(ppo_dirs["policy"])
    with pytest.raises(rlhfkit.ConfigError, match=r"tokenizer= is for a loaded model .*; one given as a folder"):
        rlhfkit.sft(tokenizer=tokenizer, **stage_args("sft", ppo_dirs, tmp_path / "run"))  # model= is a folder
    assert not (tmp_path / "run").exists()


def test_a_run_of_python_objects_resumed_from_the_command_line_says_how_to_run_it(ppo_dirs, tmp_path, capsys):
    from rlhfkit.cli import main

    model = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    tokenizer = AutoTokenizer.from_pretrained(ppo_dirs["policy"])
    out = tmp_path / "run"
    rlhfkit.sft(
        preset=PRESETS["sft"], tokenizer=tokenizer, **stage_args("sft", ppo_dirs, out, max_steps=1, model=model)
    )
    capsys.readouterr()
    assert main(["sft", f"resume={out}", "max_steps=2"]) == 2
    err = capsys.readouterr().err
    assert "model=python:model-" in err and "was a Python object given to rlhfkit's Python API" in err


def test_importing_the_package_loads_neither_torch_nor_the_stage_registry():
    code = (
        "import sys, rlhfkit; print(sorted(m for m in ('torch', 'rlhfkit.api', 'rlhfkit.stages') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert rlhfkit.GRPOConfig is rlhfkit.config.GRPOConfig and callable(rlhfkit.grpo)


def test_no_name_of_the_api_is_also_a_module_of_the_package():
    """`rlhfkit.pipeline` must stay the call: a module of that name would replace it once imported."""
    package = Path(rlhfkit.__file__).parent
    assert [name for name in rlhfkit.__all__ if (package / f"{name}.py").exists() or (package / name).is_dir()] == []


def test_two_launched_processes_from_python_train_like_one(ppo_dirs, one_process_run, tmp_path, monkeypatch):
    """`num_processes=2`: the API launches the command as `rlhfkit sft --num-processes 2` does, on the config it
    resolved, and the model equals one process's on the same global batch."""
    monkeypatch.setenv("RLHFKIT_PORT", str(free_port()))
    monkeypatch.setenv("TQDM_DISABLE", "1")
    exact = {"max_steps": 2, "mixed_precision": "no"}
    one = one_process_run("sft", stage_args("sft", ppo_dirs, None, **exact))
    result = rlhfkit.sft(
        preset=PRESETS["sft"], num_processes=2, **stage_args("sft", ppo_dirs, tmp_path / "two", **exact)
    )
    a, b = load_file(one / "model" / "model.safetensors"), load_file(result.model_path / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-6, rtol=1e-4)


def test_launched_processes_cannot_receive_python_objects(ppo_dirs, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    tokenizer = AutoTokenizer.from_pretrained(ppo_dirs["policy"])
    with pytest.raises(rlhfkit.ConfigError, match="cannot receive Python objects: give models as folders"):
        rlhfkit.sft(num_processes=2, tokenizer=tokenizer, **stage_args("sft", ppo_dirs, tmp_path / "run", model=model))


def test_ctrl_c_in_a_reward_function_raises_keyboard_interrupt_with_a_python_resume_call(ppo_dirs, tmp_path, capfd):
    """Not SystemExit(130), and nowhere a command line, which cannot supply a Python function or model."""
    import os
    import signal
    import time

    def interrupted(prompts, completions, **columns):  # a real Ctrl-C reaches the process mid-call
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
        return [0.0] * len(completions)

    options = stage_args("grpo", ppo_dirs, tmp_path / "run", max_steps=1, reward_model="")
    options["model"] = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as stopped:
        rlhfkit.grpo(preset=PRESETS["grpo"], tokenizer=AutoTokenizer.from_pretrained(ppo_dirs["policy"]),
                     reward_functions=[interrupted], **options)
    assert time.monotonic() - started < 25  # the hanging call was cut short
    message = str(stopped.value)
    assert message.startswith(f"grpo stopped by Ctrl-C; resume with rlhfkit.grpo(resume='{tmp_path / 'run'}'")
    assert all(f", {key}=..." in message for key in ("model", "reward_functions", "tokenizer"))
    assert message.endswith("the same objects as before")
    said = capfd.readouterr().err
    resume = message.split("resume with ")[1]
    assert f"checkpoint written to {tmp_path / 'run' / 'checkpoints'}; resume with: {resume}" in said
    assert "rlhfkit grpo" not in said


def test_a_model_object_with_another_models_small_tokenizer_is_refused_naming_both_sizes(ppo_dirs, tmp_path):
    """A 160-token tokenizer on the 49,153-row policy used to train silently."""
    model = AutoModelForCausalLM.from_pretrained(ppo_dirs["policy"])
    rows = model.get_input_embeddings().num_embeddings
    refusal = rf"its tokenizer has 160 tokens but the model's embeddings have {rows} rows"
    with pytest.raises(rlhfkit.ModelError, match=refusal):
        rlhfkit.sft(tokenizer=tokenizer_of(160), **stage_args("sft", ppo_dirs, tmp_path / "run", model=model))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"config": "GRPOConfig"}, "config: the config object is the first positional argument, "
                                   "rlhfkit.grpo(GRPOConfig(...)), not config="),
        ({"num_generations": 8}, "rlhfkit.grpo() got an unknown keyword argument 'num_generations'. TRL's "
                                 "num_generations is samples_per_prompt here."),
        ({"train_dataset": []}, "TRL's train_dataset is data here."),
        ({"beta": 0.1}, "TRL's beta is kl_coef here."),
    ],
)
def test_keyword_mistakes_are_named_in_pythons_words_with_the_option_trl_users_mean(options, message):
    """`config=` for the positional config object, and TRL's option names: never 'command-line arguments' from
    Python."""
    options = {k: rlhfkit.GRPOConfig() if v == "GRPOConfig" else v for k, v in options.items()}
    with pytest.raises(rlhfkit.ConfigError) as refused:
        rlhfkit.grpo(**options)
    assert str(refused.value).startswith(message) or message in str(refused.value)
    assert "command-line" not in str(refused.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            (row for row in [{"prompt": "a"}]),
            "data: a generator; give a datasets.Dataset or DatasetDict, a pandas DataFrame, a list of dicts (one per "
            "record), or files, folders or hub ids",
        ),
        ({"prompt": ["a"], "completion": ["b"]}, "data: a dict (of columns?); give a datasets.Dataset"),
        ([{"prompt": "a", "completion": "b"}, "more.jsonl"], "data: a list of dict, str; give a datasets.Dataset"),
        ([{"prompt": b"a", "completion": "b"}], "bytes are not text: decode them first"),
    ],
)
def test_data_python_cannot_read_is_refused_naming_the_kinds_it_can(data, message, tmp_path):
    """A generator, a dict of columns, a list mixing dicts and strings, and bytes that JSON cannot hold."""
    with pytest.raises(rlhfkit.ConfigError, match=None) as refused:
        rlhfkit.sft(model="never-loaded", data=data, output_dir=str(tmp_path / "run"))
    assert message in str(refused.value) and "Circular reference" not in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_result_evaluation_of_a_reward_model_is_its_rm_eval(tmp_path):
    """rm and dpo write rm_eval/rm_eval.json; Result.evaluation read only the run folder's top level."""
    (tmp_path / "rm_eval").mkdir()
    (tmp_path / "rm_eval" / "rm_eval.json").write_text(json.dumps({"accuracy": 0.75}))
    assert rlhfkit.api.Result("rm", None, tmp_path).evaluation == {"accuracy": 0.75}


def test_result_reads_the_files_its_command_declares_and_guesses_none(tmp_path):
    """Each command's `Outputs` (stages.py) name what Result reads: GSM8K's accuracy.json is `eval gsm8k`'s
    evaluation, and a file another command writes is no evaluation of this one."""
    (tmp_path / "accuracy.json").write_text(json.dumps({"problems": 4}))
    (tmp_path / "rm_eval").mkdir()
    (tmp_path / "rm_eval" / "rm_eval.json").write_text(json.dumps({"accuracy": 0.75}))
    assert rlhfkit.api.Result("eval-gsm8k", None, tmp_path).evaluation == {"problems": 4}
    assert rlhfkit.api.Result("sft", None, tmp_path).evaluation == {}
    assert rlhfkit.api.Result("eval", None, tmp_path).model_path is None  # a command that trains nothing
    (tmp_path / "model").mkdir()
    assert rlhfkit.api.Result("sft", None, tmp_path).model_path == tmp_path / "model"


def test_every_declared_evaluation_is_a_json_file_of_a_command_with_a_folder():
    from rlhfkit.stages import STAGES

    declared = {name: stage.outputs for name, stage in STAGES.items() if stage.outputs.evaluation}
    assert {"sft", "rm", "dpo", "grpo", "pipeline", "eval", "eval-gsm8k", "rm-eval", "judge-eval"} <= set(declared)
    assert all(outputs.evaluation.endswith(".json") for outputs in declared.values())
    assert all(STAGES[name].outputs.model for name in ("sft", "rm", "dpo", "ppo"))
