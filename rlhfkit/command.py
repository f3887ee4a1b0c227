"""The one path of every command under both shells: the command line (`cli.py`) and the Python API (`api.py`) each
turn what they were given into options, then call `command_config` and `execute` here, after the same checks
(`check_sources`, `process_count`, `check_takes_options`), so that the two shells refuse the same mistakes in the
same words. Neither shell imports the other.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import to_yaml
from .errors import ConfigError
from .launch import inside_launcher, relaunch
from .run_folder import require_resume_path
from .stages import Stage, multi_process_names, resolve


def check_sources(preset: str | None, config_file: str | None) -> None:
    """A preset or a config file, not both: the file's options would silently win over the preset's, or the other
    way round."""
    if preset and config_file:
        raise ConfigError("give a preset or a config file, not both (a config file can start from a preset's values)")


def process_count(value: Any, option: str) -> int:
    """The processes `option` (`--num-processes` or `num_processes=`) asks for, a whole number >= 1 given as a
    number or as its digits."""
    digits = isinstance(value, str) and value.strip().isdigit()
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not (digits or whole) or int(value) < 1:
        raise ConfigError(f"{option} expects a whole number >= 1, got {value!r}")
    return int(value)


def check_takes_options(command: Stage, given: Iterable[str]) -> None:
    """A command without a config class (`dist-check`, `models prepare`) refuses options rather than ignore them."""
    given = list(given)
    if command.config is None and given:
        raise ConfigError(f"{' '.join(command.words)} takes no options: got {', '.join(given)}")


def resumed_run_config(resume: str | None, preset: str | None) -> str | None:
    """`resume=RUN` without a preset or config file continues with the run's own config.yaml as the base,
    so a resumed run keeps its data, batch and schedule; values given now still win."""
    from .checkpoint import find_checkpoint  # reads checkpoints: only a resumed command pays for the import

    if not resume or preset:
        return None
    require_resume_path(resume)
    checkpoint = find_checkpoint(resume)
    candidates = [Path(resume) / "config.yaml"] + ([checkpoint.parents[1] / "config.yaml"] if checkpoint else [])
    return next((str(c) for c in candidates if c.is_file()), None)


def command_config(
    command: Stage,
    preset: str | None,
    config_file: str | None,
    overrides: dict[str, Any],
    processes: int,
    base: Any = None,
) -> Any:
    """The checked config of `command`: defaults (or `base`) < preset or file < overrides; `resume=` alone
    starts from the resumed run's config.yaml."""
    own_config = None if config_file else resumed_run_config(overrides.get("resume"), preset)
    if own_config:  # the run's own options: its first start may have moved another run aside
        overrides.setdefault("overwrite", "false")
        # where the run is now, not the output_dir its config.yaml names: the folder may have been moved or copied
        overrides.setdefault("output_dir", str(Path(own_config).parent))
    return resolve(command.name, preset, config_file or own_config, overrides, processes, base)


def execute(command: Stage, argument: Any, processes: int) -> int:
    """Run `command` on its config (or positional argument) in this process or, for N > 1 processes, in N
    launched ones (`launched`); the exit code."""
    if processes > 1 and not inside_launcher():
        if not command.multi_process:
            raise ConfigError(
                f"{' '.join(command.words)} runs in one process; --num-processes (num_processes= in Python) is for "
                f"{multi_process_names()}"
            )
        return launched(command, argument, processes)
    if not inside_launcher():
        return int(command.runner()(argument) or 0)
    from .distributed import leave_process_group  # imports torch.distributed: only launched processes pay

    try:
        code = int(command.runner()(argument) or 0)
    except SystemExit:  # a stop all processes agreed on (preemption): they leave together
        leave_process_group()
        raise
    leave_process_group()
    return code


def launched(command: Stage, cfg: Any, processes: int) -> int:
    """`command` run on `processes` launched processes, the one route of both shells. A command with options runs
    there as `rlhfkit <command> --config FILE` on the config resolved here, so every process reads exactly what
    this one resolved and checked (preset or file, `resume=`'s own config.yaml, the options given); a command
    without options (`dist-check`) runs as it is."""
    if command.config is None:
        return relaunch(list(command.words), processes)
    with tempfile.TemporaryDirectory(prefix="rlhfkit-config-") as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(to_yaml(cfg, command.name))
        return relaunch([*command.words, "--config", str(path)], processes)
