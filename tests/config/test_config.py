"""Config resolution: dataclass defaults < preset or --config file < key=value, with clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from rlhfkit import cli
from rlhfkit.config import AnalyzeConfig, EvalConfig, Gsm8kEvalConfig, RMConfig, SFTConfig, field_info, to_yaml
from rlhfkit.errors import ConfigError
from rlhfkit.stages import resolve

TLDR_SFT_DATA = ["vwxyzjn/summarize_from_feedback_tldr_3_filtered"]


def parse(stage_words: list[str], args: list[str]):
    cmd, rest = cli.find_command([*stage_words, *args])
    return cmd, cli.parse_args(cmd, rest)


def write_yaml(path, values: dict) -> str:
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return str(path)


# ---------------------------------------------------------------- resolution order


def test_defaults_when_nothing_given():
    assert resolve("sft", None, None, {}) == SFTConfig()
    assert resolve("rm", None, None, {}) == RMConfig()
    assert resolve("data-analyze", None, None, {}) == AnalyzeConfig()


def test_preset_overrides_defaults_and_key_value_overrides_preset():
    assert RMConfig().sft_data == []  # default differs from the preset below
    from_preset = resolve("rm", "tldr-rm", None, {})
    assert from_preset.sft_data == TLDR_SFT_DATA
    overridden = resolve("rm", "tldr-rm", None, {"sft_data": "a/b,c/d", "learning_rate": "1e-5"})
    assert overridden.sft_data == ["a/b", "c/d"]
    assert overridden.learning_rate == 1e-5
    # everything not overridden still comes from the preset
    assert overridden.total_batch_size == from_preset.total_batch_size == 64
    assert overridden.max_response_length == 169


def test_config_file_overrides_defaults_and_key_value_overrides_file(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", {"stage": "sft", "micro_batch_size": 2, "seed": 7, "report_to": []})
    from_file = resolve("sft", None, path, {})
    assert (from_file.micro_batch_size, from_file.seed, from_file.report_to) == (2, 7, [])
    assert from_file.learning_rate == SFTConfig().learning_rate
    both = resolve("sft", None, path, {"seed": "9"})
    assert (both.micro_batch_size, both.seed) == (2, 9)


def test_cli_accepts_key_value_and_double_dash_forms():
    _, parsed = parse(["sft"], ["seed=3", "--micro-batch-size", "2", "--learning_rate=1e-4", "--preset", "tldr-sft"])
    assert parsed.preset == "tldr-sft"
    cfg = resolve("sft", parsed.preset, parsed.config_file, parsed.overrides)
    assert (cfg.seed, cfg.micro_batch_size, cfg.learning_rate) == (3, 2, 1e-4)


def test_config_file_can_start_from_a_preset(tmp_path):
    path = write_yaml(tmp_path / "run.yaml", {"stage": "rm", "preset": "tldr-rm", "micro_batch_size": 1})
    cfg = resolve("rm", None, path, {})
    assert cfg.sft_data == TLDR_SFT_DATA  # from the preset
    assert cfg.micro_batch_size == 1  # from the file, over the preset


# ---------------------------------------------------------------- paper presets


def test_table3_sft_preset_values():
    cfg = resolve("sft", "tldr-sft", None, {})
    assert cfg.learning_rate == 3e-6
    assert cfg.adam_eps == 1e-5
    assert cfg.lr_scheduler == "cosine"
    assert cfg.total_batch_size == 128
    assert cfg.num_epochs == 1.0
    assert cfg.max_query_length == 512  # Detail 2
    assert cfg.max_response_length == 53  # Detail 4
    assert cfg.loss_on_query is False
    assert cfg.data == TLDR_SFT_DATA


def test_table4_rm_preset_values():
    cfg = resolve("rm", "tldr-rm", None, {})
    assert cfg.learning_rate == 3e-6
    assert cfg.adam_eps == 1e-5
    assert cfg.lr_scheduler == "cosine"
    assert cfg.total_batch_size == 64
    assert cfg.num_epochs == 1.0
    assert cfg.max_query_length == 512
    assert cfg.max_response_length == 169  # Detail 4: preference responses run to 169 tokens
    assert cfg.data == ["openai/summarize_from_feedback"]
    assert cfg.data_format == "tldr-comparisons"


def test_preset_for_the_wrong_stage_fails():
    with pytest.raises(ConfigError, match=r"preset tldr-rm is for stage 'rm', not 'sft'"):
        resolve("sft", "tldr-rm", None, {})
    with pytest.raises(ConfigError, match=r"not 'rm'"):
        resolve("rm", "tldr-sft", None, {})


def test_config_file_for_the_wrong_stage_fails(tmp_path):
    path = write_yaml(tmp_path / "rm.yaml", {"stage": "rm", "head": "eos-linear"})
    with pytest.raises(ConfigError, match=r"rm.yaml is for stage 'rm', not 'sft'"):
        resolve("sft", None, path, {})


def test_unknown_preset_lists_shipped_presets():
    with pytest.raises(
        ConfigError,
        match=r"unknown preset 'tldr-kto'.*gsm8k-dapo, gsm8k-dr-grpo, gsm8k-grpo, gsm8k-gspo, gsm8k-reinforce-pp, "
        r"hh-dpo, hh-grpo, hh-ppo, hh-rm, paper-pythia-1b, paper-pythia-2\.8b, paper-pythia-6\.9b, quickstart, "
        r"seed002-gpt2-hh, tldr-dapo, tldr-dpo, tldr-dr-grpo, tldr-grpo, tldr-gspo, tldr-ppo, tldr-reinforce-pp, "
        r"tldr-rloo, tldr-rm, tldr-sft",
    ):
        resolve("sft", "tldr-kto", None, {})


def test_missing_config_file_fails(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve("sft", None, str(tmp_path / "nope.yaml"), {})


def test_config_file_must_be_a_mapping(tmp_path):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        resolve("sft", None, str(tmp_path / "list.yaml"), {})
    (tmp_path / "bad.yaml").write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        resolve("sft", None, str(tmp_path / "bad.yaml"), {})


def test_preset_and_config_together_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        parse(["sft"], ["--preset", "tldr-sft", "--config", str(tmp_path / "x.yaml")])


# ---------------------------------------------------------------- errors that name the key


def test_unknown_key_names_it_and_suggests_close_names():
    with pytest.raises(ConfigError) as err:
        resolve("sft", None, None, {"lerning_rate": "1e-5"})
    message = str(err.value)
    assert "'lerning_rate'" in message
    assert "Did you mean: learning_rate" in message


def test_unknown_key_in_a_config_file_names_the_file(tmp_path):
    path = write_yaml(tmp_path / "typo.yaml", {"stage": "sft", "micro_bach_size": 2})
    with pytest.raises(ConfigError, match=r"'micro_bach_size' in .*typo.yaml.*Did you mean: micro_batch_size"):
        resolve("sft", None, path, {})


def test_unknown_key_through_the_cli_exits_2_with_one_line(capsys):
    assert cli.main(["sft", "--lerning-rate", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhfkit: error: unknown key 'lerning_rate'")
    assert "learning_rate" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("seed", "one", r"seed expects an integer, got 'one'"),
        ("seed", "1.5", r"seed expects an integer"),
        ("learning_rate", "fast", r"learning_rate expects a number, got 'fast'"),
        ("loss_on_query", "maybe", r"loss_on_query expects a boolean \(true/false\), got 'maybe'"),
        ("lr_scheduler", "cosin", r"lr_scheduler='cosin' is not accepted; choose one of: cosine, linear, constant"),
        ("mixed_precision", "fp16", r"choose one of: auto, no, bf16"),
    ],
)
def test_wrong_type_on_the_command_line_names_key_and_accepted_values(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        resolve("sft", None, None, {key: value})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"seed": True}, r"seed expects int, got boolean True"),
        ({"learning_rate": False}, r"learning_rate expects float, got boolean"),
        ({"data": {"a": 1}}, r"data expects a list \(list of str \(comma separated\)\)"),
        ({"report_to": 3}, r"report_to expects a list"),
        ({"model": ["a", "b"]}, r"model expects a string"),
        ({"head": "cls"}, r"head='cls' is not accepted; choose one of: eos-linear, mean-mlp"),
        ({"output_dir": None}, r"output_dir has no value"),
        ({"seed": None}, r"seed has no value"),
    ],
)
def test_wrong_type_in_a_config_file_names_key_and_accepted_values(tmp_path, values, expected):
    path = write_yaml(tmp_path / "wrong.yaml", {"stage": "rm", **values})
    with pytest.raises(ConfigError, match=expected):
        resolve("rm", None, path, {})


def test_values_are_coerced_to_field_types():
    cfg = resolve(
        "sft",
        None,
        None,
        {
            "seed": "1_000",
            "num_epochs": "2",
            "loss_on_query": "yes",
            "report_to": " tensorboard , wandb ,",
            "lr_scheduler": "linear",
        },
    )
    assert cfg.seed == 1000 and isinstance(cfg.seed, int)
    assert cfg.num_epochs == 2.0 and isinstance(cfg.num_epochs, float)
    assert cfg.loss_on_query is True
    assert cfg.report_to == ["tensorboard", "wandb"]
    assert cfg.lr_scheduler == "linear"


def test_yaml_bare_no_is_read_as_the_literal_choice(tmp_path):
    # YAML 1.1 turns a bare `no` into False; the choice `no` of mixed_precision must still work
    path = tmp_path / "fp32.yaml"
    path.write_text("stage: sft\nmixed_precision: no\n")
    assert resolve("sft", None, str(path), {}).mixed_precision == "no"


def test_num_processes_must_be_a_number(capsys):
    assert cli.main(["dist-check", "--num-processes", "two"]) == 2
    assert "--num-processes expects a whole number" in capsys.readouterr().err


def test_command_without_options_refuses_them():
    with pytest.raises(ConfigError, match="dist-check takes no options: got seed"):
        parse(["dist-check"], ["seed=1"])


def test_unknown_command_shows_the_overview(capsys):
    assert cli.main(["ppo-train"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'ppo-train'" in err
    assert (
        "data analyze" in err
        and "presets: gsm8k-dapo, gsm8k-dr-grpo, gsm8k-grpo, gsm8k-gspo, gsm8k-reinforce-pp, hh-dpo, hh-grpo, hh-ppo, "
            "hh-rm, paper-pythia-1b, paper-pythia-2.8b, paper-pythia-6.9b, quickstart, seed002-gpt2-hh, tldr-dapo, "
            "tldr-dpo, tldr-dr-grpo, tldr-grpo, tldr-gspo, tldr-ppo, tldr-reinforce-pp, tldr-rloo, tldr-rm, tldr-sft"
        in err
    )


# ---------------------------------------------------------------- --help and round trip


def help_text(capsys, words: list[str]) -> str:
    assert cli.main([*words, "--help"]) == 0
    return capsys.readouterr().out


def option_lines(text: str) -> dict[str, tuple[str, str]]:
    """name -> (help line, default line) from `rlhfkit <stage> --help`."""
    lines = text.splitlines()
    start = lines.index("options (default; source):") + 1
    out = {}
    for first, second in zip(lines[start::2], lines[start + 1 :: 2], strict=False):
        out[first.split()[0]] = (first, second)
    return out


def test_sft_help_lists_every_field_with_default_and_paper_source(capsys):
    options = option_lines(help_text(capsys, ["sft"]))
    names = [f.name for f in dataclasses.fields(SFTConfig)]
    assert sorted(options) == sorted(names)
    for name, default, _, source, _ in field_info(SFTConfig):
        shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
        first, second = options[name]
        assert f"default: {shown}   type:" in second, name
        if source:
            assert f"[{source}]" in first, name
    # paper sources spelled out where the defaults come from
    assert "[Table 3]" in options["total_batch_size"][0]
    assert "default: 128" in options["total_batch_size"][1]
    assert "[Detail 2]" in options["max_query_length"][0]
    assert "default: 3e-06" in options["learning_rate"][1] and "Tables 3, 4" in options["learning_rate"][0]
    assert "{cosine,linear,constant}" in options["lr_scheduler"][1]


def test_rm_help_shows_table4_batch(capsys):
    options = option_lines(help_text(capsys, ["rm"]))
    assert "[Table 4]" in options["total_batch_size"][0]
    assert "default: 64" in options["total_batch_size"][1]
    assert "[Detail 4]" in options["max_response_length"][0] and "default: 169" in options["max_response_length"][1]


def test_top_level_help_lists_commands_and_presets(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for words in ("sft", "rm", "ppo", "data analyze", "models prepare", "dist-check"):
        assert f"  {words} " in out
    assert (
        "presets: gsm8k-dapo, gsm8k-dr-grpo, gsm8k-grpo, gsm8k-gspo, gsm8k-reinforce-pp, hh-dpo, hh-grpo, hh-ppo, "
        "hh-rm, paper-pythia-1b, paper-pythia-2.8b, paper-pythia-6.9b, quickstart, seed002-gpt2-hh, tldr-dapo, "
        "tldr-dpo, tldr-dr-grpo, tldr-grpo, tldr-gspo, tldr-ppo, tldr-reinforce-pp, tldr-rloo, tldr-rm, tldr-sft"
        in out
    )


@pytest.mark.parametrize(("stage", "preset"), [("sft", "tldr-sft"), ("rm", "tldr-rm"), ("data-analyze", None)])
def test_resolved_config_round_trips_through_to_yaml(tmp_path, stage, preset):
    overrides = {"seed": "5", "report_to": "wandb"} if stage != "data-analyze" else {"path": "a.jsonl,b.jsonl"}
    cfg = resolve(stage, preset, None, overrides)
    text = to_yaml(cfg, stage)
    assert yaml.safe_load(text)["stage"] == stage
    (tmp_path / "resolved.yaml").write_text(text)
    again = resolve(stage, None, str(tmp_path / "resolved.yaml"), {})
    assert again == cfg
    assert to_yaml(again, stage) == text


# ---------------------------------------------------------------- one command path under both shells


def test_both_shells_refuse_a_preset_with_a_config_file_in_the_same_words(tmp_path, capsys):
    from ..support.mistakes import one_error_line

    line = one_error_line(["sft", "--preset", "tldr-sft", "--config", str(tmp_path / "x.yaml")], capsys)
    assert "give a preset or a config file, not both" in line


def test_eval_task_gsm8k_is_refused_naming_the_gsm8k_command(capsys):
    """GSM8K left `rlhfkit eval` for `rlhfkit eval gsm8k`: the old form is one line naming the new command, in
    both shells, not an unknown key with a guess."""
    from ..support.mistakes import one_error_line

    line = one_error_line(["eval", "task=gsm8k", "data=problems.jsonl"], capsys)
    assert "`rlhfkit eval gsm8k" in line and "unknown key" not in line


def test_eval_and_eval_gsm8k_each_take_only_their_own_options():
    eval_options = {name for name, *_ in field_info(EvalConfig)}
    gsm8k_options = {name for name, *_ in field_info(Gsm8kEvalConfig)}
    assert {"samples", "judge", "rm_judge"} <= eval_options and "pass_k" not in eval_options
    assert {"data", "pass_k", "environments", "easy_steps"} <= gsm8k_options and "judge" not in gsm8k_options
    assert all("gsm8k" not in help_text for _, _, help_text, *_ in field_info(EvalConfig))
    with pytest.raises(ConfigError, match="unknown key 'judge'"):
        resolve("eval-gsm8k", None, None, {"judge": "rm:x"})


def test_eval_help_is_its_own_and_names_the_command_under_it(capsys):
    assert cli.main(["eval", "--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: rlhfkit eval [") and "samples" in shown and "eval gsm8k" in shown
    assert cli.main(["eval", "gsm8k", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: rlhfkit eval gsm8k [")
    assert cli.main(["data", "--help"]) == 0  # a word that is no command of its own still lists its group
    assert capsys.readouterr().out.startswith("usage: rlhfkit data <command>")
