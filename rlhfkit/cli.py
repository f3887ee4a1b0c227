"""`rlhfkit <stage> [--preset NAME | --config FILE] [key=value | --key value ...] [--num-processes N]`."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from . import config as cfgmod
from .command import check_sources, check_takes_options, command_config, execute, process_count
from .errors import ConfigError, NonFiniteError, UserError
from .launch import say_once
from .presets import ABOUT
from .run_folder import unstarted_runs_taken_back
from .stages import STAGES, Stage


def find_command(argv: list[str]) -> tuple[Stage, list[str]]:
    for cmd in sorted(STAGES.values(), key=lambda c: -len(c.words)):
        if tuple(argv[: len(cmd.words)]) == cmd.words:
            return cmd, argv[len(cmd.words) :]
    raise ConfigError(f"unknown command {' '.join(argv[:2]) or '(none)'!r}\n\n{overview()}")


def sub_commands(words: tuple[str, ...]) -> list[Stage]:
    """The commands whose words start with `words` and go on: `data analyze` under `data`, `eval gsm8k` under
    `eval`."""
    return [c for c in STAGES.values() if len(c.words) > len(words) and c.words[: len(words)] == words]


def group_help(word: str) -> str | None:
    """`rlhfkit data --help`: the commands whose first word is `word` (data analyze, models prepare), or None when
    `word` is a command of its own (`eval`, whose help lists `eval gsm8k`)."""
    group = sub_commands((word,))
    if not group or word in STAGES:
        return None
    lines = [f"usage: rlhfkit {word} <command> ...", "", "commands:"] + [
        f"  {' '.join(c.words):<18} {c.about}" for c in group
    ]
    return "\n".join([*lines, "", f"`rlhfkit {' '.join(group[0].words)} --help` lists its options."])


def overview() -> str:
    lines = [
        "usage: rlhfkit <command> [--preset NAME | --config FILE] [key=value ...] [--num-processes N]",
        "",
        "commands:",
    ]
    lines += [f"  {' '.join(c.words):<18} {c.about}" for c in STAGES.values()]
    lines += ["", f"presets: {', '.join(cfgmod.preset_names())}", "`rlhfkit <command> --help` lists every option."]
    return "\n".join(lines)


def command_help(cmd: Stage) -> str:
    usage = f"usage: rlhfkit {' '.join(cmd.words)}"
    usage += f" {cmd.positional.upper()}" if cmd.positional else ""
    launcher = " [--num-processes N]" if cmd.multi_process else ""
    if cmd.config is None:
        return f"{usage}{launcher}\n\n{cmd.about}"
    lines = [f"{usage} [--preset NAME | --config FILE] [key=value | --key value ...]{launcher}", "", cmd.about]
    lines += preset_lines(cmd.presets)
    under = sub_commands(cmd.words)
    lines += ["", "commands under it:"] + [f"  {' '.join(c.words):<18} {c.about}" for c in under] if under else []
    lines += ["", "options (default; source):"]
    for name, default, help_text, source, type_text in cfgmod.field_info(cmd.config):
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        src = f"  [{source}]" if source else ""
        lines.append(f"  {name:<24} {help_text}{src}")
        lines.append(f"  {'':<24}   default: {shown!s}   type: {type_text}")
    return "\n".join(lines)


def preset_lines(presets: tuple[str, ...]) -> list[str]:
    """The presets a command takes, one line each with its description where it has one."""
    if not presets:
        return ["", "presets: none shipped for this command (--config FILE reads options from YAML)"]
    return ["", "presets (--preset NAME):"] + [f"  {name:<24} {ABOUT.get(name, '')}".rstrip() for name in presets]


@dataclass
class Parsed:
    preset: str | None = None
    config_file: str | None = None
    num_processes: int = 1
    overrides: dict | None = None
    positional: str | None = None
    help: bool = False


def parse_args(cmd: Stage, args: list[str]) -> Parsed:
    """Accept `key=value`, `--key value` and `--key=value`, plus the launcher flags."""
    parsed = Parsed(overrides={})
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            parsed.help = True
            i += 1
            continue
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"--{key} needs a value")
                value, i = args[i + 1], i + 1
        elif "=" in arg:
            key, _, value = arg.partition("=")
        elif cmd.positional and parsed.positional is None:
            parsed.positional = arg
            i += 1
            continue
        else:
            raise ConfigError(f"unexpected argument {arg!r}; options are key=value or --key value")
        key = key.replace("-", "_")
        if key == "preset":
            parsed.preset = value
        elif key == "config":
            parsed.config_file = value
        elif key == "num_processes":
            parsed.num_processes = process_count(value, "--num-processes")
        else:
            parsed.overrides[key] = value
        i += 1
    check_sources(parsed.preset, parsed.config_file)
    check_takes_options(cmd, parsed.overrides)
    return parsed


def main(argv: list[str] | None = None) -> int:
    from .launch import launched_process_status

    try:
        with launched_process_status() as outcome:
            outcome.code = run_command(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `rlhfkit sft --help | head`: the reader left; what it read is all it wanted
        quiet_closed_stdout()
        return 0
    return outcome.code


def quiet_closed_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def run_command(argv: list[str]) -> int:
    try:
        with unstarted_runs_taken_back():
            return run_stage(argv)
    except NonFiniteError as e:
        say_once(f"rlhfkit: stopped: {e}")
        return 3
    except UserError as e:  # the message names what to fix: one line, no traceback
        say_once(f"rlhfkit: error: {e}")
        return 2


def run_stage(argv: list[str]) -> int:
    """Run the command `argv` names, in this process or, under --num-processes N, in N launched ones."""
    if not argv or argv[0] in ("-h", "--help"):
        print(overview())
        return 0
    group = group_help(argv[0]) if len(argv) == 1 or argv[1] in ("-h", "--help") else None
    if group:
        print(group)
        return 0
    cmd, rest = find_command(argv)
    parsed = parse_args(cmd, rest)
    if parsed.help:
        print(command_help(cmd))
        return 0
    # a command without a config class is given its positional argument (None without one)
    argument = (
        command_config(cmd, parsed.preset, parsed.config_file, parsed.overrides, parsed.num_processes)
        if cmd.config
        else parsed.positional
    )
    return execute(cmd, argument, parsed.num_processes)


if __name__ == "__main__":
    sys.exit(main())
