"""`rlhfkit pipeline` (issue 9): stages wired in order, finished stages skipped, interrupted ones resumed."""

import gzip
import json

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.config import ConfigError, resolve
from rlhfkit.pipeline import check_order

from .conftest import data_file


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline-data")
    with gzip.open(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"), "rt") as f:
        (root / "posts.jsonl").write_text("".join(line for _, line in zip(range(40), f, strict=False)))
    with gzip.open(data_file("summarize-from-feedback-comparisons", "batch13.jsonl.gz"), "rt") as f:
        (root / "pairs.jsonl").write_text("".join(line for _, line in zip(range(60), f, strict=False)))
    return root


def pipeline_args(tiny_model_dir, data, out):
    common = "max_query_length: 128, report_to: ''"
    return [
        f"output_dir={out}", f"model={tiny_model_dir}", f"sft_data={data / 'posts.jsonl'}", f"comparisons={data / 'pairs.jsonl'}",
        "eval_posts=4", f"judge=rm:{out / 'rm' / 'model'}",
        f"sft={{validation_posts: 8, eval_samples: 0, total_batch_size: 4, micro_batch_size: 4, max_steps: 2, {common}}}",
        f"rm={{total_batch_size: 4, micro_batch_size: 2, max_steps: 2, eval_pairs: 8, normalization_samples: 8, {common}}}",
        f"ppo={{validation_posts: 8, eval_samples: 2, total_batch_size: 4, micro_batch_size: 4, generation_batch_size: 4, "
        f"forward_batch_size: 4, max_steps: 2, max_response_length: 8, save_every: 1, {common}}}",
    ]


def test_pipeline_runs_every_stage_then_skips_finished_ones_and_resumes_an_interrupted_one(tiny_model_dir, small_data, tmp_path, capsys):
    out = tmp_path / "pipe"
    args = pipeline_args(tiny_model_dir, small_data, out)
    assert cli_main(["pipeline", "--preset", "quickstart", *args]) == 0
    for name in ["sft/model/model.safetensors", "rm/model/scalar_head.safetensors", "ppo/model/model.safetensors",
                 "eval/eval.json", "eval/sft_samples.jsonl", "eval/ppo_samples.jsonl", "eval/report.html", "pipeline.json"]:
        assert (out / name).is_file(), name
    assert f"model: {out / 'sft' / 'model'}" in (out / "ppo" / "config.yaml").read_text()  # wired to the SFT stage
    evaluation = json.loads((out / "eval" / "eval.json").read_text())
    assert set(evaluation["policies"]) == {"sft", "ppo"} and evaluation["prompts"] == 4
    assert "head_to_head" in evaluation
    sft, ppo = evaluation["policies"]["sft"], evaluation["policies"]["ppo"]
    assert sft["kl"] == pytest.approx(0.0, abs=1e-4)  # the SFT policy is the reference
    assert set(ppo["token_shift"]) == {"unshifted", "marginal", "shifted"} and "rm_score" in ppo and "kl" in ppo
    # greedy samples of the reference are its own top-1 tokens (up to batched-vs-single-row rounding)
    assert sft["token_shift"]["unshifted"] > 0.95
    assert (out / "eval" / "reward_vs_kl.png").is_file() and "Token shift" in (out / "eval" / "report.html").read_text()
    summary = json.loads((out / "pipeline.json").read_text())
    assert list(summary) == ["sft", "rm", "ppo", "eval"] and "validation_accuracy" in summary["rm"]["headline"]
    capsys.readouterr()
    assert cli_main(["pipeline", "--preset", "quickstart", *args]) == 0
    assert capsys.readouterr().out.count("already finished") == 4
    # PPO interrupted after its checkpoint: the re-run resumes it instead of starting over
    (out / "ppo" / "done.json").unlink()
    (out / "eval" / "done.json").unlink()
    before = (out / "ppo" / "metrics.jsonl").read_text()
    assert cli_main(["pipeline", "--preset", "quickstart", *args]) == 0
    assert (out / "ppo" / "metrics.jsonl").read_text() == before  # nothing retrained: the last checkpoint was the end
    assert "resume:" in (out / "ppo" / "config.yaml").read_text()


def test_stages_must_come_after_what_they_read():
    check_order(["sft", "rm", "ppo", "dpo", "eval"])
    with pytest.raises(ConfigError, match="ppo reads the output of rm"):
        check_order(["sft", "ppo", "rm"])
    with pytest.raises(ConfigError, match="twice"):
        check_order(["sft", "sft"])


def test_stage_options_merge_into_the_preset_and_reject_non_mappings():
    cfg = resolve("pipeline", "quickstart", None, {"ppo": "{max_steps: 5}"})
    assert cfg.ppo["max_steps"] == 5 and cfg.ppo["preset"] == "tldr-ppo" and cfg.ppo["learning_rate"] == 2e-5
    with pytest.raises(ConfigError, match="ppo must be a mapping"):
        resolve("pipeline", None, None, {"ppo": "[1, 2]"})
