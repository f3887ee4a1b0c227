"""A user's mistake through the command line and the Python API: one line, exit code 2, the same message; another
model's small tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest


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



def refusal_line(err: str) -> str:
    """The one `rlhfkit: error:` line of a refused command's stderr, which holds no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def tokenizer_of(tokens: int):
    """A word-level tokenizer of `tokens` tokens, the last one its EOS: another model's small vocabulary."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(WordLevel({f"w{i}": i for i in range(tokens - 1)} | {"</s>": tokens - 1}, unk_token="w0"))
    words.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="</s>")
