"""The report builder: cells, the standard sections, caveats computed from the numbers, readable figures."""

import json

import pytest

from rlhfkit.plots import PANELS_PER_ROW, integer_steps, plot_curves, pyplot
from rlhfkit.report import caveats
from rlhfkit.report.report import Report, format_value, table_html, with_intervals


def test_long_cells_are_collapsed_behind_their_first_lines_and_everything_is_escaped():
    post = "\n".join(f"line {i} <b>not bold</b>" for i in range(10))
    html = table_html([{"post": post, "score": 0.123456, "short": "a < b"}], ["post", "score", "short"])
    assert "<details><summary>line 0 &lt;b&gt;not bold&lt;/b&gt;\nline 1" in html
    assert "line 3" not in html.split("</summary>")[0] and "line 9" in html  # the rest is one click away
    assert "<td>0.123</td>" in html and "<td>a &lt; b</td>" in html


@pytest.mark.parametrize(
    "value, shown",
    [
        (None, "-"),
        ("", "-"),
        (float("inf"), "n/a"),
        (float("-inf"), "n/a"),
        (float("nan"), "n/a"),
        ("inf", "n/a"),
        ("None", "n/a"),
        (87.8, "87.8"),
        (23.5, "23.5"),
        (0.48034, "0.480"),
        (-0.0963, "-0.096"),
        (1.2345, "1.23"),
        (12.0, "12"),
        (123456.0, "123,456"),
        (True, "yes"),
        ((0.48, 0.41, 0.55), "0.480 [0.410, 0.550]"),
        ((-0.009, -0.025, 0.006), "-0.009 [-0.025, +0.006]"),
        ((0.625, 0.25, 1.0), "0.625 [0.250, 1.000]"),
        ((0.5, None, None), "0.500"),
        ({"a": 1.5, "b": None}, "a 1.50; b -"),
        ([0.1, -0.2, 0.3], "0.100, -0.200, 0.300"),  # a list of scores, not an interval
    ],
)
def test_cells_are_rounded_to_what_they_carry_and_never_show_none_or_inf(value, shown):
    assert format_value(value) == shown


def test_interval_columns_merge_into_one_cell():
    row = {"policy": "a", "acc": 0.5, "acc_low": 0.4, "acc_high": 0.6, "n": 3}
    assert with_intervals(row) == {"policy": "a", "acc": (0.5, 0.4, 0.6), "n": 3}


def test_a_report_has_the_standard_sections_in_order_and_its_caveats_beside_the_numbers(tmp_path):
    report = Report("t", {"model": "m", "seconds": None}, config="a: 1\n")
    report.number("accuracy", (0.48, 0.41, 0.55), 0.64, "always prefer the longer response", "below the length rule")
    report.number("loss", float("inf"), 0.693, "ln 2")
    report.caveat("trained on 16 episodes")
    report.table("Groups", [{"g": "x", "acc": None}])
    path = report.write(tmp_path)
    html = path.read_text()
    order = ["Run summary", "Caveats", "Headline numbers", "Groups", "Configuration"]
    assert [html.index(f"<h2>{h}") for h in order] == sorted(html.index(f"<h2>{h}") for h in order)
    assert "<li>trained on 16 episodes</li>" in html and "<li>accuracy: below the length rule</li>" in html
    assert "<td>below the length rule</td>" in html  # and beside the number itself
    assert ">None<" not in html and ">inf<" not in html and "<td>n/a</td>" in html and "<td>-</td>" in html
    record = json.loads((tmp_path / "report.json").read_text())
    assert record["numbers"][1]["value"] is None  # strict JSON
    assert record["caveats"] == ["trained on 16 episodes", "accuracy: below the length rule"]


def test_a_report_without_caveats_says_which_checks_ran(tmp_path):
    html = Report("t").write(tmp_path).read_text()
    assert "None of the checks fired" in html


def test_the_pipeline_gathers_each_stage_record_once_under_its_stage_name(tmp_path):
    stage = Report("rm")
    stage.number("accuracy", 0.48, 0.64, "always longer", "below the length rule")
    stage.caveat("trained on 16 pairs")
    stage.write(tmp_path / "rm")
    pipeline = Report("pipeline")
    pipeline.gather("rm", json.loads((tmp_path / "rm" / "report.json").read_text()))
    assert pipeline.all_caveats() == ["rm: trained on 16 pairs", "rm: accuracy: below the length rule"]
    stage.number("held-out accuracy", (0.48, 0.41, 0.55))
    stage.write(tmp_path / "rm")
    again = Report("pipeline")
    again.gather("rm", json.loads((tmp_path / "rm" / "report.json").read_text()))
    assert format_value(again.numbers[-1].value) == "0.480 [0.410, 0.550]"  # still an interval after JSON


def test_the_judge_caveat_fires_for_agreement_near_or_below_chance_and_names_its_source(tmp_path):
    shipped = caveats.measured_judge_agreement("hf-logprob:smollm2-135m", [tmp_path])
    line = caveats.judge_caveat("hf-logprob:smollm2-135m", shipped)
    assert "0.440 [0.393, 0.490]" in line and "below chance" in line and "docs/reproduction.md" in line
    assert (
        caveats.judge_caveat("x", {"agreement": 0.53, "low": 0.45, "high": 0.6, "pairs": 100, "source": "s"}).count(
            "near chance"
        )
        == 1
    )
    assert caveats.judge_caveat("x", {"agreement": 0.72, "low": 0.66, "high": 0.78, "pairs": 100, "source": "s"}) == ""
    assert "run `rlhfkit judge-eval judge=openai:gpt-4o`" in caveats.judge_caveat("openai:gpt-4o", None)
    assert caveats.judge_caveat("rm:folder", None) == ""


def test_a_judge_eval_run_overrides_the_shipped_figure(tmp_path):
    (tmp_path / "judge-eval-a").mkdir()
    summary = {
        "judge": {"judge": "hf-logprob:smollm2-135m"},
        "pairs": 40,
        "agreement": {"agreement": 0.7, "low": 0.6, "high": 0.8},
    }
    (tmp_path / "judge-eval-a" / "judge_eval.json").write_text(json.dumps(summary))
    measured = caveats.measured_judge_agreement("hf-logprob:smollm2-135m", [tmp_path])
    assert measured["agreement"] == 0.7 and measured["pairs"] == 40 and "judge-eval-a" in measured["source"]
    assert caveats.judge_caveat("hf-logprob:smollm2-135m", measured) == ""


def test_reward_model_score_alarm_and_budget_caveats_fire_only_when_their_numbers_say_so():
    assert "at or below always-prefer-longer (0.647)" in caveats.reward_model_caveat(0.48, 0.647, -0.05)
    assert caveats.reward_model_caveat(0.70, 0.60, 0.05) == ""  # beats the rule by more than its interval
    assert "not distinguishable" in caveats.reward_model_caveat(0.62, 0.60, -0.03)
    assert (
        caveats.fell_caveat("RM score", -0.096, -0.556, "SFT policy")
        == "RM score fell from -0.096 (SFT policy) to -0.556"
    )
    assert caveats.fell_caveat("RM score", -0.5, -0.1, "SFT policy") == ""
    assert "eos_rate 0.625" in caveats.alarm_caveat("ppo", {"flags": ["eos_rate"], "eos_rate": 0.625})
    assert caveats.alarm_caveat("ppo", {"flags": []}) == ""
    assert "16 episodes, 0.0016% of the paper's 1,000,000" in caveats.budget_caveat("ppo", 16)
    assert caveats.budget_caveat("ppo", 500_000) == ""
    assert caveats.few_prompts_caveat(8).startswith("evaluated on 8 prompts") and caveats.few_prompts_caveat(500) == ""


def test_curves_put_at_most_three_panels_a_row_on_integer_steps(tmp_path):
    rows = [{"step": i, **{f"m{k}": k * i for k in range(7)}} for i in range(1, 3)]
    path = plot_curves(rows, [f"m{k}" for k in range(7)], tmp_path / "c.png", "seven")
    from PIL import Image

    width, height = Image.open(path).size
    assert (
        width <= 4.6 * PANELS_PER_ROW * 110 + 10 and height > 3 * 3.4 * 110
    )  # three rows of three, not one row of seven
    fig, ax = pyplot().subplots()
    ax.plot([1, 2], [0, 1])
    integer_steps(ax)
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
