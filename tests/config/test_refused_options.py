"""Options refused before anything loads: no steps and no epochs, a batch that does not divide, a validation
fraction outside [0, 1). One line,
exit code 2, nothing written."""

from __future__ import annotations

import pytest

from rlhfkit.cli import main as cli_main

from ..support.mistakes import one_error_line, refusal_line
from ..support.tiny import command


def test_no_steps_and_no_epochs_is_refused_naming_both(ppo_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    line = one_error_line(command("sft", ppo_dirs, out, max_steps=0, num_epochs=0), capsys)
    assert "max_steps=0" in line and "num_epochs=0" in line, line
    assert not out.exists()



@pytest.mark.parametrize(
    "stage, options, expected",
    [
        (
            "sft",
            {"total_batch_size": 6, "micro_batch_size": 4},
            "total_batch_size=6 must be a multiple of micro_batch_size",
        ),
        (
            "rm",
            {"total_batch_size": 8, "micro_batch_size": 3},
            "total_batch_size=8 must be a multiple of micro_batch_size",
        ),
        (
            "dpo",
            {"total_batch_size": 8, "micro_batch_size": 3},
            "total_batch_size=8 must be a multiple of micro_batch_size",
        ),
        ("ppo", {"num_minibatches": 3}, "total_batch_size=8 must be a multiple of num_minibatches=3"),
        ("grpo", {"samples_per_prompt": 3}, "total_batch_size=8 must be a multiple of samples_per_prompt=3"),
    ],
)
def test_a_batch_that_does_not_divide_fails_before_any_data_is_read(
    ppo_dirs, tmp_path, capsys, stage, options, expected
):
    out = tmp_path / "run"
    line = one_error_line(command(stage, ppo_dirs, out, data=tmp_path / "never-read.jsonl", **options), capsys)
    assert expected in line, line
    assert not out.exists()


@pytest.mark.parametrize("command", ["rm", "rm-eval"])
@pytest.mark.parametrize("value", ["1.5", "1", "-0.1"])
def test_a_validation_fraction_outside_0_to_1_is_refused_naming_the_option_and_its_range(
    command, value, tmp_path, capsys
):
    assert (
        cli_main(
            [
                command,
                "model=never-loaded",
                "data=never-read",
                f"validation_fraction={value}",
                f"{'output_dir' if command == 'rm' else 'out'}={tmp_path / 'out'}",
            ]
        )
        == 2
    )
    line = refusal_line(capsys.readouterr().err)
    assert f"validation_fraction={float(value)} is out of range; it must be >= 0 and below 1" in line
    assert not (tmp_path / "out").exists()
