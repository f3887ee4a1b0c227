"""Small data under the defaults: a 16-row dataset is not refused because 300 validation prompts would be held
out; it holds out a tenth of its prompts, and says so."""

import pytest

from rlhfkit.data.split import held_out_count, split_by_prompt


@pytest.mark.parametrize(
    ("asked", "prompts", "held"), [(300, 3000, 300), (300, 300, 300), (300, 16, 2), (300, 4, 1), (300, 1, 0), (0, 5, 0)]
)
def test_the_validation_posts_asked_for_are_held_out_unless_the_data_has_fewer_prompts(asked, prompts, held, capsys):
    assert held_out_count(asked, prompts) == held
    assert ("holding out" in capsys.readouterr().out) == (asked > prompts)


def test_a_16_row_dataset_splits_under_the_default_and_says_how(capsys):
    records = [f"prompt {i}" for i in range(16)]
    train, validation = split_by_prompt(records, lambda r: r, validation_size=300, seed=1)
    assert (len(train), len(validation)) == (14, 2)
    assert "validation_posts=300 is more than the data's 16 distinct prompts: holding out 2" in capsys.readouterr().out


def test_sft_from_python_on_16_rows_runs_with_the_default_validation_posts(tiny_model_dir, tmp_path):
    import rlhfkit

    rows = [{"prompt": f"What is {i} plus {i}?", "completion": f" {2 * i}."} for i in range(16)]
    result = rlhfkit.sft(model=str(tiny_model_dir), data=rows, max_steps=1, total_batch_size=4, micro_batch_size=4,
                         eval_samples=0, report_to=[], output_dir=str(tmp_path / "sft"))
    assert result.metrics["train/loss"].notna().any()
