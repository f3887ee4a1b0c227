"""Judges: the real openai and anthropic SDK clients against local servers that speak each provider's
HTTP protocol (with scripted 429s, 500s, timeouts and malformed replies), the strict parser, the
A/B order, the verdict cache, key hygiene, and the reward-model and local chat-model judges."""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

import pytest
import torch

from rlhfkit.errors import ConfigError
from rlhfkit.eval.judges import ApiOptions, Pair, RetryPolicy, load_template, make_judge
from rlhfkit.eval.judges.api import retry_after_seconds
from rlhfkit.eval.judges.core import Shown, VerdictCache, is_swapped, parse_preference, show

from ..support.judge_server import JUDGE_TIMEOUT, ProtocolServer

OPENAI_KEY = "sk-LEAKCANARY-openai-7f3a9c0d1e2b"
ANTHROPIC_KEY = "sk-ant-LEAKCANARY-anthropic-5d8e2f1a"
QUICK_RETRY = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)
PROTOCOLS = ["openai", "anthropic"]


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


@pytest.fixture(params=PROTOCOLS)
def server(request, keys):
    srv = ProtocolServer(request.param)
    yield srv
    srv.close()


def api_judge(server: ProtocolServer, cache: Path | None, seed: int = 0, **options):
    settings = {"concurrency": 1, "timeout": JUDGE_TIMEOUT, "retry": QUICK_RETRY} | options
    return make_judge(f"{server.protocol}:judge-model", cache_dir=cache, seed=seed, options=ApiOptions(**settings),
                      base_url=server.url)


def make_pairs(n: int) -> list[Pair]:
    """Pairs whose good summary alternates between A and B."""
    pairs = []
    for i in range(n):
        good, bad = f"good summary {i}", f"bad summary {i}"
        pairs.append(
            Pair(
                f"SUBREDDIT: r/test\n\nTITLE: post {i}\n\nPOST: text {i}\n\nTL;DR:",
                *((good, bad) if i % 2 == 0 else (bad, good)),
            )
        )
    return pairs


def expected_winners(pairs: list[Pair]) -> list[str]:
    return ["A" if p.response_a.startswith("good") else "B" for p in pairs]


# ---------------------------------------------------------------- parsing, order, template, specs


@pytest.mark.parametrize(
    "reply, expected",
    [
        ('Comparison: A covers more.\nPreferred: "A"', "A"),
        ("Comparison: B is tighter.\nPreferred: B", "B"),
        ("Preferred: b  ", "B"),
        ('Preferred: "a"\r\n', "A"),
        ("Preferred: A\nPreferred: A", "A"),
        ("Preferred: A\nPreferred: B", "unparseable"),  # two different letters is no answer
        ('Preferred: "A', "unparseable"),  # unbalanced quotes
        ("Preferred: A.", "unparseable"),
        ("**Preferred:** A", "unparseable"),
        ("preferred: A", "unparseable"),
        ("Preferred: Summary A", "unparseable"),
        ("Preferred: tie", "unparseable"),
        ("I prefer A.", "unparseable"),
        ("", "unparseable"),
    ],
)
def test_only_the_appendix_i_preferred_line_parses(reply, expected):
    assert parse_preference(reply) == expected


def test_swap_is_a_deterministic_balanced_function_of_seed_and_index():
    first = [is_swapped(0, i) for i in range(2000)]
    assert first == [is_swapped(0, i) for i in range(2000)]
    assert 0.45 < sum(first) / len(first) < 0.55
    assert first != [is_swapped(1, i) for i in range(2000)]


def test_default_template_is_the_paper_appendix_i_prompt_rendered_in_one_pass():
    template = load_template()
    assert template.text.startswith(
        "Which of the following summaries does a better job of summarizing the most important"
    )
    assert 'Comparison: <one-sentence comparison and explanation>\nPreferred: <"A" or "B">' in template.text
    assert "\\" not in template.text  # the paper's Python line continuations are joined
    assert template.sha256 == hashlib.sha256(template.text.encode()).hexdigest()
    rendered = template.render(Shown("a post about {response_b}", "first one", "second one", swapped=False))
    assert "Post:\na post about {response_b}\n\nSummary A:\nfirst one\n\nSummary B:\nsecond one\n" in rendered


def test_custom_template_file_is_used_and_checked(tmp_path):
    path = tmp_path / "judge.txt"
    path.write_text("Q: {prompt}\n1: {response_a}\n2: {response_b}\nPreferred: A or B?")
    template = load_template(path)
    assert template.source == str(path) and template.sha256 != load_template().sha256
    path.write_text("Q: {prompt}\n1: {response_a}")
    with pytest.raises(ConfigError, match=r"lacks \{response_b\}"):
        load_template(path)
    with pytest.raises(ConfigError, match="not found"):
        load_template(tmp_path / "missing.txt")


@pytest.mark.parametrize("spec", ["gpt-4o", "foo:bar", "openai:", "hf:", "openai:m@ftp://host", "OpenAI:gpt-4o"])
def test_bad_specs_name_the_accepted_forms(spec, keys):
    with pytest.raises(ConfigError) as info:
        make_judge(spec)
    assert "\n" not in str(info.value) and ("openai:<model>" in str(info.value) or "http://" in str(info.value))


def test_missing_sdk_names_the_install_command(keys, monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)  # makes `import anthropic` fail
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[anthropic\]"'):
        make_judge("anthropic:claude-x")


def test_missing_keys_name_the_variable_but_self_hosted_servers_need_none(monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
        make_judge("openai:gpt-4o-mini")
    with pytest.raises(ConfigError, match="set ANTHROPIC_API_KEY"):
        make_judge("anthropic:claude-x")
    local = make_judge("openai:llama@http://127.0.0.1:8000/v1")
    assert local.spec == "openai:llama@http://127.0.0.1:8000/v1"


def test_retry_policy_backs_off_exponentially_with_jitter_and_honours_retry_after():
    import random

    policy, rng = RetryPolicy(base_delay=1.0, max_delay=10.0), random.Random(0)
    for attempt, (low, high) in {1: (0.5, 1.0), 3: (2.0, 4.0), 6: (5.0, 10.0)}.items():
        assert all(low <= policy.delay(attempt, None, rng) <= high for _ in range(50))
    assert policy.delay(1, 0.0, rng) == 0.0
    assert policy.delay(1, 3.5, rng) == 3.5
    assert policy.delay(1, 1e6, rng) == 10.0
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < retry_after_seconds({"retry-after": future}) <= 31
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


# ---------------------------------------------------------------- API judges against the local servers


def test_requests_carry_model_tokens_and_greedy_temperature_where_the_provider_allows(server):
    api_judge(server, None, max_tokens=77).judge(make_pairs(1))
    api_judge(server, None, temperature=0.3).judge(make_pairs(1))
    default, explicit = server.bodies
    assert default["model"] == "judge-model" and default["max_tokens"] == 77
    assert default.get("temperature") == (0.0 if server.protocol == "openai" else None)
    assert explicit["temperature"] == 0.3
    record = api_judge(server, None, seed=4).describe()
    assert record["template_sha256"] == load_template().sha256 and record["swap_seed"] == 4
    assert record["template"] == "builtin:tldr-appendix-i.txt" and record["judge"].startswith(server.protocol)
    shown = show(make_pairs(1)[0], is_swapped(0, 0))
    assert default["messages"] == [{"role": "user", "content": load_template().render(shown)}]


def test_429_500_timeout_and_bad_json_are_retried_until_the_reply_counts(server, tmp_path):
    server.script = ["429", "500", "slow", "bad_json"]
    pairs = make_pairs(4)
    judge = api_judge(server, tmp_path / "cache", input_price=2.0, output_price=8.0)
    verdicts = judge.judge(pairs)
    assert [v.winner for v in verdicts] == expected_winners(pairs)
    assert all(v.is_vote and not v.error and not v.cached for v in verdicts)
    stats = judge.stats
    assert (stats.calls, stats.retries, stats.failures, stats.unparseable) == (8, 4, 0, 0)
    assert len(server.prompts) == 8
    assert (stats.input_tokens, stats.output_tokens) == (400, 40)  # failed attempts report no usage
    assert stats.cost == pytest.approx(4 * (100 * 2.0 + 10 * 8.0) / 1e6)


def test_retry_after_header_sets_the_wait(server, tmp_path):
    server.script, server.retry_after = ["429"], "0.4"
    judge = api_judge(server, None, retry=RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=5.0))
    start = time.monotonic()
    assert judge.judge(make_pairs(1))[0].winner == "A"
    assert time.monotonic() - start >= 0.4


def test_unparseable_reply_is_counted_cached_and_never_a_vote(server, tmp_path):
    server.script = ["no_preferred"]
    pairs = make_pairs(3)
    judge = api_judge(server, tmp_path / "cache")
    verdicts = judge.judge(pairs)
    assert verdicts[0].winner == "unparseable" and not verdicts[0].is_vote
    assert verdicts[0].raw == "Both summaries are fine." and not verdicts[0].error
    assert [v.winner for v in verdicts[1:]] == expected_winners(pairs)[1:]
    assert judge.stats.unparseable == 1 and judge.stats.retries == 0
    again = api_judge(server, tmp_path / "cache")
    assert again.judge(pairs)[0].winner == "unparseable" and len(server.prompts) == 3  # paid for once


def test_exhausted_retries_leave_an_uncached_failure_not_a_vote(server, tmp_path):
    server.script = ["500", "500"]
    judge = api_judge(server, tmp_path / "cache", retry=RetryPolicy(max_attempts=2, base_delay=0.001))
    verdict = judge.judge(make_pairs(1))[0]
    assert verdict.winner == "unparseable" and not verdict.is_vote
    assert verdict.error == "HTTP 500 (gave up after 2 attempts)"
    assert (judge.stats.failures, judge.stats.unparseable, judge.stats.calls) == (1, 0, 2)
    retried = api_judge(server, tmp_path / "cache").judge(make_pairs(1))[0]  # not cached: asked again
    assert retried.winner == "A" and not retried.cached and len(server.prompts) == 3


def test_second_run_is_served_from_the_cache_without_any_http_call(server, tmp_path):
    pairs = make_pairs(6)
    first = api_judge(server, tmp_path / "cache").judge(pairs)
    assert len(server.prompts) == 6
    judge = api_judge(server, tmp_path / "cache")
    second = judge.judge(pairs)
    assert len(server.prompts) == 6
    assert all(v.cached for v in second) and [v.winner for v in second] == [v.winner for v in first]
    assert (judge.stats.cache_hits, judge.stats.calls, judge.stats.input_tokens) == (6, 0, 0)
    # another seed shows some pairs the other way round: only those are new keys
    reordered = sum(is_swapped(0, i) != is_swapped(1, i) for i in range(6))
    assert 0 < reordered < 6
    api_judge(server, tmp_path / "cache", seed=1).judge(pairs)
    assert len(server.prompts) == 6 + reordered


def test_a_pair_repeated_in_one_call_is_asked_once(server):
    pairs = make_pairs(2)
    seed = next(s for s in range(100) if is_swapped(s, 0) == is_swapped(s, 2))  # so both copies show alike
    verdicts = api_judge(server, None, seed=seed, concurrency=2).judge([pairs[0], pairs[1], pairs[0]])
    assert [v.winner for v in verdicts] == ["A", "B", "A"] and len(server.prompts) == 2


def test_cache_survives_a_truncated_last_line(server, tmp_path):
    pairs = make_pairs(4)
    api_judge(server, tmp_path / "cache").judge(pairs[:2])
    path = tmp_path / "cache" / VerdictCache.FILE
    with path.open("a") as f:
        f.write('{"key": "0123", "judge": "openai:judge-mo')  # a write cut short by a kill
    judge = api_judge(server, tmp_path / "cache")
    verdicts = judge.judge(pairs)
    assert [v.cached for v in verdicts] == [True, True, False, False]
    lines = path.read_text().splitlines()
    assert len(lines) == 5
    assert sum(1 for line in lines if line.startswith('{"key": "0123"')) == 1
    assert all(json.loads(line)["key"] for line in lines if not line.startswith('{"key": "0123"'))
    assert len(VerdictCache(tmp_path / "cache").records) == 4


def test_cache_lines_keep_any_unicode_and_skip_foreign_records(tmp_path):
    cache = VerdictCache(tmp_path)
    reply = "line\u2028separator\x85next\nPreferred: A"
    cache.put("k1", {"shown_winner": "A", "reply": reply, "input_tokens": 1, "output_tokens": 2})
    with cache.path.open("a") as f:
        f.write('["not", "a", "record"]\n{"key": "k2"}\n')
    assert VerdictCache(tmp_path).records == {"k1": cache.records["k1"]}
    assert VerdictCache(tmp_path).get("k1")["reply"] == reply


def test_swapped_pairs_are_shown_reversed_and_mapped_back(server, tmp_path):
    pairs = make_pairs(8)
    verdicts = api_judge(server, None, seed=3).judge(pairs)
    swaps = [v.swapped for v in verdicts]
    assert swaps == [is_swapped(3, i) for i in range(8)] and 0 < sum(swaps) < 8
    for pair, verdict, prompt in zip(pairs, verdicts, server.prompts, strict=True):  # concurrency 1: in order
        shown_first = pair.response_b if verdict.swapped else pair.response_a
        assert f"Summary A:\n{shown_first}\n" in prompt
        assert verdict.shown_winner == ("A" if shown_first.startswith("good") else "B")
    assert [v.winner for v in verdicts] == expected_winners(pairs)


def test_concurrency_limit_holds_and_is_used(server, tmp_path):
    server.delay = 0.2
    judge = api_judge(server, None, concurrency=3)
    verdicts = judge.judge(make_pairs(9))
    assert [v.winner for v in verdicts] == expected_winners(make_pairs(9))
    assert server.max_active == 3


def test_refused_key_stops_with_one_line_naming_the_variable(server, tmp_path):
    server.script = ["401"]
    with pytest.raises(ConfigError) as info:
        api_judge(server, tmp_path / "cache").judge(make_pairs(1))
    message = str(info.value)
    variable = "OPENAI_API_KEY" if server.protocol == "openai" else "ANTHROPIC_API_KEY"
    assert "HTTP 401" in message and variable in message and "\n" not in message
    assert OPENAI_KEY not in message and ANTHROPIC_KEY not in message and "[redacted]" in message


def test_api_keys_never_reach_logs_output_errors_or_files(keys, tmp_path, caplog, capfd):
    caplog.set_level(logging.DEBUG)  # the SDKs' and httpx's debug logs included
    written, messages = tmp_path / "run", []
    for protocol in PROTOCOLS:
        server = ProtocolServer(protocol)
        try:
            server.script = ["429", "500", "bad_json", "slow", "echo_key", "no_preferred"]
            judge = api_judge(server, written / "cache", concurrency=2)
            verdicts = judge.judge(make_pairs(4))
            (written / f"{protocol}-verdicts.json").write_text(json.dumps([vars(v) for v in verdicts]))
            (written / f"{protocol}-judge.json").write_text(json.dumps(judge.describe() | judge.stats.as_dict()))
            server.script = ["401"]
            with pytest.raises(ConfigError) as info:
                api_judge(server, written / "cache").judge(make_pairs(5)[4:])
            messages.append(str(info.value))
            assert server.keys_seen == {OPENAI_KEY if protocol == "openai" else ANTHROPIC_KEY}  # the key was used
        finally:
            server.close()
    out, err = capfd.readouterr()
    texts = [caplog.text, out, err, *messages] + [p.read_text() for p in written.rglob("*") if p.is_file()]
    assert "retry 1 of 5" in caplog.text and "[redacted]" in "".join(texts)  # something was logged and echoed
    for text in texts:
        assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text


# ---------------------------------------------------------------- local judges


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    from rlhfkit.models import load_policy
    from rlhfkit.reward_models import ScalarModel

    policy, tokenizer = load_policy(str(tiny_model_dir))
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("judge-rm") / "rm"
    ScalarModel.from_policy(policy).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_reward_model_judge_picks_the_higher_reward_and_ties_equal_ones(reward_model_dir, tmp_path):
    from rlhfkit.data.formats import encode_completion, encode_text
    from rlhfkit.reward_models import load_reward_model
    from rlhfkit.scoring import score_texts

    prompt = "SUBREDDIT: r/test\n\nTITLE: a title\n\nPOST: my landlord kept the deposit.\n\nTL;DR:"
    responses = ["landlord kept my deposit", "I like turtles", "deposit gone, what now?", "kept deposit"]
    pairs = [Pair(prompt, a, b) for a, b in zip(responses, responses[1:] + responses[:1], strict=True)]
    pairs.append(Pair(prompt, "the same text", "the same text"))
    model, tokenizer = load_reward_model(reward_model_dir)
    scores = score_texts(
        model,
        tokenizer.pad_token_id,
        [encode_text(tokenizer, prompt)] * len(responses),
        [encode_completion(tokenizer, r) for r in responses],
        8,
        "test",
    )
    reward = dict(zip(responses, scores.tolist(), strict=True))
    expected = ["A" if reward[p.response_a] > reward[p.response_b] else "B" for p in pairs[:-1]] + ["tie"]

    judge = make_judge(f"rm:{reward_model_dir}", cache_dir=tmp_path / "cache")
    verdicts = judge.judge(pairs)
    assert [v.winner for v in verdicts] == expected
    for pair, verdict in zip(pairs[:-1], verdicts, strict=False):  # the raw reply holds the scores as shown
        shown = json.loads(verdict.raw)
        first, second = (pair.response_b, pair.response_a) if verdict.swapped else (pair.response_a, pair.response_b)
        assert shown["A"] == pytest.approx(reward[first], abs=1e-4) and shown["B"] == pytest.approx(
            reward[second], abs=1e-4
        )
    reseeded = make_judge(f"rm:{reward_model_dir}", seed=5).judge(pairs)  # scores do not depend on position
    assert [v.winner for v in reseeded] == expected
    with pytest.raises(ConfigError, match="no template"):
        make_judge(f"rm:{reward_model_dir}", template=load_template().source)


def test_local_chat_judge_gibberish_is_unparseable_not_a_vote(tiny_model_dir, tmp_path):
    pairs = make_pairs(3)
    judge = make_judge(f"hf:{tiny_model_dir}", cache_dir=tmp_path / "cache", max_new_tokens=6, batch_size=2)
    verdicts = judge.judge(pairs)
    assert all(v.winner == "unparseable" and not v.is_vote and not v.error for v in verdicts)
    assert (judge.stats.calls, judge.stats.unparseable, judge.stats.failures) == (3, 3, 0)
    assert judge.stats.input_tokens > 3 * 100 and 0 < judge.stats.output_tokens <= 3 * 6
    again = make_judge(f"hf:{tiny_model_dir}", cache_dir=tmp_path / "cache", max_new_tokens=6)
    assert all(v.cached for v in again.judge(pairs)) and again.stats.calls == 0
    assert [v.raw for v in again.judge(pairs)] == [v.raw for v in verdicts]


def choice_logprobs_alone(judge, shown) -> tuple[float, float]:
    """logprobs of " A" and " B" after `Preferred:` for one pair as shown, unpadded, in a batch of one."""
    ids = (
        judge.query_ids(judge.template.render(shown))
        + judge.tokenizer("Preferred:", add_special_tokens=False)["input_ids"]
    )
    with torch.no_grad():
        logps = judge.model(input_ids=torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
    a_id, b_id = judge.choice_ids
    return float(logps[a_id]), float(logps[b_id])


def test_choice_probability_judge_votes_by_the_letter_margin_averaged_over_both_orders(tiny_model_dir, tmp_path):
    pairs = make_pairs(4) + [Pair("SUBREDDIT: r/x\n\nPOST: a much longer post " * 5 + "\n\nTL;DR:", "one", "two words")]
    judge = make_judge(f"hf-logprob:{tiny_model_dir}", cache_dir=tmp_path / "cache", batch_size=3)
    verdicts = judge.judge(pairs)  # batches of 3 prompts of different lengths: left padding is exercised
    assert all(v.is_vote for v in verdicts) and judge.stats.unparseable == 0 and judge.stats.output_tokens == 0
    assert judge.stats.calls == 2 * len(pairs)  # each pair read in both orders
    for pair, verdict in zip(pairs, verdicts, strict=True):
        a, b = choice_logprobs_alone(judge, show(pair, verdict.swapped))
        a_mirrored, b_mirrored = choice_logprobs_alone(judge, show(pair, not verdict.swapped))
        margin = ((a - b) + (b_mirrored - a_mirrored)) / 2  # for the response shown first
        recorded = json.loads(verdict.raw.split(" ", 2)[2])
        assert recorded["shown"]["A"] == pytest.approx(a, abs=1e-4) and recorded["mirrored"]["B"] == pytest.approx(
            b_mirrored, abs=1e-4
        )
        assert recorded["margin_first"] == pytest.approx(margin, abs=1e-4)
        shown_winner = "A" if margin > 0 else "B"
        assert verdict.shown_winner == shown_winner
        assert verdict.winner == (shown_winner if not verdict.swapped else {"A": "B", "B": "A"}[shown_winner])
    # the order shown no longer decides anything: the same pairs shown the other way get the same winners
    flipped = make_judge(f"hf-logprob:{tiny_model_dir}", seed=1, batch_size=3)
    assert any(is_swapped(0, i) != is_swapped(1, i) for i in range(len(pairs)))
    assert [v.winner for v in flipped.judge(pairs)] == [v.winner for v in verdicts]
    # and the cache already holds the other order: judging the pairs swapped asks for nothing
    swapped_pairs = [Pair(p.prompt, p.response_b, p.response_a) for p in pairs]
    mirrored = make_judge(f"hf-logprob:{tiny_model_dir}", cache_dir=tmp_path / "cache")
    assert [v.winner for v in mirrored.judge(swapped_pairs)] == [{"A": "B", "B": "A"}[v.winner] for v in verdicts]
    assert mirrored.stats.calls == 0
    again = make_judge(f"hf-logprob:{tiny_model_dir}", cache_dir=tmp_path / "cache")
    assert [v.winner for v in again.judge(pairs)] == [v.winner for v in verdicts] and again.stats.calls == 0
    assert judge.identity != make_judge(f"hf:{tiny_model_dir}").identity  # hf: replies never answer from this cache
