"""`rlhfkit plan`: the shipped configs, the arithmetic of LoRA and sharding, suggestions that
fit, errors naming the key, and one estimate checked against a measured peak (benchmarks/memory_peaks.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from functools import cache
from importlib import resources
from pathlib import Path

import pytest

from rlhfkit import cli
from rlhfkit.config import PlanConfig, PPOConfig, SFTConfig
from rlhfkit.errors import ConfigError
from rlhfkit.memory_plan import GIB, PlannedStage, estimate, plan
from rlhfkit.model_shape import SHIPPED, read_shape
from rlhfkit.onpolicy.algorithms import ALGORITHMS
from rlhfkit.stages import STAGES, resolve

from ..support.mistakes import refusal_line

ROOT = Path(__file__).resolve().parents[2]
LLAMA, PYTHIA_1B = "meta-llama/Llama-3.2-1B", "EleutherAI/pythia-1b-deduped"
SFT = PlannedStage(SFTConfig, value_model=False)


@cache
def shape(name: str):
    return read_shape(name)


def planned(**options):
    cfg = PlanConfig(**options)
    value_model = cfg.stage in ALGORITHMS and ALGORITHMS[cfg.stage].needs_value_model
    return estimate(cfg, PlannedStage(STAGES[cfg.stage].config, value_model), shape(cfg.model))


@pytest.mark.parametrize(("name", "parameters"), [
    (LLAMA, 1_235_814_400),
    (PYTHIA_1B, 1_011_781_632),
    ("EleutherAI/pythia-2.8b-deduped", 2_775_208_960),
    ("EleutherAI/pythia-6.9b-deduped", 6_857_302_016),
    ("HuggingFaceTB/SmolLM2-135M", 134_515_008),
])
def test_shipped_configs_count_the_published_parameters(name, parameters):
    assert shape(name).params == parameters


def test_pythia_1b_is_about_a_billion_parameters_with_an_untied_head():
    pythia = shape(PYTHIA_1B)
    assert 1.0e9 < pythia.params < 1.02e9 and pythia.architecture == "GPTNeoXForCausalLM" and not pythia.gated
    assert pythia.params - pythia.backbone_params == 50304 * 2048  # the reward model drops embed_out
    llama = shape(LLAMA)
    assert llama.gated and llama.kv_dim == 8 * 64 and llama.params == llama.backbone_params  # tied head


def test_shipped_configs_are_transformers_config_files():
    from transformers import AutoConfig, LlamaConfig

    folder = resources.files("rlhfkit").joinpath("model_configs")
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json"))
    assert files == sorted({f"{name}.json" for name in SHIPPED.values()})
    for name in files:
        values = json.loads(folder.joinpath(name).read_text())
        assert values["model_type"] and values["architectures"]
        assert type(AutoConfig.for_model(**values)).__name__.lower().startswith(values["model_type"].replace("_", ""))
    llama = LlamaConfig.from_dict(json.loads(folder.joinpath("llama-3.2-1b.json").read_text()))
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_key_value_heads, llama.vocab_size) == (
        2048,
        16,
        8,
        128256,
    )


def test_stage_defaults_fill_the_options_left_at_zero():
    ppo = planned(stage="ppo").settings
    default = PPOConfig()
    assert (ppo.micro, ppo.generation, ppo.forward, ppo.query, ppo.response) == (
        default.micro_batch_size,
        default.generation_batch_size,
        default.forward_batch_size,
        default.max_query_length,
        default.max_response_length,
    )
    assert planned(stage="sft", micro_batch_size=3).settings.micro == 3 != SFTConfig().micro_batch_size
    assert planned(stage="dpo").settings.response == 169 and planned(stage="grpo").settings.samples == 4
    reinforce = planned(stage="reinforce")
    assert (
        reinforce.settings.samples == 1
        and reinforce.phases["update"]["weights"] == planned(stage="grpo").phases["update"]["weights"]
    )


def test_lora_trains_only_the_adapters():
    full, lora = planned(model=LLAMA, stage="sft"), planned(model=LLAMA, stage="sft", lora_rank=16)
    # per layer, rank x (in + out) of q, k, v, o (2048 -> 2048, 512, 512, 2048) and gate, up, down (2048 <-> 8192)
    adapters = 16 * 16 * (4096 + 2560 + 2560 + 4096 + 3 * 10240)
    assert adapters == 11_272_192
    assert (
        lora.phases["update"]["gradients"] == 4 * adapters and lora.phases["update"]["optimizer state"] == 8 * adapters
    )
    assert full.phases["update"]["gradients"] == 4 * 1_235_814_400
    assert lora.phases["update"]["weights"] == full.phases["update"]["weights"]  # the base stays, frozen
    ppo = planned(model=LLAMA, stage="ppo", lora_rank=16)
    assert [m.role for m in ppo.models] == ["policy", "reward", "value"]  # the reference is the adapter-disabled policy
    value = next(m for m in ppo.models if m.role == "value")
    assert value.trained_params(ppo.settings) == adapters + 2048 + 1  # the scalar head stays trainable
    with pytest.raises(ConfigError, match="lora_target_modules=nope"):
        planned(model=LLAMA, stage="sft", lora_rank=8, lora_target_modules=["nope"])


def test_sharding_divides_as_stated():
    base = dict(model=PYTHIA_1B, stage="ppo", devices=8)
    none, zero2, fsdp2 = (planned(**base, sharding=s).phases["update"] for s in ("none", "zero2", "fsdp2"))
    trained = 1_011_781_632 + 908_761_089  # policy and value model
    assert zero2["gradients"] == 4 * trained // 8 and zero2["optimizer state"] == 8 * trained // 8
    assert zero2["weights"] == none["weights"] == 4 * (2 * 1_011_781_632 + 2 * 908_761_089)
    unit = shape(PYTHIA_1B).layer_params
    gathered = (1_011_781_632 - 14 * unit) + (
        908_761_089 - 14 * unit
    )  # both trained models: non-decoder parameters + 2 layers
    assert fsdp2["weights"] == none["weights"] // 8 + 4 * gathered
    assert fsdp2["activations"] == none["activations"]
    assert none["gradients"] == 4 * trained  # replicated: the on-policy all-reduce's flat copy is at the step
    assert planned(**base).phases["optimizer step"]["gradients"] == 8 * trained


def test_checkpointing_and_smaller_micro_batches_lower_the_activations():
    base = planned(model=LLAMA, stage="sft", micro_batch_size=16).phases["update"]["activations"]
    assert (
        planned(model=LLAMA, stage="sft", micro_batch_size=16, gradient_checkpointing=True).phases["update"][
            "activations"
        ]
        < base / 3
    )
    assert planned(model=LLAMA, stage="sft", micro_batch_size=8).phases["update"]["activations"] < base * 0.6


def test_a_plan_that_does_not_fit_suggests_changes_that_fit():
    cfg = PlanConfig(model=LLAMA, stage="sft", micro_batch_size=64, device_memory_gb=24)
    result = plan(cfg, SFT)
    assert not result.fits and result.suggestions
    for change, trial in result.suggestions:
        assert trial.fits and trial.peak <= 24 * GIB * 0.9
        assert estimate(dataclasses.replace(cfg, **change), SFT, shape(LLAMA)).peak == trial.peak
    assert plan(dataclasses.replace(cfg, micro_batch_size=1, device_memory_gb=80), SFT).fits


def test_on_policy_generation_holds_an_fp32_kv_cache():
    p = planned(model=LLAMA, stage="grpo", generation_batch_size=64)
    width = 512 + 53
    assert p.phases["generation"]["KV cache"] >= 16 * 64 * width * 2 * 512 * 4
    assert p.phases["generation"]["gradients"] == 0  # freed after every step (zero_grad set_to_none)


def test_cuda_graph_decoding_keeps_its_cache_through_scoring_the_update_and_the_optimizer_step():
    kept = planned(model=LLAMA, stage="grpo", generation_batch_size=48, mixed_precision="bf16")
    # 16 layers x (8 heads x 64) x keys and values x bf16 x 64 rows (48 up to a power of two) x 576 positions (565 up
    # to 64)
    held = {kept.phases[phase]["KV cache"] for phase in ("scoring", "update", "optimizer step")}
    assert held == {16 * 512 * 2 * 2 * 64 * 576}
    eager = planned(model=LLAMA, stage="grpo", generation_batch_size=48, mixed_precision="bf16", decoding="eager")
    assert {eager.phases[phase]["KV cache"] for phase in ("scoring", "update", "optimizer step")} == {0}
    assert kept.phases["generation"] == eager.phases["generation"]
    assert (
        planned(model=LLAMA, stage="grpo", sharding="fsdp2", devices=2).phases["update"]["KV cache"] == 0
    )  # decodes eagerly


def test_shared_rows_plan_one_row_per_group_and_ppo_is_unchanged():
    """GRPO at G = 4 with a 512-token query: a group of 4 rows is one row of 512 + 4 x 53 tokens, so the
    update's saved activations and the scoring pass's working set shrink; PPO has nothing to share."""
    options = {"model": LLAMA, "stage": "grpo", "micro_batch_size": 8, "forward_batch_size": 8}
    shared, unshared = planned(**options), planned(**options, shared_prefix="off")
    assert shared.settings.passes(8) == (2, 512 + 4 * 53) and unshared.settings.passes(8) == (8, 512 + 53)
    for phase in ("update", "scoring"):
        assert shared.phases[phase]["activations"] < 0.6 * unshared.phases[phase]["activations"], phase
    assert shared.phases["generation"] == unshared.phases["generation"]
    assert planned(model=LLAMA, stage="grpo", micro_batch_size=6).settings.passes(6) == (6, 512 + 53)  # splits a group
    assert planned(stage="ppo").phases == planned(stage="ppo", shared_prefix="off").phases


def test_cli_prints_a_table_or_json(capsys):
    assert cli.main(["plan", "model=smollm2-135m", "stage=sft", "device_memory_gb=16"]) == 0
    table = capsys.readouterr().out
    assert "weights" in table and "KV cache" in table and "fits" in table
    assert cli.main(["plan", f"model={PYTHIA_1B}", "stage=ppo", "device_memory_gb=16", "format=json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        out["fits"] is False
        and out["suggestions"]
        and all(s["peak_gib"] <= out["usable_gib"] for s in out["suggestions"])
    )
    assert set(out["phases_gib"]) == {"update", "optimizer step", "generation", "scoring"}


def test_help_lists_the_options(capsys):
    assert cli.main(["plan", "--help"]) == 0
    text = capsys.readouterr().out
    for option in (
        "model",
        "stage",
        "micro_batch_size",
        "lora_rank",
        "sharding",
        "devices",
        "device_memory_gb",
        "format",
    ):
        assert f"  {option} " in text


@pytest.mark.parametrize("model", ["/no/such/folder", "no-such-name"])
def test_a_bad_model_is_one_line_naming_the_key(model, capsys):
    assert cli.main(["plan", f"model={model}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"model={model}" in err


def test_a_folder_or_config_file_is_read(tmp_path):
    values = json.loads(resources.files("rlhfkit").joinpath("model_configs", "pythia-1b-deduped.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert read_shape(str(tmp_path)).params == read_shape(str(tmp_path / "config.json")).params == 1_011_781_632
    with pytest.raises(ConfigError, match="reward_model=.*no config.json"):
        read_shape(str(tmp_path / ".."), "reward_model")
    assert resolve("plan", None, None, {"model": str(tmp_path), "devices": "8"}).devices == 8


def test_the_estimate_is_within_25_percent_of_a_measured_peak():
    """A tiny Llama's SFT steps measured in a fresh process (profiler memory events; the method is in
    benchmarks/memory_peaks.py) against the plan's estimate."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory_peaks.py"), "--configs", "tiny-sft"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["measured_bytes"] > 50 * 2**20  # a real measurement: weights, gradients, AdamW state and activations
    assert abs(row["relative_error"]) <= 0.25, row


LLAMA_CONFIG = {
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
    values = {k: v for k, v in (LLAMA_CONFIG | change).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(values))
    for model, where in (
        (tmp_path / "config.json", f"model={tmp_path / 'config.json'}"),
        (tmp_path, f"model={tmp_path} (its config.json)"),
    ):
        assert cli.main(["plan", f"model={model}", "stage=sft"]) == 2
        line = refusal_line(capsys.readouterr().err)
        assert where in line and fragment in line, line


def test_plan_reads_the_sizes_under_an_architectures_own_names(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100).save_pretrained(tmp_path)
    assert read_shape(str(tmp_path)).hidden == 64
    (tmp_path / "config.json").write_text(
        json.dumps(json.loads((tmp_path / "config.json").read_text()) | {"n_embd": 0})
    )
    with pytest.raises(Exception, match="n_embd=0 must be a whole number above 0"):
        read_shape(str(tmp_path))
