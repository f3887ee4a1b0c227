"""`rlhfkit pipeline`: stages wired in order, finished stages skipped, interrupted ones resumed; an eval stage
alone answers the posts the sft mapping holds out; the help shows each stage's mapping."""

import json
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.pipeline_command import check_order
from rlhfkit.stages import pipeline_commands, resolve
from rlhfkit.tracking import read_metrics

from ..support.data import first_lines
from ..support.mistakes import refusal_line
from ..support.tiny import TINY, cli_args, stage_args


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory, tiny_model_dir):
    """The tiny policy, 40 real TL;DR posts and 60 real comparisons."""
    root = tmp_path_factory.mktemp("pipeline-data")
    return {"policy": tiny_model_dir,
            "posts": first_lines(root / "posts.jsonl", 40, "tldr-sft-sample", "tldr_sft_sample.jsonl.gz"),
            "pairs": first_lines(root / "pairs.jsonl", 60, "summarize-from-feedback-comparisons", "batch13.jsonl.gz")}


def test_pipeline_runs_every_stage_then_skips_finished_ones_and_resumes_an_interrupted_one(
    small_inputs, tmp_path, capsys
):
    out = tmp_path / "pipe"
    args = cli_args(stage_args("pipeline", small_inputs, out, judge=f"rm:{out / 'rm' / 'model'}"))
    assert cli_main(["pipeline", "--preset", "quickstart", *args]) == 0
    for name in [
        "sft/model/model.safetensors",
        "rm/model/scalar_head.safetensors",
        "ppo/model/model.safetensors",
        "eval/eval.json",
        "eval/sft_samples.jsonl",
        "eval/ppo_samples.jsonl",
        "eval/report.html",
        "pipeline.json",
    ]:
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
    report = (out / "report.html").read_text()  # one page: every stage's numbers, link and plots
    assert all(f'href="{stage}/report.html"' in report for stage in summary) and "ppo: held-out score" in report
    assert_caveats_follow_the_numbers(out)
    pngs = [
        p for stage in summary for p in (out / stage).glob("**/*.png") if p.parent.name in ("plots", "rm_eval", stage)
    ]
    assert len(pngs) >= 5 and report.count("<img") == len(pngs)
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


def test_pipeline_runs_reinforce_on_the_reward_model_it_trained(small_inputs, tmp_path):
    out = tmp_path / "pipe"
    tiny = {k: v for k, v in TINY["pipeline"]["ppo"].items() if k != "save_every"} | {"eval_samples": 0}
    options = stage_args(
        "pipeline",
        small_inputs,
        out,
        stages="sft,rm,reinforce",
        judge="",
        reinforce={"preset": "tldr-reinforce-pp"} | tiny,
    )
    assert cli_main(["pipeline", "--preset", "quickstart", *cli_args(options)]) == 0
    config = (out / "reinforce" / "config.yaml").read_text()
    assert f"model: {out / 'sft' / 'model'}" in config and f"reward_model: {out / 'rm' / 'model'}" in config
    assert (out / "reinforce" / "model" / "model.safetensors").is_file()
    assert list(json.loads((out / "pipeline.json").read_text())) == ["sft", "rm", "reinforce"]


def assert_caveats_follow_the_numbers(out):
    """The pipeline report's caveats are its stages' own numbers read through the caveat rules."""
    caveat_lines = json.loads((out / "report.json").read_text())["caveats"]
    rm = json.loads((out / "rm" / "rm_eval" / "rm_eval.json").read_text())["breakdown"]["overall"]
    flagged = any("at or below always-prefer-longer" in line for line in caveat_lines)
    assert flagged == (rm["accuracy"] <= rm["length_rule"]), caveat_lines
    ppo = json.loads((out / "ppo" / "eval.json").read_text())
    fell = any(line.startswith("ppo: held-out score") and "fell from" in line for line in caveat_lines)
    assert fell == (ppo["eval/ppo_score"] < ppo["eval/sft_score"]), caveat_lines
    episodes = max(r.get("episodes", 0) for r in read_metrics(out / "ppo"))
    assert f"ppo: trained on {episodes} episodes" in "\n".join(caveat_lines)
    assert f"ppo: evaluated on {ppo['eval/posts']} held-out prompts" in "\n".join(caveat_lines)


def hh_pipeline_args(tiny_model_dir, data, out):
    common = "max_query_length: 96, report_to: ''"
    return [
        f"output_dir={out}",
        f"model={tiny_model_dir}",
        "task=hh",
        "stages=rm,dpo,ppo,eval",
        f"comparisons={data / 'hh.jsonl'}",
        "eval_posts=3",
        f"judge=rm:{out / 'rm' / 'model'}",
        "rm={preset: hh-rm, total_batch_size: 4, micro_batch_size: 2, max_steps: 2, eval_pairs: 8, "
        f"max_response_length: 48, {common}}}",
        "dpo={preset: hh-dpo, total_batch_size: 4, micro_batch_size: 2, max_steps: 1, eval_samples: 0, "
        f"max_response_length: 48, {common}}}",
        "ppo={preset: hh-ppo, validation_posts: 6, eval_samples: 2, total_batch_size: 4, micro_batch_size: 4, "
        f"generation_batch_size: 4, forward_batch_size: 4, max_steps: 1, max_response_length: 8, {common}}}",
    ]


@pytest.mark.slow  # a second whole pipeline: the TL;DR one above stays in the default run
def test_hh_pipeline_starts_every_stage_from_the_base_model_and_answers_held_out_dialogues(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    first_lines(data / "hh.jsonl", 40, "hh-rlhf", "helpful-base", "test.jsonl.gz")
    out = tmp_path / "hh"
    assert cli_main(["pipeline", *hh_pipeline_args(tiny_model_dir, data, out)]) == 0
    for stage in ("rm", "dpo", "ppo"):  # no SFT stage: each starts from the base model, on HH data
        config = (out / stage / "config.yaml").read_text()
        assert f"model: {tiny_model_dir}\n" in config and (
            "data_format: hh" in config or "prompt_format: hh" in config
        ), stage
    evaluation = json.loads((out / "eval" / "eval.json").read_text())
    assert set(evaluation["policies"]) == {"base", "dpo", "ppo"} and evaluation["prompts"] == 3
    assert evaluation["policies"]["base"]["kl"] == pytest.approx(0.0, abs=1e-4)  # the base model is the reference
    samples = [json.loads(line) for line in (out / "eval" / "base_samples.jsonl").read_text().splitlines()]
    assert all(s["query"].rstrip().endswith("Assistant:") and s["reference"] for s in samples)  # the chosen reply
    assert [s["prompt_id"] for s in samples] == [
        json.loads(line)["prompt_id"] for line in (out / "eval" / "ppo_samples.jsonl").read_text().splitlines()
    ]


def test_paper_and_seed002_pipeline_presets_wire_each_stage_to_its_table(tmp_path):
    from rlhfkit.pipeline_command import eval_options, held_out_prompts, stage_config

    for size in ("1b", "2.8b", "6.9b"):
        cfg = resolve("pipeline", f"paper-pythia-{size}", None, {"output_dir": str(tmp_path / size)})
        root = tmp_path / size
        assert cfg.stages == ["sft", "rm", "dpo", "ppo", "eval"] and cfg.judge == "openai:gpt-3.5-turbo-0125"
        sft, rm, dpo, ppo = (stage_config(s, cfg, root, pipeline_commands()) for s in ("sft", "rm", "dpo", "ppo"))
        assert sft.model == f"EleutherAI/pythia-{size}-deduped"
        assert (sft.learning_rate, sft.total_batch_size, sft.lr_scheduler) == (3e-6, 128, "cosine")  # Table 3
        assert (rm.learning_rate, rm.total_batch_size, rm.model) == (3e-6, 64, str(root / "sft" / "model"))  # Table 4
        assert (dpo.beta, dpo.total_batch_size) == (0.05, 64)  # Table 6
        assert (
            ppo.learning_rate,
            ppo.total_batch_size,
            ppo.kl_coef,
            ppo.temperature,
            ppo.lam,
            ppo.vf_coef,
            ppo.total_episodes,
        ) == (3e-6, 512, 0.05, 0.7, 0.95, 0.1, 1_000_000)  # Table 7
        assert ppo.reward_model == str(root / "rm" / "model") and rm.sft_data == ppo.data  # Details 15, 21
        prompts = held_out_prompts(cfg, root, pipeline_commands())
        assert (prompts["hf_split"], prompts["split"], prompts["max_new_tokens"]) == (
            "validation",
            "all",
            53,
        )  # Figure 1
    cfg = resolve("pipeline", "seed002-gpt2-hh", None, {"output_dir": str(tmp_path / "hh")})
    rm, ppo, grpo = (stage_config(s, cfg, tmp_path / "hh", pipeline_commands()) for s in ("rm", "ppo", "grpo"))
    assert cfg.task == "hh" and "sft" not in cfg.stages and rm.model == ppo.model == "openai-community/gpt2"
    assert (rm.learning_rate, rm.total_batch_size, rm.num_epochs, rm.weight_decay, rm.data_format) == (
        2e-5,
        16,
        3,
        0.01,
        "hh",
    )
    assert (ppo.kl_coef, ppo.entropy_coef, ppo.vf_coef, ppo.prompt_format) == (0.1, 0.01, 0.5, "hh")
    assert (grpo.samples_per_prompt, grpo.kl_placement) == (4, "loss")
    options = eval_options(cfg, tmp_path / "hh", [], pipeline_commands())
    assert options["template"] == "builtin:hh-helpfulness" and options["reference_model"] == "openai-community/gpt2"
    assert options["models"][0] == "base=openai-community/gpt2" and options["reward_model"] == str(
        tmp_path / "hh" / "rm" / "model"
    )


def test_stages_must_come_after_what_they_read():
    check_order(["sft", "rm", "ppo", "dpo", "eval"], pipeline_commands().reads)
    check_order(["rm", "dpo", "ppo", "eval"], pipeline_commands().reads, "hh")
    with pytest.raises(ConfigError, match="hh task has no SFT data"):
        check_order(["sft", "rm"], pipeline_commands().reads, "hh")
    with pytest.raises(ConfigError, match="ppo reads the output of rm"):
        check_order(["sft", "ppo", "rm"], pipeline_commands().reads)
    with pytest.raises(ConfigError, match="twice"):
        check_order(["sft", "sft"], pipeline_commands().reads)


def test_stage_options_merge_into_the_preset_and_reject_non_mappings():
    cfg = resolve("pipeline", "quickstart", None, {"ppo": "{max_steps: 5}"})
    assert cfg.ppo["max_steps"] == 5 and cfg.ppo["preset"] == "tldr-ppo" and cfg.ppo["learning_rate"] == 2e-5
    with pytest.raises(ConfigError, match="ppo must be a mapping"):
        resolve("pipeline", None, None, {"ppo": "[1, 2]"})


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
    line = refusal_line(capsys.readouterr().err)
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
