"""Config values as YAML files and the command line give them, made into a stage's config: each key
checked against the config class (a known field, its type, its minimum), with a close match named
when it is misspelt, and applied on top of the values before it (`apply`)."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import field
from typing import Any, Literal

import yaml

from ..errors import ConfigError


def describe_type(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    if typing.get_origin(tp) is list:
        return "list of " + describe_type(typing.get_args(tp)[0]) + " (comma separated)"
    if isinstance(tp, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is dict:
        return "mapping (YAML flow style, '{key: value, ...}'; merged into the one the preset or default gives)"
    return getattr(tp, "__name__", str(tp))


def read_yaml_text(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of key: value, got {type(data).__name__}")
    return data


YAML_BOOL_WORDS = {True: ("yes", "on", "true", "y"), False: ("no", "off", "false", "n")}


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Convert a YAML or command-line value to the field's type, or fail naming the key."""
    origin = typing.get_origin(tp)
    if value is None:
        raise ConfigError(f"{key} has no value (YAML null); give a {describe_type(tp)}, or '' for an empty string")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if isinstance(value, bool):  # YAML 1.1 reads a bare `no`/`off`/`yes`/`on` as a boolean
            value = next((a for a in allowed if str(a).lower() in YAML_BOOL_WORDS[value]), value)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not accepted; choose one of: {', '.join(map(str, allowed))}")
        return value
    if origin is dict:
        if isinstance(value, str):
            value = read_yaml_text(value, key)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} expects a mapping of key: value, got {value!r}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, list):
            raise ConfigError(f"{key} expects a list ({describe_type(tp)}), got {value!r}")
        return [coerce(key, v, item_tp) for v in value]
    if isinstance(value, bool) and tp in (int, float):
        raise ConfigError(f"{key} expects {tp.__name__}, got boolean {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key} expects a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, int):
            return value
        try:
            return int(str(value).replace("_", ""))
        except ValueError:
            raise ConfigError(f"{key} expects an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} expects a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, dict | list):
            raise ConfigError(f"{key} expects a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{key}: unsupported field type {tp}")


# TRL's argument names (GRPOConfig, DPOConfig, SFTConfig and their trainers) -> the options that mean the same here,
# the first one a command has named; spelling alone would point a TRL user elsewhere (num_generations: to
# generation_batch_size)
TRL_NAMES = {
    "num_generations": ("samples_per_prompt",),
    "train_dataset": ("data",),
    "beta": ("kl_coef",),  # the KL coefficient of the on-policy stages; DPO's own option is beta
    "reward_funcs": ("reward_functions",),
    "ref_model": ("reference_model",),
    "max_completion_length": ("max_response_length",),
    "max_prompt_length": ("max_query_length",),
    "num_train_epochs": ("num_epochs", "update_epochs"),
    "per_device_train_batch_size": ("micro_batch_size",),
    "epsilon": ("clip_range",),
    "epsilon_high": ("clip_range_high",),
    "num_iterations": ("update_epochs",),
}


def unknown_key_hint(names: list[str], key: str) -> str:
    """What to write instead of the unknown `key`: the option of that meaning when it is TRL's name for it, else
    the options spelt like it."""
    same = [name for name in TRL_NAMES.get(key, ()) if name in names]
    if same:
        return f" TRL's {key} is {same[0]} here."
    close = difflib.get_close_matches(key, names, n=3)
    return f" Did you mean: {', '.join(close)}?" if close else ""


def check_not_moved(cls: type, key: str) -> None:
    """An option that left `cls` for another command (its `MOVED_OPTIONS`) refused in one line naming that command."""
    moved = getattr(cls, "MOVED_OPTIONS", {})
    if key in moved:
        raise ConfigError(f"{key}: {moved[key]}")


def check_known(cls: type, key: str, where: str) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    if key not in names:
        check_not_moved(cls, key)
        hint = unknown_key_hint(names, key)
        raise ConfigError(f"unknown key {key!r} in {where}.{hint} Accepted keys: {', '.join(names)}")


def check_range(cls: type, key: str, value: Any) -> Any:
    """No numeric option is meaningful below its minimum (0 unless the field says otherwise), nor, where
    the field has one, at or above its `below` bound."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        meta = next(f.metadata for f in dataclasses.fields(cls) if f.name == key)
        minimum, below = meta.get("minimum", 0), meta.get("below")
        if value < minimum or (below is not None and value >= below):
            bound = f">= {minimum}" + (f" and below {below}" if below is not None else "")
            raise ConfigError(f"{key}={value} is out of range; it must be {bound}")
    return value


def apply(cls: type, values: dict[str, Any], where: str, base: Any = None) -> Any:
    """Return a config of `cls` with `values` (from `where`) applied on top of `base`."""
    hints = typing.get_type_hints(cls)
    current = dataclasses.asdict(base) if base is not None else {}
    for key, value in values.items():
        key = key.replace("-", "_")
        check_known(cls, key, where)
        value = check_range(cls, key, coerce(key, value, hints[key]))
        # a mapping (a pipeline stage's options) is merged into the one it overrides, not replaced
        current[key] = {**current.get(key, {}), **value} if isinstance(value, dict) else value
    return cls(**current)


def opt(default: Any, help: str, source: str | None = None, minimum: float = 0, below: float | None = None) -> Any:
    """A config field with help text, the paper source of its default, and (numbers) its lower bound and
    the bound it must stay below (a fraction of the data: below 1)."""
    meta = {"help": help, "source": source, "minimum": minimum, "below": below}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def query_length_opt() -> Any:
    return opt(
        512,
        "query tokens; a longer post loses paragraphs from its end (a dialogue or prompt text: from its start), and a "
        "record of which no text fits is skipped and counted",
        "Detail 2",
        minimum=1,
    )


# the help of `data_format` / `prompt_format`: the default detects the format, and every format it detects is one
# option away for data that should be read only in it (docs/data-formats.md)
AUTO_FORMAT_HELP = (
    "format of `data`; the default, auto, detects it from the first record's columns and prints it. Each format is "
    "also one option away: "
)
SFT_FORMATS_HELP = AUTO_FORMAT_HELP + (
    "tldr-sft (TL;DR posts and summaries), gsm8k (question, answer: the solution, its last line `#### N` written "
    "as `The answer is N.`), prompt-completion (TRL's prompt and completion columns, strings or chat messages), "
    "language-modeling (a text or messages column); docs/data-formats.md"
)
PAIR_FORMATS_HELP = AUTO_FORMAT_HELP + (
    "tldr-comparisons (OpenAI's TL;DR and CNN/DM comparisons), hh (HH-RLHF chosen/rejected dialogues), preference "
    "(TRL's chosen, rejected and optional prompt columns, strings or chat messages); docs/data-formats.md"
)
PROMPT_FORMATS_HELP = AUTO_FORMAT_HELP + (
    "tldr-sft (TL;DR posts; the summary is the reference), prompt-only (TRL's prompt column, a string or chat "
    "messages; a completion column is the reference), hh (HH-RLHF dialogues; the chosen response is the "
    "reference), gsm8k (question, answer: the reference solution, its final number the `answer` column the gsm8k "
    "reward reads); docs/data-formats.md"
)


def article_length_opt() -> Any:
    return opt(2047, "query token budget for CNN/DM articles", "Detail 5", minimum=1)


def remote_code_opt() -> Any:
    return opt(False, "allow model code from the hub (off: safer)")


def output_overwrite_opt() -> Any:
    return opt(
        False, "write over what `out` already holds (off: an existing output is refused, never overwritten silently)"
    )


# the episode options an on-policy stage and `eval gsm8k` share (`EpisodeOptions`): declared once, so the
# evaluation's episodes run under the training's limits unless a run says otherwise
def environment_args_opt() -> Any:
    return opt({}, "keyword arguments of the environment's class (e.g. {max_calls: 4})")


def environment_timeout_opt() -> Any:
    return opt(
        600.0,
        "seconds one call of the environment (its constructor, respond, components) may run; one still running "
        "stops the run, naming the environment and the episode (0: no limit; docs/environments.md)",
        minimum=0.0,
    )


def max_turns_opt() -> Any:
    return opt(16, "multi-turn episodes: the policy's turns at most (a turn ends at its EOS or a tool call)", minimum=1)


def check_tokens_opt() -> Any:
    return opt(
        False,
        "multi-turn episodes: check that every episode's ids equal the chat template's rendering of its "
        "conversation, and stop at the first that does not, naming the position (chat prompts only)",
    )


def pickle_opt() -> Any:
    return opt(
        False,
        "load pickle weights (pytorch_model.bin, *.pt) from a folder without safetensors "
        "(off: unpickling can run code)",
    )


def parse_named(specs: list[str], key: str, example: str) -> dict[str, str]:
    """`name=value` entries in order, each name once."""
    named: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"{key} entry {spec!r} must be name=path (e.g. {example})")
        if name in named:
            raise ConfigError(f"{key}: the name {name!r} is given twice")
        named[name] = value
    return named
