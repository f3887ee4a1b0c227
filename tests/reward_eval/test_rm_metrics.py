"""Reward-model evaluation over computed rewards (rlhfkit.reward_eval: metrics, calibration, probes, figures, report),
against hand-computed values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlhfkit.data.tldr import Comparison
from rlhfkit.plots import metric_series, plot_training_curves
from rlhfkit.reward_eval import calibration as cal
from rlhfkit.reward_eval import metrics as rm
from rlhfkit.reward_eval.evaluate import evaluate_rewards
from rlhfkit.reward_eval.probes import (
    ProbeFileError,
    load_probes,
    probe_checks,
    probe_items,
    probe_table,
    render_probe_table_markdown,
    word_count,
)
from rlhfkit.reward_eval.report import headline, write_rm_eval

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def pair(chosen="a good summary", rejected="bad", **metadata) -> Comparison:
    fields = {
        "subreddit": "personalfinance",
        "title": "Raise: car loan or savings?",
        "post": "I got a raise.",
    }
    return Comparison(
        prompt_id=metadata.pop("prompt_id", "p"),
        task=metadata.pop("task", "tldr"),
        fields=fields,
        chosen=chosen,
        rejected=rejected,
        where="test:1",
        **metadata,
    )


# --- accuracy and loss ----------------------------------------------------------------------


def test_accuracy_and_loss_by_hand():
    chosen, rejected = [2.0, 0.0, 1.0], [0.0, 1.0, 1.0]  # margins 2, -1, 0 (a tie counts as wrong)
    assert rm.pairwise_accuracy(chosen, rejected) == pytest.approx(1 / 3)
    # -log sigmoid(d) = log(1 + e^-d): log(1 + e^-2) = 0.126928, log(1 + e) = 1.313262, log 2 = 0.693147
    assert rm.pairwise_loss(chosen, rejected) == pytest.approx(
        (0.126928011 + 1.313261688 + 0.693147181) / 3, abs=1e-8
    )


def test_loss_is_stable_for_huge_margins():
    assert rm.pairwise_loss([1000.0], [0.0]) == pytest.approx(0.0, abs=1e-12)
    assert rm.pairwise_loss([0.0], [1000.0]) == pytest.approx(1000.0)


def test_bad_rewards_fail_clearly():
    with pytest.raises(ValueError, match="non-finite"):
        rm.pairwise_accuracy([1.0, float("nan")], [0.0, 0.0])
    with pytest.raises(ValueError, match="2 chosen rewards but 1 rejected"):
        rm.pairwise_loss([1.0, 2.0], [0.0])


# --- breakdown (Detail 16, Table 5) -------------------------------------------------------------


def test_accuracy_by_groups_counts_and_stderr():
    table = rm.accuracy_by(["batch10", "batch6", "batch10", None], np.array([True, False, False, True]))
    assert list(table) == ["batch6", "batch10", None]  # natural order: 6 before 10
    assert table["batch10"]["accuracy"] == 0.5 and table["batch10"]["count"] == 2
    assert table["batch10"]["stderr"] == pytest.approx(math.sqrt(0.25 / 2))
    assert table["batch6"] == {"accuracy": 0.0, "count": 1, "stderr": 0.0}


def test_breakdown_by_every_attribute():
    comparisons = [
        pair(split="valid1", batch="batch6", confidence=9, chosen_policy="ref", rejected_policy="sup4"),
        pair(split="valid1", batch="batch6", confidence=1, chosen_policy="sup4", rejected_policy="ref"),
        pair(split="valid2", batch="batch13", confidence=9, chosen_policy="ppo", rejected_policy="sup4"),
        pair(split="valid2", batch="batch0_cnndm", task="cnndm"),
    ]
    result = rm.breakdown(comparisons, [True, False, True, True])
    assert result["overall"]["accuracy"] == 0.75 and result["overall"]["count"] == 4
    assert {k: v["count"] for k, v in result["split"].items()} == {"valid1": 2, "valid2": 2}
    assert result["split"]["valid1"]["accuracy"] == 0.5
    assert list(result["batch"]) == ["batch0_cnndm", "batch6", "batch13"]
    assert {k: v["accuracy"] for k, v in result["confidence"].items()} == {1: 0.0, 9: 1.0, "unknown": 1.0}
    assert result["policy_pair"]["ref vs sup4"]["count"] == 2  # either order is the same pair
    assert result["policy_pair"]["ref vs sup4"]["accuracy"] == 0.5
    assert result["policy_pair"]["unknown"]["count"] == 1
    assert {k: v["count"] for k, v in result["task"].items()} == {"cnndm": 1, "tldr": 3}


# --- accuracy beside the always-longer rule, with bootstrap intervals ---------------------------


def five_pairs():
    """Token lengths that disagree with the characters ("a good summary" is always the longer text), so
    a result that used characters would show a length rule of 1.0."""
    comparisons = [pair(split="valid1")] * 3 + [pair(split="valid2")] * 2
    # chosen longer, shorter, equal, shorter, longer; the RM right, right, tied (wrong), wrong, wrong
    chosen_len, rejected_len = [10, 4, 7, 3, 8], [5, 9, 7, 6, 2]
    chosen, rejected = [1.0, 2.0, 0.5, -1.0, 0.0], [0.0, 1.0, 0.5, 0.0, 1.0]
    return comparisons, chosen, rejected, chosen_len, rejected_len


def test_length_rule_and_chosen_shorter_accuracy_by_hand():
    assert rm.length_rule_hits([10, 4, 7], [5, 9, 7]).tolist() == [1.0, 0.0, 0.5]
    assert rm.chosen_shorter_mask([10, 4, 7], [5, 9, 7]).tolist() == [False, True, False]
    result = evaluate_rewards(*five_pairs(), resamples=200)
    overall = result["breakdown"]["overall"]
    assert overall["accuracy"] == pytest.approx(0.4) and overall["count"] == 5
    assert overall["length_rule"] == pytest.approx(0.5)  # (1 + 0 + 0.5 + 0 + 1) / 5
    assert overall["model_minus_rule"] == pytest.approx(-0.1)
    assert overall["chosen_shorter_count"] == 2 and overall["chosen_shorter_accuracy"] == pytest.approx(0.5)
    valid1, valid2 = result["breakdown"]["split"]["valid1"], result["breakdown"]["split"]["valid2"]
    assert valid1["accuracy"] == pytest.approx(2 / 3) and valid1["length_rule"] == pytest.approx(0.5)
    assert valid1["chosen_shorter_count"] == 1 and valid1["chosen_shorter_accuracy"] == 1.0
    assert valid2["accuracy"] == 0.0 and valid2["length_rule"] == pytest.approx(0.5)
    assert valid2["chosen_shorter_count"] == 1 and valid2["chosen_shorter_accuracy"] == 0.0
    assert result["intervals"] == {"method": "percentile bootstrap over pairs", "confidence": 0.95,
                                   "resamples": 200, "seed": 0}


def test_breakdown_without_lengths_uses_characters():
    comparisons, chosen, rejected, _, _ = five_pairs()
    overall = rm.breakdown(comparisons, np.array(chosen) > np.array(rejected), resamples=200)["overall"]
    assert overall["length_rule"] == 1.0 and overall["chosen_shorter_count"] == 0
    assert overall["chosen_shorter_accuracy"] is None and overall["chosen_shorter_low"] is None


def random_hits(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.random(n) < 0.7).astype(float), (rng.random(n) < 0.6).astype(float), rng.random(n) < 0.4


def test_bootstrap_interval_contains_the_accuracy_is_seeded_and_narrows_with_more_pairs():
    small = rm.accuracy_with_baseline(*random_hits(50, 1), seed=3)
    for name, low, high in [
        ("accuracy", "low", "high"),
        ("length_rule", "length_rule_low", "length_rule_high"),
        ("model_minus_rule", "model_minus_rule_low", "model_minus_rule_high"),
        ("chosen_shorter_accuracy", "chosen_shorter_low", "chosen_shorter_high"),
    ]:
        assert small[low] <= small[name] <= small[high] and small[low] < small[high], name
    assert rm.accuracy_with_baseline(*random_hits(50, 1), seed=3) == small
    assert rm.accuracy_with_baseline(*random_hits(50, 1), seed=4)["low"] != small["low"]
    large = rm.accuracy_with_baseline(*random_hits(2000, 1), seed=3)
    assert large["high"] - large["low"] < (small["high"] - small["low"]) / 3  # width ~ 1/sqrt(n)
    assert large["model_minus_rule_high"] - large["model_minus_rule_low"] < (
        small["model_minus_rule_high"] - small["model_minus_rule_low"]
    ) / 3


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_bootstrap_interval_of_constant_hits_is_a_point(value):
    hits = np.full(20, value)
    stats = rm.accuracy_with_baseline(hits, np.full(20, 0.5), np.arange(20) < 5)
    assert (stats["low"], stats["accuracy"], stats["high"]) == (value, value, value)
    assert (stats["chosen_shorter_low"], stats["chosen_shorter_high"]) == (value, value)


def test_a_model_that_is_the_length_rule_differs_from_it_by_exactly_zero():
    chosen_len, rejected_len = np.arange(1, 41), np.arange(40, 0, -1)  # no tie: the rule scores 1 or 0
    rule = rm.length_rule_hits(chosen_len, rejected_len)
    stats = rm.accuracy_with_baseline(rule, rule, rm.chosen_shorter_mask(chosen_len, rejected_len))
    assert stats["accuracy"] == stats["length_rule"] == 0.5 and stats["low"] < stats["high"]
    difference = stats["model_minus_rule"], stats["model_minus_rule_low"], stats["model_minus_rule_high"]
    assert difference == (0, 0, 0)
    assert stats["chosen_shorter_count"] == 20 and stats["chosen_shorter_accuracy"] == 0.0


def test_headline_and_report_show_the_length_rule_and_the_intervals(tmp_path):
    from rlhfkit.config import RMConfig
    from rlhfkit.reward_eval.evaluate import write_rm_report

    result = evaluate_rewards(*five_pairs(), resamples=200)
    overall = result["breakdown"]["overall"]
    text = headline(result)
    assert f"accuracy 0.400 [{overall['low']:.3f}, {overall['high']:.3f}]" in text
    assert "| always-longer 0.500 |" in text
    low, high = overall["model_minus_rule_low"], overall["model_minus_rule_high"]
    assert f"model - longer -0.100 [{low:+.3f}, {high:+.3f}]" in text
    assert f"chosen-shorter pairs (2): 0.500 [{overall['chosen_shorter_low']:.3f}," in text
    assert "not distinguishable from always-longer" in text and "lengths in tokens" in text
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    cfg = RMConfig()
    notes = ["five pairs"]
    page = write_rm_report(tmp_path, "rm", cfg.model, cfg.total_batch_size, notes, result, tmp_path / "rm_eval")
    page = page.read_text()
    assert "always-longer" in page and "chosen-shorter accuracy" in page and "model - longer" in page
    # the caveat, from the numbers
    assert "reward model accuracy 0.400 is at or below always-prefer-longer (0.500)" in page
    assert f"0.667 [{result['breakdown']['split']['valid1']['low']:.3f}, 1.000]" in page


# --- calibration (Detail 18) ------------------------------------------------------------------


def test_calibrated_rewards_have_small_ece():
    rng = np.random.default_rng(0)
    abs_margin = np.abs(rng.normal(0, 2, 20000))
    # the human agrees with the RM's preferred response with exactly the RM's probability sigmoid(|m|)
    agrees = rng.random(20000) < 1 / (1 + np.exp(-abs_margin))
    margins = np.where(agrees, abs_margin, -abs_margin)
    result = cal.calibration(margins, np.zeros_like(margins), n_bins=10)
    assert result["ece"] < 0.05
    assert sum(b["count"] for b in result["bins"]) == 20000 and len(result["bins"]) == 10
    assert all(abs(b["count"] - 2000) <= 1 for b in result["bins"])  # equal-count bins


def test_overconfident_rewards_ece_by_hand():
    # bin [0, 1.5): 4 pairs at |m| = ln 3 -> confidence 0.75, 2 right -> accuracy 0.5 (gap 0.25)
    # bin [1.5, inf): 6 pairs at |m| = ln 9 -> confidence 0.9, 3 right -> accuracy 0.5 (gap 0.4)
    # ECE = 4/10 * 0.25 + 6/10 * 0.4 = 0.34
    low, high = math.log(3), math.log(9)
    margins = np.array([low, low, -low, -low, high, high, high, -high, -high, -high])
    result = cal.calibration(margins, np.zeros(10), boundaries=[1.5])
    first, second = result["bins"]
    assert (first["confidence"], first["accuracy"], first["count"]) == (pytest.approx(0.75), 0.5, 4)
    assert (second["confidence"], second["accuracy"], second["count"]) == (pytest.approx(0.9), 0.5, 6)
    assert second["margin_high"] is None
    assert result["ece"] == pytest.approx(0.34)


def test_calibration_counts_a_tie_as_a_coin_flip():
    result = cal.calibration([0.0, 0.0], [0.0, 0.0], boundaries=[1.0])
    assert result["bins"][0]["accuracy"] == 0.5 and result["ece"] == pytest.approx(0.0)


# --- length bias ------------------------------------------------------------------------------


def test_average_ranks_share_ties():
    assert cal.average_ranks([10, 20, 20, 30]).tolist() == [0.0, 1.5, 1.5, 3.0]
    assert cal.spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)  # monotone, not linear
    assert cal.pearson([1, 1, 1], [1, 2, 3]) is None


def test_length_correlation_sign_and_accuracy_by_length():
    rng = np.random.default_rng(1)
    chosen_len, rejected_len = rng.integers(5, 60, 200), rng.integers(5, 60, 200)
    rejected_len[:10] = chosen_len[:10]  # some equal-length pairs
    chosen_r, rejected_r = (
        0.1 * chosen_len + rng.normal(0, 0.1, 200),
        0.1 * rejected_len + rng.normal(0, 0.1, 200),
    )
    pays_for_length = cal.length_bias(chosen_r, rejected_r, chosen_len, rejected_len)
    assert pays_for_length["pearson"] > 0.9 and pays_for_length["spearman"] > 0.9
    assert pays_for_length["pairwise_spearman"] > 0.9
    assert pays_for_length["model_prefers_longer"] > 0.95
    by_length = pays_for_length["accuracy_by_length"]
    assert by_length["chosen longer"]["accuracy"] > 0.95 and by_length["chosen shorter"]["accuracy"] < 0.05
    assert sum(v["count"] for v in by_length.values()) == 200
    assert by_length["equal length"]["count"] == int((chosen_len == rejected_len).sum()) >= 10
    penalises_length = cal.length_bias(-chosen_r, -rejected_r, chosen_len, rejected_len)
    assert penalises_length["pearson"] < -0.9 and penalises_length["spearman"] < -0.9


def test_humans_prefer_longer_by_hand():
    result = cal.length_bias([1, 1, 1, 1], [0, 0, 0, 0], [10, 10, 10, 5], [5, 5, 10, 10])
    assert result["humans_prefer_longer"] == pytest.approx(2 / 3)  # 3 unequal pairs, chosen longer in 2
    assert result["model_prefers_longer"] == pytest.approx(2 / 3)  # the RM agrees with every human label


# --- confident errors -------------------------------------------------------------------------


def test_most_confident_errors_are_ordered_by_margin():
    comparisons = [pair(prompt_id=str(i), batch=f"batch{i}", confidence=i) for i in range(5)]
    chosen = [-3.0, 0.5, -0.1, -5.0, 0.0]
    errors = rm.most_confident_errors(comparisons, chosen, [0.0] * 5, k=10)
    assert [e["prompt_id"] for e in errors] == [
        "3",
        "0",
        "2",
        "4",
    ]  # the tie (margin 0) is last, the right pair absent
    assert [e["rank"] for e in errors] == [1, 2, 3, 4]
    top = errors[0]
    assert top["margin"] == -5.0 and top["chosen_reward"] == -5.0 and top["rejected_reward"] == 0.0
    assert top["model_confidence"] == pytest.approx(1 / (1 + math.exp(-5)))
    assert top["metadata"]["batch"] == "batch3" and top["metadata"]["confidence"] == 3
    assert "TITLE: Raise: car loan or savings?" in top["prompt"] and "POST: I got a raise." in top["prompt"]
    assert top["chosen"] == "a good summary" and top["rejected"] == "bad"
    assert [e["prompt_id"] for e in rm.most_confident_errors(comparisons, chosen, [0.0] * 5, k=2)] == [
        "3",
        "0",
    ]


def test_error_prompt_of_a_dialogue():
    dialogue = Comparison("d", "hh", {"dialogue": "\n\nHuman: hi\n\nAssistant:"}, "hello", "go away", "hh:1")
    assert rm.most_confident_errors([dialogue], [0.0], [1.0])[0]["prompt"] == "\n\nHuman: hi\n\nAssistant:"


# --- probes ---------------------------------------------------------------------------------------


def test_shipped_probes_load():
    probes = load_probes()
    assert probes and all(p.task == "tldr" and set(p.fields) == {"subreddit", "title", "post"} for p in probes)
    kinds = {ladder.kind for p in probes for ladder in p.ladders}
    assert kinds == {"quality", "length"}
    quality = next(ladder for ladder in probes[0].ladders if ladder.kind == "quality")
    assert len(quality.responses) == 5
    length = next(ladder for ladder in probes[0].ladders if ladder.kind == "length")
    words = [word_count(r.text) for r in length.responses]
    assert len(words) == 3 and words == sorted(words) and words[0] < words[-1]


VALID_PROBE = """
- name: p
  task: tldr
  fields: {subreddit: test, title: T, post: P}
  ladders:
    - name: q
      kind: quality
      responses:
        - {label: good, text: a fine summary}
        - {label: bad, text: nonsense words}
"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("kind: quality", "kind: qualty", r"probes\[0\]\.ladders\[0\]\.kind must be one of quality, length"),
        (
            "{label: bad, text: nonsense words}",
            "{label: bad}",
            r"probes\[0\]\.ladders\[0\]\.responses\[1\]\.text is missing",
        ),
        (
            "{label: bad, text: nonsense words}",
            "{label: bad, txt: x, text: y}",
            r"responses\[1\]\.txt is not a known field",
        ),
        (
            "{label: bad, text: nonsense words}",
            "{label: good, text: other}",
            r"probes\[0\]\.ladders\[0\]\.responses\[1\] repeats 'good'",
        ),
        ("post: P", "post: 3", r"probes\[0\]\.fields\.post must be a non-empty string"),
        ("task: tldr", "task: chess", r"probes\[0\]\.task must be one of"),
        ("  ladders:\n", "  ladderz:\n", r"probes\[0\]\.ladderz is not a known field"),
    ],
)
def test_probe_validation_names_the_file_and_field(tmp_path, old, new, message):
    assert old in VALID_PROBE
    path = tmp_path / "broken-probes.yaml"
    path.write_text(VALID_PROBE.replace(old, new, 1))
    with pytest.raises(ProbeFileError, match=message) as error:
        load_probes(path)
    assert str(path) in str(error.value)


def test_probe_file_that_is_not_a_list(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\n")
    with pytest.raises(ProbeFileError, match=r"p\.yaml: the top level \(probes\) must be a list"):
        load_probes(path)


def ladder_probe(tmp_path):
    text = (
        VALID_PROBE
        + """    - name: lengths
      kind: length
      responses:
        - {label: short, text: one two}
        - {label: medium, text: one two three four}
        - {label: long, text: one two three four five six}
"""
    )
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_probes(path)


def test_probe_table_and_checks(tmp_path):
    probes = ladder_probe(tmp_path)
    assert [(i["ladder"], i["label"]) for i in probe_items(probes)] == [
        ("q", "good"),
        ("q", "bad"),
        ("lengths", "short"),
        ("lengths", "medium"),
        ("lengths", "long"),
    ]
    rows = probe_table(probes, [2.0, -1.0, 1.0, 2.0, 3.0])
    assert rows[2] == {
        "probe": "p",
        "ladder": "lengths",
        "kind": "length",
        "position": 0,
        "label": "short",
        "words": 2,
        "chars": 7,
        "score": 1.0,
        "text": "one two",
    }
    quality, length = probe_checks(rows)
    assert quality["monotonic_decreasing"] and quality["spearman"] == pytest.approx(-1.0)
    assert length["slope_per_word"] == pytest.approx(0.5)  # scores 1, 2, 3 at 2, 4, 6 words
    assert length["change_across_ladder"] == pytest.approx(2.0) and "longer scores higher" in length["verdict"]
    broken = probe_checks(probe_table(probes, [-1.0, 2.0, 3.0, 2.0, 1.0]))
    assert not broken[0]["monotonic_decreasing"] and broken[0]["violations"] == ["bad"]
    assert broken[1]["slope_per_word"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="5 probe responses but 2 scores"):
        probe_table(probes, [1.0, 2.0])


def test_probe_markdown(tmp_path):
    probes = ladder_probe(tmp_path)
    rows = probe_table(probes, [2.0, -1.0, 1.0, 2.0, 3.0])
    rows[0]["text"] = "a | b"
    text = render_probe_table_markdown(rows)
    assert "### p" in text and "| # | label | words | score | response |" in text
    assert "| 1 | good | 3 | 2.00 | a \\| b |" in text
    assert "scores fall with quality" in text and "longer scores higher" in text


# --- writers and plots ----------------------------------------------------------------------------


def synthetic_eval(n=60):
    rng = np.random.default_rng(2)
    comparisons = [
        pair(
            chosen="x" * int(rng.integers(5, 50)),
            rejected="y" * int(rng.integers(5, 50)),
            prompt_id=str(i),
            split=f"valid{1 + i % 2}",
            batch=f"batch{6 + i % 3}",
            confidence=1 + i % 9,
        )
        for i in range(n)
    ]
    chosen, rejected = rng.normal(0.5, 1, n), rng.normal(0, 1, n)
    return comparisons, chosen, rejected


def test_write_rm_eval_writes_json_errors_and_pngs(tmp_path):
    comparisons, chosen, rejected = synthetic_eval()
    chosen_len, rejected_len = rm.char_lengths(comparisons)
    result = evaluate_rewards(comparisons, chosen, rejected, n_bins=5, k_errors=7)
    assert result["length_bias"]["unit"] == "characters"
    rows = probe_table(load_probes(), np.linspace(3, -3, len(probe_items(load_probes()))))
    files = write_rm_eval(tmp_path, result, chosen, rejected, chosen_len, rejected_len, probe_rows=rows)
    pngs = [
        "calibration.png",
        "length_bias.png",
        "accuracy_by_confidence.png",
        "accuracy_by_batch.png",
        "margin_histogram.png",
    ]
    for name in pngs:
        assert name in files and (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    saved = json.loads((tmp_path / "rm_eval.json").read_text())
    assert saved["accuracy"] == pytest.approx(rm.pairwise_accuracy(chosen, rejected))
    assert saved["breakdown"]["confidence"]["9"]["count"] == sum(c.confidence == 9 for c in comparisons)
    assert len(saved["calibration"]["bins"]) == 5 and "ece" in saved["calibration"]
    assert saved["confident_errors"] == {"file": "confident_errors.jsonl", "count": 7}
    lines = (tmp_path / "confident_errors.jsonl").read_text().splitlines()
    margins = [json.loads(line)["margin"] for line in lines]
    assert len(lines) == 7 and margins == sorted(margins) and margins[0] == pytest.approx(min(chosen - rejected))
    assert saved["probes"]["checks"] and (tmp_path / "probes.md").exists()
    assert "headline" not in saved and "pairs 60" in headline(result)


def test_write_rm_eval_skips_batch_plots_without_batches(tmp_path):
    comparisons = [
        Comparison(str(i), "hh", {"dialogue": "\n\nHuman: q\n\nAssistant:"}, "yes", "no", "hh") for i in range(6)
    ]
    chosen, rejected = np.arange(6.0), np.full(6, 2.5)
    files = write_rm_eval(tmp_path, evaluate_rewards(comparisons, chosen, rejected, n_bins=2), chosen, rejected)
    assert "accuracy_by_batch.png" not in files and "length_bias.png" not in files
    assert (tmp_path / "calibration.png").read_bytes()[:8] == PNG_MAGIC


def test_training_curves_skip_missing_keys(tmp_path):
    rows = [{"step": s, "train/loss": 0.7 - 0.01 * s, "train/accuracy": 0.5 + 0.01 * s} for s in range(10)]
    rows.append({"step": 10, "val/accuracy": 0.62, "train/loss": float("nan")})
    path = plot_training_curves(rows, tmp_path)
    assert path == tmp_path / "rm_training.png" and path.read_bytes()[:8] == PNG_MAGIC
    assert metric_series(rows, "train/loss")[0] == list(range(10))  # NaN row dropped
    assert plot_training_curves([{"step": 1, "lr": 1e-5}], tmp_path / "none") is None
