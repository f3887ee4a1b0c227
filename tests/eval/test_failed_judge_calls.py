"""A judge call that fails is not an answer: a refused connection is not retried, a malformed body is tried
twice, and `judge-eval` and `eval` count failed calls apart from unparseable replies, or stop in one line,
writing nothing, when no verdict came back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.eval.judges import ApiOptions, Pair, RetryPolicy, make_judge

from ..support.data import first_lines
from ..support.judge_server import ProtocolServer
from ..support.mistakes import refusal_line
from ..support.processes import free_port
from ..support.tiny import cli_args

KEY = "sk-proj-REVIEWCANARY-1234567890abcdef"


QUICK_RETRY = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
    """12 TL;DR comparisons, each of a different post (the file repeats some pairs, whose verdicts a judge shares)."""
    path = first_lines(tmp_path_factory.mktemp("judged") / "pairs.jsonl", 60, "summarize-from-feedback-comparisons",
                       "batch13.jsonl.gz")
    by_post = {json.loads(line)["info"]["id"]: line for line in path.read_text().splitlines()}
    path.write_text("".join(line + "\n" for line in list(by_post.values())[:12]))
    return path


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    srv = ProtocolServer("openai")
    yield srv
    srv.close()


def samples_file(path: Path, n: int = 3) -> Path:
    """Samples as `rlhfkit generate` writes them, for `rlhfkit eval`."""
    rows = [{"prompt_id": str(i), "query": f"SUBREDDIT: r/test\n\nTITLE: t{i}\n\nPOST: post {i}\n\nTL;DR:",
             "reference": f"good reference {i}", "text": f"summary {i}", "has_eos": True} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_refused_connection_is_not_retried_and_counts_as_a_failure_not_an_answer(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    judge = make_judge("openai:judge-model", base_url=f"http://127.0.0.1:{free_port()}/v1", cache_dir=None, seed=0,
                       options=ApiOptions(retry=QUICK_RETRY))
    verdicts = judge.judge([Pair("post", "a", "b")] * 1 + [Pair("post 2", "c", "d")])
    assert all(v.error and "Connection refused" in v.error and "not retried" in v.error for v in verdicts)
    assert (judge.stats.calls, judge.stats.retries, judge.stats.failures, judge.stats.unparseable) == (2, 0, 2, 0)
    with pytest.raises(
        Exception, match="no verdict was received: all 2 pairs asked got no reply; the first: connection failed"
    ):
        judge.require_a_verdict()


def test_a_malformed_body_is_tried_twice_while_timeouts_and_server_errors_keep_their_retries(server):
    server.script = ["bad_json", "bad_json", "500", "500", "slow", "500"]
    judge = make_judge(
        "openai:judge-model",
        base_url=server.url,
        cache_dir=None,
        seed=0,
        options=ApiOptions(concurrency=1, timeout=0.5, retry=QUICK_RETRY),
    )
    first, second = judge.judge([Pair("post", "good", "bad"), Pair("post 2", "good", "bad")])
    assert first.error == "reply body is not valid JSON (gave up after 2 attempts)"
    assert second.is_vote and not second.error  # 500, 500, a timeout and 500 were retried until it answered
    assert (judge.stats.failures, judge.stats.received, judge.stats.retries) == (1, 1, 5)
    judge.require_a_verdict()  # one verdict came back: the run goes on


@pytest.mark.parametrize("command", ["judge-eval", "eval"])
def test_a_judge_that_cannot_be_reached_stops_the_command_in_one_line_and_writes_nothing(
    command, comparisons, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    judge = f"openai:gpt-4o@http://127.0.0.1:{free_port()}/v1"
    data = (
        {"data": str(comparisons), "max_pairs": 3}
        if command == "judge-eval"
        else {"samples": f"p={samples_file(tmp_path / 'p.jsonl')}"}
    )
    args = {"judge": judge, "out": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache")} | data
    assert cli_main([command, *cli_args(args)]) == 2
    line = refusal_line(capsys.readouterr().err)
    assert f"judge {judge}: no verdict was received" in line and "Connection refused" in line and "not retried" in line
    assert KEY not in line
    assert not (tmp_path / "out").exists()


def test_judge_eval_counts_failed_calls_apart_from_unparseable_replies(server, comparisons, tmp_path, capsys):
    server.script = ["bad_json", "bad_json", "no_preferred"]  # the first pair gets no reply, the next an unusable one
    out = tmp_path / "run"
    args = {
        "judge": f"openai:judge-model@{server.url}",
        "data": str(comparisons),
        "out": str(out),
        "max_pairs": 3,
        "concurrency": 1,
        "cache_dir": str(tmp_path / "cache"),
    }
    assert cli_main(["judge-eval", *cli_args(args)]) == 0
    captured = capsys.readouterr()
    assert "unparseable 1 of 6 verdicts, failed calls 1, ties 0" in captured.out
    assert "rlhfkit: warning: judge" in captured.err and "1 pairs got no reply" in captured.err
    result = json.loads((out / "judge_eval.json").read_text())
    assert (result["unparseable"], result["failed"], result["verdicts"]) == (1, 1, 6)
    assert (result["stats"]["failures"], result["stats"]["unparseable"]) == (1, 1)
    assert "failed calls (no reply)" in (out / "report.html").read_text()


def test_eval_counts_failed_calls_apart_from_unparseable_replies(server, tmp_path, capsys):
    server.script = ["bad_json", "bad_json", "no_preferred"]
    out = tmp_path / "run"
    args = {
        "judge": f"openai:judge-model@{server.url}",
        "samples": f"p={samples_file(tmp_path / 'p.jsonl')}",
        "out": str(out),
        "concurrency": 1,
        "cache_dir": str(tmp_path / "cache"),
    }
    assert cli_main(["eval", *cli_args(args)]) == 0
    assert "unparseable 1, failed calls 1" in capsys.readouterr().out
    rate = json.loads((out / "eval.json").read_text())["policies"]["p"]["win_rate"]
    assert (rate["unparseable"], rate["failed"], rate["wins"] + rate["losses"] + rate["ties"]) == (1, 1, 1)
    assert "failed calls (no reply)" in (out / "report.html").read_text()
