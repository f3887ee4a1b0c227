"""Review 2026-11 (bad inputs), the commands' cases: judges that never answer (14), `plan` on a broken
config.json (20), `data analyze` on generic formats and its help (23), options refused up front (25),
`reinforce sharding=fsdp2` (26) and output files that are not overwritten (27). Each bad input ends in
one `rlhfkit: error:` line naming what to fix, exit 2, no traceback, and nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.eval.judges import ApiOptions, Pair, RetryPolicy, make_judge

from .support.data import first_lines
from .support.judge_server import ProtocolServer
from .support.processes import free_port
from .support.tiny import cli_args

KEY = "sk-proj-REVIEWCANARY-1234567890abcdef"
QUICK_RETRY = RetryPolicy(max_attempts=6, base_delay=0.01, max_delay=0.05)


def one_error_line(capsys) -> str:
    """The stderr of a refused command: exactly one `rlhfkit: error:` line and no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlhfkit: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def comparisons(tmp_path_factory):
    """12 TL;DR comparisons, each of a different post (the file repeats some pairs, whose verdicts a judge shares)."""
    path = first_lines(tmp_path_factory.mktemp("review") / "pairs.jsonl", 60, "summarize-from-feedback-comparisons",
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


# ---------------------------------------------------------------- case 14: failed calls are not answers


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
    line = one_error_line(capsys)
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


# ---------------------------------------------------------------- case 20: plan on a broken config.json

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            {
                "hidden_size": 0,
                "intermediate_size": 0,
                "num_hidden_layers": 0,
                "num_attention_heads": 0,
                "vocab_size": 0,
            },
            "hidden_size=0 must be a whole number above 0",
        ),
        ({"hidden_size": -64}, "hidden_size=-64 must be a whole number above 0"),
        ({"num_attention_heads": 2.5}, "num_attention_heads=2.5 must be a whole number above 0"),
        ({"num_key_value_heads": 0}, "num_key_value_heads=0 must be a whole number above 0"),
        ({"vocab_size": None}, "has no vocab_size"),
        ({"model_type": "nonsense"}, "model_type='nonsense' is not a transformers model type"),
    ],
)
def test_plan_refuses_a_config_json_with_a_bad_size_naming_the_file_and_the_field(change, fragment, tmp_path, capsys):
    values = {k: v for k, v in (LLAMA | change).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(values))
    for model, where in (
        (tmp_path / "config.json", f"model={tmp_path / 'config.json'}"),
        (tmp_path, f"model={tmp_path} (its config.json)"),
    ):
        assert cli_main(["plan", f"model={model}", "stage=sft"]) == 2
        line = one_error_line(capsys)
        assert where in line and fragment in line, line


def test_plan_reads_the_sizes_under_an_architectures_own_names(tmp_path):
    from transformers import GPT2Config

    from rlhfkit.model_shape import read_shape

    GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100).save_pretrained(tmp_path)
    assert read_shape(str(tmp_path)).hidden == 64
    (tmp_path / "config.json").write_text(
        json.dumps(json.loads((tmp_path / "config.json").read_text()) | {"n_embd": 0})
    )
    with pytest.raises(Exception, match="n_embd=0 must be a whole number above 0"):
        read_shape(str(tmp_path))


# ---------------------------------------------------------------- case 27: an output is never overwritten silently

# (command and its options besides out=, what out= must be): each refused before any model or data is read
WRITERS = [
    (["generate", "model=policy-never-loaded", "data=posts-never-read"], "file"),
    (["rm-eval", "model=rm-never-loaded", "data=pairs-never-read"], "folder"),
    (["judge-eval", "judge=rm:never-loaded", "data=pairs-never-read"], "folder"),
    (["eval", "samples=p=never-read.jsonl"], "folder"),
    (["data", "analyze", "--path", "never-read.jsonl"], "folder"),
]


@pytest.mark.parametrize("argv, kind", WRITERS, ids=[" ".join(a[:2]) for a, _ in WRITERS])
def test_an_output_that_exists_is_refused_in_one_line_and_kept(argv, kind, tmp_path, capsys):
    existing = tmp_path / "samples.jsonl" if kind == "file" else tmp_path / "results"
    kept = existing if kind == "file" else existing / "notes.txt"
    kept.parent.mkdir(exist_ok=True)
    kept.write_text('{"precious": 1}\n')
    assert cli_main([*argv, f"out={existing}"]) == 2
    line = one_error_line(capsys)
    assert f"out={existing} already" in line and "overwrite=true" in line, line
    assert kept.read_text() == '{"precious": 1}\n'
    wrong = tmp_path / ("a-folder" if kind == "file" else "a-file")
    wrong.mkdir() if kind == "file" else wrong.write_text("x")
    assert cli_main([*argv, f"out={wrong}"]) == 2
    assert f"out={wrong} is a {'folder' if kind == 'file' else 'file'}" in one_error_line(capsys)


def test_generate_overwrite_true_replaces_the_file(ppo_dirs, tmp_path):
    out = tmp_path / "samples.jsonl"
    out.write_text('{"precious": 1}\n')
    args = [
        f"model={ppo_dirs['policy']}",
        f"data={ppo_dirs['posts']}",
        "validation_posts=4",
        "num_samples=2",
        "max_new_tokens=3",
        "max_query_length=128",
        f"out={out}",
        "overwrite=true",
    ]
    assert cli_main(["generate", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all("prompt_id" in row and "precious" not in row for row in rows)


# ---------------------------------------------------------------- case 25: options refused up front, naming themselves


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
    assert f"validation_fraction={float(value)} is out of range; it must be >= 0 and below 1" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def pipeline_eval_args(ppo_dirs, out: Path, **extra) -> list[str]:
    return cli_args(
        {
            "model": ppo_dirs["policy"],
            "sft_data": ppo_dirs["posts"],
            "comparisons": ppo_dirs["pairs"],
            "stages": "eval",
            "judge": "",
            "output_dir": out,
        }
        | extra
    )


def test_pipeline_eval_alone_names_the_stage_and_the_options_that_choose_its_posts(ppo_dirs, tmp_path, capsys):
    assert cli_main(["pipeline", *pipeline_eval_args(ppo_dirs, tmp_path / "q", sft={"validation_posts": 4})]) == 2
    line = one_error_line(capsys)
    assert "pipeline stage eval: eval_posts=16 is more than the 4 posts the sft stage holds out" in line
    assert not (tmp_path / "q").exists()  # refused before any stage ran


def test_pipeline_eval_alone_answers_eval_posts_of_the_posts_the_sft_mapping_holds_out(ppo_dirs, tmp_path):
    out = tmp_path / "p"
    args = pipeline_eval_args(
        ppo_dirs, out, eval_posts=3, sft={"validation_posts": 5, "max_query_length": 128, "max_response_length": 4}
    )
    assert cli_main(["pipeline", *args]) == 0
    samples = [json.loads(line) for line in (out / "eval" / "base_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and json.loads((out / "eval" / "eval.json").read_text())["prompts"] == 3
    (out / "eval" / "done.json").unlink()  # an interrupted eval stage runs again over its own folder
    assert cli_main(["pipeline", *args]) == 0


# ---------------------------------------------------------------- case 26: every training stage shards


def sharded_stages() -> list[str]:
    """The training commands of the stage registry: those whose runs take a `sharding` option."""
    from rlhfkit.config import RunConfig
    from rlhfkit.stages import STAGES

    return [name for name, stage in STAGES.items() if stage.config and issubclass(stage.config, RunConfig)]


def test_every_stage_with_a_sharding_option_accepts_fsdp2_and_on_policy_ones_refuse_zero_naming_fsdp2(monkeypatch):
    from rlhfkit.onpolicy.algorithms import ALGORITHMS
    from rlhfkit.sharding import check_sharding
    from rlhfkit.stages import resolve

    monkeypatch.setenv("WORLD_SIZE", "2")  # as under --num-processes 2
    assert "reinforce" in sharded_stages()
    for stage in sharded_stages():
        check_sharding(resolve(stage, None, None, {"sharding": "fsdp2"}).sharding_options)
    for stage in ALGORITHMS:
        with pytest.raises(Exception, match=f"for {stage} use sharding=fsdp2"):
            check_sharding(resolve(stage, None, None, {"sharding": "zero2"}).sharding_options)


@pytest.mark.slow
def test_reinforce_under_fsdp2_on_two_processes_makes_the_update_of_one_unsharded_process(ppo_dirs, tmp_path):
    import torch
    from safetensors.torch import load_file

    from .support.launches import launch
    from .support.tiny import stage_args

    # one prompt per generation chunk, as the PPO test: a chunk's random stream is then the same on one process or two
    args = {"max_steps": 2, "eos_trick": "false", "generation_batch_size": 1, "mixed_precision": "no"}
    one, two = tmp_path / "one", tmp_path / "two"
    for out, processes, extra in ((one, 1, {}), (two, 2, {"sharding": "fsdp2"})):
        done = launch("reinforce", stage_args("reinforce", ppo_dirs, out, **args, **extra), processes)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "sharding: fsdp2 over 2 processes" in done.stdout
    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-4, msg=key)
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    for left, right in zip(*rows, strict=True):
        for key in ("objective/scores", "objective/kl", "loss/policy_avg", "policy/grad_norm"):
            assert right.get(key) == pytest.approx(left.get(key), rel=1e-4, abs=1e-5), key


def test_pipeline_help_shows_each_stage_mapping_with_its_own_preset_and_eval_without_one(capsys):
    from rlhfkit.config import PipelineConfig, field_info

    assert cli_main(["pipeline", "--help"]) == 0
    out = capsys.readouterr().out
    for name, default, *_ in field_info(PipelineConfig):
        if isinstance(default, dict) and "preset" in default:
            assert f"e.g. '{{max_steps: 4, preset: {default['preset']}}}'" in out, name
    eval_help = next(line for line in out.splitlines() if line.startswith("  eval "))
    assert "preset" not in eval_help.replace("no preset", "") and "max_prompts" in eval_help
    assert out.count("preset: tldr-sft}") == 1


# ---------------------------------------------------------------- case 23: data analyze reads the generic formats

CHAT = [{"role": "user", "content": "What colour is the sky?"}]
GENERIC = [  # (records, the line `data format:` starts with, what they are read as)
    (
        [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}],
        "preference, explicit prompt, standard",
        "comparison",
    ),
    (
        [{"chosen": "Q: sky? A: blue.", "rejected": "Q: sky? A: green."}],
        "preference, implicit prompt, standard",
        "comparison",
    ),
    ([{"prompt": "The sky is", "completion": " blue."}], "prompt-completion, standard", "SFT"),
    (
        [{"prompt": CHAT, "completion": [{"role": "assistant", "content": "Blue."}]}],
        "prompt-completion, conversational",
        "SFT",
    ),
    ([{"text": "The sky is blue."}], "language-modeling, standard", "SFT"),
    ([{"prompt": "The sky is"}], "prompt-only, standard", "prompt"),
    ([{"prompt": CHAT, "answer": "blue"}], "prompt-only, conversational", "prompt"),
    ([{"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}], "gsm8k", "SFT"),  # SFT's first, as tldr-sft
]


@pytest.mark.parametrize("records, detected, read_as", GENERIC, ids=[g[1] for g in GENERIC])
def test_data_analyze_detects_and_prints_every_generic_format(
    records, detected, read_as, tiny_model_dir, tmp_path, capsys
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records * 3))
    out = tmp_path / "analysis"
    assert cli_main(["data", "analyze", "--path", str(data), "--out", str(out), "--model", str(tiny_model_dir)]) == 0
    printed = capsys.readouterr().out
    assert f"data format: {detected}" in printed and "kept 3 records, skipped none" in printed
    result = json.loads((out / "analysis.json").read_text())
    assert result["dataset"] == "auto" and result["read_as"] == f"{read_as} data" and result["records"]["kept"] == 3


def test_data_analyze_names_the_formats_it_knows_when_none_fits(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"title": "no format has only this"}\n')
    assert (
        cli_main(
            ["data", "analyze", "--path", str(data), "--out", str(tmp_path / "out"), "--model", str(tiny_model_dir)]
        )
        == 2
    )
    line = one_error_line(capsys)
    assert f"{data}:1: no data format has the columns title" in line and "prompt-only (prompt)" in line
    assert line.count("tldr-sft (") == 1


@pytest.mark.parametrize("argv", [["data", "--help"], ["data", "-h"], ["data"], ["models", "--help"]])
def test_a_command_group_lists_its_commands(argv, capsys):
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rlhfkit {argv[0]} <command>") and f"  {argv[0]} " in out


def test_data_analyze_help_lists_auto(capsys):
    assert cli_main(["data", "analyze", "--help"]) == 0
    assert "default: auto" in capsys.readouterr().out
