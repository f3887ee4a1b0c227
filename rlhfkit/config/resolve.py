"""A command's config from its class: dataclass defaults < preset or `--config FILE` < command-line
`key=value`, then the checks across options. The caller hands in the class (the stage registry holds
which class each command has), so the config package knows no stage."""

from __future__ import annotations

import dataclasses
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from .checks import check_config, launched_processes
from .values import apply, describe_type, read_yaml_text


def field_info(cls: type) -> list[tuple[str, Any, str, str | None, str]]:
    """(name, default, help, source, type description) for every field of a config class."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append(
            (f.name, default, f.metadata.get("help", ""), f.metadata.get("source"), describe_type(hints[f.name]))
        )
    return rows


def preset_names() -> list[str]:
    return sorted(
        p.name[: -len(".yaml")] for p in resources.files("rlhfkit.presets").iterdir() if p.name.endswith(".yaml")
    )


def read_preset(name: str) -> tuple[dict[str, Any], str]:
    path = resources.files("rlhfkit.presets") / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; shipped presets: {', '.join(preset_names())}")
    return read_yaml_text(path.read_text(), f"preset {name}"), f"preset {name}"


def read_config_file(path: str) -> tuple[dict[str, Any], str]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return read_yaml_text(p.read_text(), str(p)), str(p)


def resolve(
    cls: type,
    stage: str,
    preset: str | None,
    config_file: str | None,
    overrides: dict[str, Any],
    processes: int = 1,
    base: Any = None,
) -> Any:
    """The config of class `cls` for the command `stage` (the `stage:` key presets and files declare),
    from defaults (or a `base` config of that class), a preset or file, and overrides, checked for
    `processes` processes."""
    cfg = base if base is not None else cls()
    for source in (read_preset(preset) if preset else None, read_config_file(config_file) if config_file else None):
        if source is None:
            continue
        values, where = source
        declared = values.pop("stage", stage)
        if declared != stage:
            raise ConfigError(f"{where} is for stage {declared!r}, not {stage!r}")
        base_preset = values.pop("preset", None)  # a config file may start from a preset's values
        if base_preset is not None:
            preset_values, preset_where = read_preset(str(base_preset))
            preset_stage = preset_values.pop("stage", stage)
            if preset_stage != stage:
                raise ConfigError(
                    f"{where} starts from {preset_where}, which is for stage {preset_stage!r}, not {stage!r}"
                )
            cfg = apply(cls, preset_values, preset_where, cfg)
        cfg = apply(cls, values, where, cfg)
    return check_config(apply(cls, overrides, "command-line arguments", cfg), launched_processes(processes))


def to_yaml(cfg: Any, stage: str) -> str:
    return yaml.safe_dump({"stage": stage, **dataclasses.asdict(cfg)}, sort_keys=False)
