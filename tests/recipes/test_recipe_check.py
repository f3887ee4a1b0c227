"""`rlhfkit recipe check`: a run's numbers beside its recipe's expected ones, exit 1 outside a band; and every
recipe's expected.json names numbers the check can read."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli import main as cli_main

from ..support.data import REPO

ACCURACY = {"tables": {"all": [{"policy": "base", "greedy_accuracy": 0.30}, {"policy": "grpo", "greedy_accuracy": 0.45,
                                                                           "greedy_minus_first_low": 0.08}]}}
METRICS = [{"step": 1, "rewards/gsm8k": 0.2}, {"step": 2, "rewards/gsm8k": 0.5}]


def number(name, file, path, expected, low, high):
    return {"name": name, "file": file, "path": path, "expected": expected, "low": low, "high": high}


@pytest.fixture
def recipe(tmp_path):
    root = tmp_path / "runs"
    (root / "eval").mkdir(parents=True)
    (root / "grpo").mkdir()
    (root / "eval" / "accuracy.json").write_text(json.dumps(ACCURACY))
    (root / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in METRICS))
    numbers = [
        number("base greedy accuracy", "eval/accuracy.json", "tables.all[policy=base].greedy_accuracy", 0.3, 0.2, 0.4),
        number("grpo minus base, low end", "eval/accuracy.json", "tables.all[policy=grpo].greedy_minus_first_low",
               0.08, 1e-9, 1),
        number("last training reward", "grpo/metrics.jsonl", "-1.rewards/gsm8k", 0.5, 0.3, 1),
    ]
    folder = tmp_path / "recipe"
    folder.mkdir()
    (folder / "expected.json").write_text(json.dumps({"variants": {"short": {"root": str(root), "numbers": numbers}}}))
    return folder, root


def test_numbers_inside_their_bands_pass_and_are_printed_beside_the_expected(recipe, capsys):
    folder, _ = recipe
    assert cli_main(["recipe", "check", f"expected={folder}", "variant=short"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 numbers inside their bands" in out
    assert "last training reward" in out and "0.5000" in out and "[0.3, 1]  ok" in out


def test_a_number_outside_its_band_or_missing_fails_the_check(recipe, capsys):
    folder, root = recipe
    (root / "grpo" / "metrics.jsonl").write_text(json.dumps({"step": 1, "rewards/gsm8k": 0.1}) + "\n")
    (root / "eval" / "accuracy.json").unlink()
    assert cli_main(["recipe", "check", f"expected={folder}", "variant=short"]) == 1
    out = capsys.readouterr().out
    assert out.count("OUT OF BAND") == 3 and "missing" in out and "0 of 3 numbers inside" in out


def test_an_unknown_variant_or_folder_is_one_line(recipe, tmp_path, capsys):
    folder, _ = recipe
    assert cli_main(["recipe", "check", f"expected={folder}", "variant=long"]) == 2
    assert "variant='long'" in capsys.readouterr().err
    assert cli_main(["recipe", "check", f"expected={tmp_path / 'nowhere'}"]) == 2
    assert "no such file" in capsys.readouterr().err


def check_error(capsys, *options: str) -> str:
    """The one stderr line of `rlhfkit recipe check OPTIONS`, which must exit 2."""
    assert cli_main(["recipe", "check", *options]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


NO_HIGH = '{"variants": {"full": {"root": "r", "numbers": [{"name": "n", "file": "f", "path": "p", "low": 0}]}}}'
SHAPES = [  # (expected.json's text, the line after "expected=<path>")
    ('{"variants": {"full": {"root": "<tmp>", "numbers": [\n', " is not valid JSON (line 2 column 1: Expecting value)"),
    ('{"something": "else"}', ' has no "variants"'),
    ('["variants"]', ' has no "variants"'),
    ('{"variants": {"full": {"root": "r"}}}', ": variant 'full' has no \"numbers\""),
    (NO_HIGH, ": variant 'full' numbers[0] lacks expected, high (each number holds name, file, path, expected, low"),
]


@pytest.mark.parametrize(("text", "problem"), SHAPES)
def test_an_expected_json_that_is_malformed_or_of_another_shape_is_one_line_naming_it(tmp_path, capsys, text, problem):
    path = tmp_path / "expected.json"
    path.write_text(text)
    assert check_error(capsys, f"expected={path}").startswith(f"rlhfkit: error: expected={path}{problem}")


def test_a_root_that_does_not_exist_is_one_line_not_a_table_of_missing_numbers(recipe, tmp_path, capsys):
    """root= or the variant's own root."""
    folder, root = recipe
    line = check_error(capsys, f"expected={folder}", "variant=short", f"root={tmp_path / 'nowhere'}")
    assert line.startswith(f"rlhfkit: error: root={tmp_path / 'nowhere'}: no such folder; run the recipe's commands")
    root.rename(tmp_path / "moved")
    line = check_error(capsys, f"expected={folder}", "variant=short")
    assert line.startswith(f"rlhfkit: error: the root {root} that {folder} names: no such folder")


def test_every_recipe_states_each_number_with_a_band_around_its_measured_value():
    """Over the recipes that have their expected numbers yet (a recipe in progress has none), at least one."""
    found = sorted((REPO / "recipes").glob("*/expected.json"))
    assert found, f"no recipes/*/expected.json under {REPO}"
    for expected in found:
        for name, variant in json.loads(expected.read_text())["variants"].items():
            assert variant["root"] and variant["numbers"], (expected, name)
            for entry in variant["numbers"]:
                assert entry["low"] <= entry["expected"] <= entry["high"], (expected, name, entry["name"])
                assert entry["file"] and entry["path"], (expected, name, entry["name"])
