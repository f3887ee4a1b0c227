"""`rlhfkit judge-eval`: agreement with human labels, position bias, the length baseline."""

import json

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data.tldr import Comparison
from rlhfkit.eval import judge_eval
from rlhfkit.eval.judges import Verdict

from ..support.data import first_lines
from ..support.judge_server import ProtocolServer
from ..support.tiny import cli_args


def verdict(winner: str, swapped: bool) -> Verdict:
    shown = winner if not swapped or winner not in ("A", "B") else {"A": "B", "B": "A"}[winner]
    return Verdict(winner, shown, swapped, "")


def test_position_bias_and_agreement_hand_values():
    # pair 1: picks the chosen in both orders; pair 2: picks whatever is shown first; pair 3: unparseable once
    forward = [verdict("A", False), verdict("A", False), verdict("unparseable", True)]
    backward = [verdict("B", True), verdict("B", True), verdict("B", False)]  # (rejected, chosen): "B" = chosen
    orders = judge_eval.BothOrders(forward, backward)
    picks = orders.picks_chosen()
    assert picks[0].tolist()[:2] == [1.0, 1.0] and picks[1].tolist() == [1.0, 1.0, 1.0]
    bias = judge_eval.position_bias(orders)
    # shown winners: A, A, (unparseable), A, A, B -> 4 of 5 votes for the first position
    assert bias["first_position_share"] == pytest.approx(4 / 5) and bias["first_position_votes"] == 5
    assert bias["consistent_share"] == 1.0 and bias["pairs_decided_in_both_orders"] == 2


def test_length_preference_counts_votes_for_the_longer_response_hand_values():
    def pair(chosen: str, rejected: str) -> Comparison:
        return Comparison("p", "tldr", {"post": "x"}, chosen, rejected, "f:1")

    comparisons = [pair("a long summary", "short"), pair("short", "a long summary"), pair("same", "same")]
    # pair 1: chosen (longer) twice; pair 2: chosen (shorter) once, rejected (longer) once; pair 3: equal lengths, left
    # out
    forward = [verdict("A", False), verdict("A", False), verdict("A", False)]
    backward = [verdict("B", False), verdict("A", False), verdict("A", False)]
    result = judge_eval.length_preference(comparisons, judge_eval.BothOrders(forward, backward))
    assert result == {"judge_picks_longer": pytest.approx(3 / 4), "votes": 4, "humans_pick_longer": 0.5}


def test_longer_baseline_counts_equal_lengths_half_hand_values():
    def pair(chosen: str, rejected: str) -> Comparison:
        return Comparison("p", "tldr", {"post": "x"}, chosen, rejected, "f:1")

    comparisons = [pair("a long summary", "short"), pair("short", "a long summary"), pair("same", "same")]
    result = judge_eval.longer_baseline(comparisons)
    assert result["agreement"] == pytest.approx(1.5 / 3)  # equal lengths count half
    assert result["pairs"] == 3 and result["chosen_longer_share"] == pytest.approx(1 / 3)


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
    return first_lines(
        tmp_path_factory.mktemp("judge-eval") / "pairs.jsonl",
        40,
        "summarize-from-feedback-comparisons",
        "batch13.jsonl.gz",
    )


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judge-eval")
    srv = ProtocolServer("openai")
    yield srv
    srv.close()


def run_judge_eval(judge, data, out, **extra):
    args = {
        "judge": judge,
        "data": str(data),
        "out": str(out),
        "max_pairs": 12,
        "cache_dir": str(out / "cache"),
    } | extra
    assert cli_main(["judge-eval", *cli_args(args)]) == 0
    return json.loads((out / "judge_eval.json").read_text())


def test_a_judge_that_always_answers_a_shows_full_position_bias_and_chance_agreement(
    server, comparisons, tmp_path, capsys
):
    server.script = ["no_preferred"]
    server.reply = lambda prompt: "Preferred: A"
    result = run_judge_eval(f"openai:judge-model@{server.url}", comparisons, tmp_path / "run", timeout=5)
    assert result["pairs"] == 12 and result["verdicts"] == 24 and result["unparseable"] == 1
    assert result["position_bias"]["first_position_share"] == 1.0
    assert result["position_bias"]["consistent_share"] == 0.0  # it picked each response once
    # each pair is shown chosen-first in exactly one of its two orders, so it is picked exactly once
    assert result["agreement"]["votes"] == 23 and result["agreement"]["agreement"] in (
        pytest.approx(11 / 23),
        pytest.approx(12 / 23),
    )
    baseline = result["longer_baseline"]
    assert 0 <= baseline["agreement"] <= 1 and baseline["pairs"] == 12
    out = capsys.readouterr().out
    assert "always-prefer-longer" in out and "shown first 1.000" in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "verdicts.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {"chosen_first", "rejected_first"} <= set(rows[0])
    assert (tmp_path / "run" / "report.html").is_file()
    assert "sk-test-judge-eval" not in "".join(p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file())


def test_a_reward_model_judge_is_consistent_across_orders(tiny_model_dir, comparisons, tmp_path):
    import torch

    from rlhfkit.models import load_policy
    from rlhfkit.reward_models import ScalarModel

    policy, tok = load_policy(str(tiny_model_dir))
    torch.manual_seed(3)
    ScalarModel.from_policy(policy).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    result = run_judge_eval(f"rm:{tmp_path / 'rm'}", comparisons, tmp_path / "run", max_pairs=8)
    assert result["position_bias"]["consistent_share"] == 1.0  # a score does not depend on the order shown
    assert result["unparseable"] == 0 and result["agreement"]["votes"] == 16
    assert result["agreement"]["agreement"] == result["agreement_first_order_only"]["agreement"]
    assert set(result["breakdown"]) >= {"overall", "split", "confidence"}


def test_preference_data_is_judged_with_no_format_option(server, tmp_path, capsys):
    rows = [
        {"prompt": f"Which planet is number {i}?", "chosen": f" Planet {i}.", "rejected": " No idea."}
        for i in (1, 2, 3)
    ]
    data = tmp_path / "pref.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    server.reply = lambda prompt: "Preferred: A"
    result = run_judge_eval(f"openai:judge-model@{server.url}", data, tmp_path / "run", timeout=5)
    assert "data format: preference, explicit prompt, standard (detected from columns prompt, chosen, rejected)" in (
        capsys.readouterr().out
    )
    assert result["pairs"] == 3 and result["verdicts"] == 6
    assert all(any(row["prompt"] in prompt for prompt in server.prompts) for row in rows)


def test_judge_eval_needs_a_judge_and_data(capsys):
    assert cli_main(["judge-eval", "data=x.jsonl"]) == 2
    assert "judge=<spec>" in capsys.readouterr().err
