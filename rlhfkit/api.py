"""rlhfkit from Python: every command of the command line as a call that takes options as keyword arguments
(or a config object), data in memory, reward functions as callables and models as loaded objects, and returns
a `Result`. One code path with the CLI, both shells thin over `command.command_config` and `command.execute`: the
same presets, checks, run-folder rules, resume, progress bars, TensorBoard events and reports. A user error raises
the exception whose message the CLI prints as its one line (`ConfigError`, `DataFormatError`, `ModelError`
and kin, all `rlhfkit.UserError`); nothing here ends the process.

    import rlhfkit
    result = rlhfkit.grpo(model=model, tokenizer=tokenizer, data=dataset, reward_functions=[my_reward],
                          output_dir="runs/grpo", max_steps=2)
    result.metrics        # a pandas DataFrame of metrics.jsonl

In-memory data (a `datasets.Dataset` or `DatasetDict`, a pandas DataFrame, a list of dicts) is written once as
JSON lines into the cache (`rlhfkit.data_cache`), named by its content, and read from there by the data layer
like any file: the run's config.yaml names that file, so the run resumes from Python or the command line. Models
and callables stay in memory (`supplied`): config.yaml names them `python:<name>`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import math
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from .command import check_sources, check_takes_options, command_config, execute, process_count
from .config import MODEL_OPTIONS
from .config.values import check_not_moved, unknown_key_hint
from .errors import ConfigError
from .preemption import continued_from_python, exit_code
from .run_folder import unstarted_runs_taken_back
from .stages import STAGES, Outputs, Stage
from .supplied import PREFIX, supplying


class LaunchFailed(RuntimeError):
    """Processes launched by `num_processes=` ended with a non-zero exit code; what they printed says why."""


# ---------------------------------------------------------------- in-memory data


def data_cache() -> Path:
    """Where in-memory data is written as JSON lines: `$RLHFKIT_CACHE/data` (the models' cache beside it)."""
    from .models import cache_dir  # imports torch: only a call given in-memory data pays, before its stage does

    return cache_dir() / "data"


def is_in_memory_data(value: Any) -> bool:
    """A Dataset, DatasetDict or DataFrame (told by their methods, so that neither library must be installed),
    or a non-empty list of dicts."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(row, dict) for row in value)
    return hasattr(value, "column_names") or hasattr(value, "to_dict") and hasattr(value, "columns")


def records_of(value: Any, option: str, split: str) -> list[dict[str, Any]]:
    """The rows of in-memory data; of a DatasetDict, the split `split` (hf_split=, "train" when not given)."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):  # a DatasetDict: a dict of Datasets
        name = split or "train"
        if name not in value:
            raise ConfigError(
                f"{option}: the DatasetDict has no split {name!r} (it has {', '.join(value) or 'none'}); "
                f"give hf_split= one of them, or the Dataset itself"
            )
        value = value[name]
    if hasattr(value, "columns") and hasattr(value, "to_dict"):  # a pandas DataFrame
        return value.to_dict(orient="records")
    return list(value)


def json_value(value: Any) -> Any:
    """numpy and pandas scalars and arrays as JSON values; NaN (pandas' missing value) as null."""
    if isinstance(value, bytes | bytearray):  # returned as it is, json would report a circular reference
        raise TypeError("bytes are not text: decode them first (value.decode())")
    if hasattr(value, "tolist"):
        value = value.tolist()
    elif hasattr(value, "isoformat"):
        value = value.isoformat()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


DATA_OPTIONS = ("data", "sft_data", "comparisons")  # the options that read records
DATA_KINDS = (
    "a datasets.Dataset or DatasetDict, a pandas DataFrame, a list of dicts (one per record), or files, folders "
    "or hub ids (a str or a list of str)"
)


def check_data_value(option: str, value: Any) -> None:
    """Data that is neither in memory (`is_in_memory_data`) nor paths, refused naming what is accepted: a
    generator, a dict of columns, a list mixing records and paths, bytes."""
    if isinstance(value, str | os.PathLike) or is_in_memory_data(value):
        return
    if isinstance(value, list | tuple):
        kinds = sorted({type(item).__name__ for item in value})
        if all(isinstance(item, str | os.PathLike) for item in value):
            return
        raise ConfigError(f"{option}: a list of {', '.join(kinds)}; give {DATA_KINDS}, not a mix")
    if isinstance(value, dict):
        raise ConfigError(
            f"{option}: a dict (of columns?); give {DATA_KINDS}: datasets.Dataset.from_dict(columns) makes one"
        )
    raise ConfigError(f"{option}: a {type(value).__name__}; give {DATA_KINDS}")


def data_file(value: Any, option: str, split: str) -> str:
    """In-memory data as a JSON-lines file in the data cache, named by its content (written once)."""
    rows = records_of(value, option, split)
    if not rows:
        raise ConfigError(f"{option}: the in-memory data has no rows")
    try:
        text = "".join(
            json.dumps({k: json_value(v) for k, v in row.items()}, default=json_value) + "\n" for row in rows
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{option}: a row cannot be written as JSON ({e}); give text, numbers, lists and dicts"
        ) from None
    folder = data_cache()
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.jsonl"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False, encoding="utf-8") as tmp:
            tmp.write(text)
        os.replace(tmp.name, path)
    print(f"{option}: {len(rows)} in-memory records as {path} (record i is line i+1)")
    return str(path)


# ---------------------------------------------------------------- models and reward functions as objects


def is_model(value: Any) -> bool:
    return hasattr(value, "state_dict") and hasattr(value, "parameters")


def fingerprint(model: Any) -> str:
    """A short name for a model's weights: its class, config and a sample and sum of every tensor. Two
    different models get different names, so a run folder never takes one model's run for another's."""
    digest = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    digest.update(config.to_json_string().encode() if hasattr(config, "to_json_string") else b"")
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().flatten()
        digest.update(f"{name}{tuple(tensor.shape)}{float(flat.double().sum())!r}".encode())
        digest.update(flat[:16].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def model_spec(option: str, value: Any, tokenizer: Any, objects: dict[str, Any]) -> str:
    """`python:<option>-<fingerprint>` for a loaded model (or a (model, tokenizer) pair), held in `objects`."""
    model, own_tokenizer = value if isinstance(value, tuple) else (value, tokenizer)
    if own_tokenizer is None:
        raise ConfigError(
            f"{option} is a loaded model without its tokenizer: give tokenizer=... (the policy's, which every model "
            f"of a run shares) or {option}=(model, tokenizer)"
        )
    spec = f"{PREFIX}{option}-{fingerprint(model)}"
    objects[spec] = (model, own_tokenizer)
    return spec


def function_spec(fn: Any, objects: dict[str, Any]) -> str:
    """`module:function` for a function its module exports (config.yaml can name it, launched processes import
    it); `python:<name>` for one defined in a notebook, a script's __main__ or a lambda, held in `objects`."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and name.isidentifier():
        try:
            if getattr(importlib.import_module(module), name, None) is fn:
                return f"{module}:{name}"
        except ImportError:
            pass
    spec = f"{PREFIX}{getattr(fn, '__name__', 'reward').replace('<lambda>', 'lambda')}"
    objects[spec] = fn
    return spec


def plain_options(options: dict[str, Any], tokenizer: Any, split: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` with every object replaced by the string a config holds for it, and the objects by spec."""
    objects: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for key, value in options.items():
        if key in DATA_OPTIONS:
            check_data_value(key, value)
        if key in MODEL_OPTIONS and (is_model(value) or isinstance(value, tuple)):
            value = model_spec(key, value, tokenizer, objects)
        elif key == "reward_functions" and isinstance(value, list | tuple):
            value = [function_spec(v, objects) if callable(v) else v for v in value]
        elif callable(value) and key == "reward_functions":
            value = [function_spec(value, objects)]
        elif key == "environment" and isinstance(value, type):  # an Environment subclass
            value = function_spec(value, objects)
        elif is_in_memory_data(value):
            value = data_file(value, key, split)
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, list | tuple):
            value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        plain[key] = value
    if tokenizer is not None and not any(isinstance(o, tuple) and o[1] is tokenizer for o in objects.values()):
        raise ConfigError(
            "tokenizer= is for a loaded model (model=, reward_model=, ...); one given as a folder or name loads its own"
        )
    return plain, objects


# ---------------------------------------------------------------- the calls


@dataclasses.dataclass
class Result:
    """What a command left: its config, its folder and, read from there on first use, the metrics, the headline
    numbers of its report, its evaluation and the model it trained (as a path and as an object)."""

    stage: str
    config: Any
    run_dir: Path | None

    @property
    def outputs(self) -> Outputs:
        """The files the command declares it writes (`stages.Outputs`), which every property below reads."""
        return STAGES[self.stage].outputs

    @property
    def model_path(self) -> Path | None:
        """The trained model's folder (`model/`), or None for a command that trains none."""
        path = self.run_dir / self.outputs.model if self.run_dir and self.outputs.model else None
        return path if path is not None and path.is_dir() else None

    @functools.cached_property
    def metrics(self):
        """metrics.jsonl as a pandas DataFrame, one row per logged line (an empty one when nothing was logged)."""
        import pandas as pd

        path = self.run_dir / self.outputs.metrics if self.run_dir and self.outputs.metrics else None
        if path is None or not path.is_file():
            return pd.DataFrame()
        return pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])

    @functools.cached_property
    def headline(self) -> dict[str, Any]:
        """The report's headline numbers, each with its baseline and caveat (report.json), by metric."""
        record = self.read_json(self.outputs.report)
        return {number["metric"]: number for number in record.get("numbers", [])}

    @property
    def caveats(self) -> list[str]:
        return self.read_json(self.outputs.report).get("caveats", [])

    @functools.cached_property
    def evaluation(self) -> dict[str, Any]:
        """The evaluation the command wrote, the file its `Outputs` name (`eval.json` of `sft`, the on-policy stages
        and `eval`; `rm_eval/rm_eval.json` of `rm` and `dpo`; `accuracy.json` of `eval gsm8k`), or {}."""
        return self.read_json(self.outputs.evaluation)

    @functools.cached_property
    def model(self):
        """The trained model, loaded from `model_path` as the next stage loads it (a reward model as rlhfkit's
        ScalarModel); None for a command that trains none."""
        return self.loaded[0] if self.loaded else None

    @property
    def tokenizer(self):
        return self.loaded[1] if self.loaded else None

    @functools.cached_property
    def loaded(self) -> tuple[Any, Any] | None:
        if self.model_path is None:
            return None
        from .models import SCALAR_CONFIG, load_policy
        from .reward_models import load_reward_model

        if (self.model_path / SCALAR_CONFIG).is_file():
            return load_reward_model(self.model_path)
        return load_policy(str(self.model_path))

    def read_json(self, name: str | None) -> dict[str, Any]:
        path = self.run_dir / name if self.run_dir and name else None
        return json.loads(path.read_text()) if path is not None and path.is_file() else {}

    def __repr__(self) -> str:
        return f"Result(stage={self.stage!r}, run_dir={str(self.run_dir)!r}, model_path={self.model_path})"


def command_named(stage: str) -> Stage:
    name = stage.replace(" ", "-").replace("_", "-")
    if name not in STAGES:
        raise ConfigError(f"unknown command {stage!r}; choose one of {', '.join(STAGES)}")
    return STAGES[name]


def check_launchable(cfg: Any, processes: int) -> None:
    """Launched processes read the config from a file (`command.launched`): they cannot receive Python objects."""
    if processes > 1 and any(isinstance(v, str) and v.startswith(PREFIX) for v in flat_values(cfg)):
        raise ConfigError(
            "num_processes > 1 runs the command in new processes, which cannot receive Python objects: give models "
            "as folders (model.save_pretrained) and reward functions as importable module:function"
        )


# the functions of this module that run a command, where their name is not the command's
CALL_NAMES = {"eval": "evaluate"}
CALLS = ("sft", "rm", "dpo", "ppo", "grpo", "rloo", "reinforce", "pipeline", "eval", "generate")


def call_of(command: Stage, arguments: str) -> str:
    """`command` called from Python with `arguments`: `rlhfkit.grpo(...)`, or `rlhfkit.run('data-analyze', ...)`
    for a command without a function of its own."""
    if command.name in CALLS:
        return f"rlhfkit.{CALL_NAMES.get(command.name, command.name)}({arguments})"
    return f"rlhfkit.run({command.name!r}{', ' if arguments else ''}{arguments})"


def check_keywords(command: Stage, options: dict[str, Any]) -> None:
    """Every keyword argument an option of `command`, refused in Python's words (not the command line's): a config
    object is the first positional argument, and TRL's names get the option they mean here."""
    names = [f.name for f in dataclasses.fields(command.config)]
    for key in options:
        if key == "config":
            raise ConfigError(
                "config: the config object is the first positional argument, "
                f"{call_of(command, command.config.__name__ + '(...)')}, not config="
            )
        if key.replace("-", "_") not in names:
            check_not_moved(command.config, key)
            raise ConfigError(
                f"{call_of(command, '')} got an unknown keyword argument {key!r}.{unknown_key_hint(names, key)} "
                f"`rlhfkit {' '.join(command.words)} --help` lists the options"
            )


def python_resume_call(command: Stage, cfg: Any, overrides: dict[str, Any]) -> str:
    """The call that continues a run from Python: `resume=` and, since config.yaml names them `python:<name>`, which
    only a Python session can supply, the same objects again for the options that were objects."""
    run_dir = getattr(cfg, "output_dir", "") or "<the run folder named above>"
    objects = [key for key, value in overrides.items() if names_a_python_object(value)]
    if any(key in MODEL_OPTIONS for key in objects):
        objects.append("tokenizer")
    again = "".join(f", {key}=..." for key in objects)
    same = f", giving {', '.join(objects)} the same objects as before" if objects else ""
    return f"{call_of(command, f'resume={str(run_dir)!r}{again}')}{same}"


def names_a_python_object(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and v.startswith(PREFIX) for v in values)


def flat_values(cfg: Any) -> list[Any]:
    values = []
    for value in dataclasses.asdict(cfg).values():
        values += value if isinstance(value, list) else [value]
    return values


def run(
    stage: str,
    config: Any = None,
    /,
    *,
    preset: str | None = None,
    config_file: str | os.PathLike | None = None,
    num_processes: int = 1,
    tokenizer: Any = None,
    **options: Any,
) -> Result:
    """Run the command `stage` ("sft", "grpo", "pipeline", "data-analyze", ...) as `rlhfkit <stage>` runs it and
    return its Result. Options are the command's (`rlhfkit <stage> --help` lists them), as Python values; a
    `config` object of the command's class is the base they apply to, as a preset or `config_file` is."""
    command = command_named(stage)
    check_takes_options(command, options)
    if command.config is None:  # what it is given is its positional argument or nothing: no Python value to pass
        raise ConfigError(f"{stage} has no call from Python; run it as `rlhfkit {' '.join(command.words)}`")
    if config is not None and not isinstance(config, command.config):
        raise ConfigError(f"config: {stage} takes a {command.config.__name__}, got a {type(config).__name__}")
    process_count(num_processes, "num_processes")
    if config is not None and (preset or config_file):
        raise ConfigError("give a config object or preset=/config_file=, not both (the options it holds would be lost)")
    check_sources(preset, config_file)
    check_keywords(command, options)
    with unstarted_runs_taken_back():
        overrides, objects = plain_options(options, tokenizer, str(options.get("hf_split", "")))
        with supplying(objects):
            cfg = command_config(
                command, preset, os.fspath(config_file) if config_file else None, overrides, num_processes, config
            )
            resume = python_resume_call(command, cfg, overrides)
            try:
                check_launchable(cfg, num_processes)
                with continued_from_python(resume, f"the same {call_of(command, '...')} call"):
                    code = execute(command, cfg, num_processes)
            except SystemExit as stop:  # the command line's way to end on Ctrl-C; Python's is KeyboardInterrupt
                if stop.code != exit_code(signal.SIGINT):
                    raise
                raise KeyboardInterrupt(f"{command.name} stopped by Ctrl-C; resume with {resume}") from None
    if code:
        raise LaunchFailed(f"{stage} on {num_processes} processes ended with exit code {code}; their lines say why")
    return Result(command.name, cfg, result_folder(command, cfg))


def result_folder(command: Stage, cfg: Any) -> Path | None:
    """The folder a command wrote: a run's `output_dir`, or the `out` folder of a command that declares what it
    writes there (`eval`, `rm-eval`, ...; not `generate`, whose `out` is a file); None for a timestamped one."""
    folder = getattr(cfg, "output_dir", "") or (getattr(cfg, "out", "") if command.outputs != Outputs() else "")
    return Path(folder) if folder else None


def stage_call(name: str):
    def call(config: Any = None, /, **options: Any) -> Result:
        return run(name, config, **options)

    call.__name__ = call.__qualname__ = name.replace("-", "_")
    call.__doc__ = (
        f"`rlhfkit {name}` from Python: {STAGES[name].about}.\n\nTakes the options of `rlhfkit {name} --help` as "
        "keyword arguments (and preset=, config_file=, num_processes=, tokenizer=); returns a Result. See `run`."
    )
    return call


sft = stage_call("sft")
rm = stage_call("rm")
dpo = stage_call("dpo")
ppo = stage_call("ppo")
grpo = stage_call("grpo")
rloo = stage_call("rloo")
reinforce = stage_call("reinforce")
distill = stage_call("distill")
pipeline = stage_call("pipeline")
evaluate = stage_call("eval")
generate = stage_call("generate")
