"""Smoke tests of the benchmark scripts: each runs on a tiny model for a step or two and
prints its JSON line. Not timed: the numbers they print are only checked for shape."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# the scripts, not the library: in the slow suite, which CI runs (pytest -m slow)
pytestmark = pytest.mark.slow


def run_benchmark(script: str, *args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_generation_benchmark_compares_each_way_of_decoding_with_transformers_generate():
    sides = "ours-eager,ours-buckets,ours-graphs,hf-eager,hf-static"
    rows = run_benchmark(
        "generation.py",
        "--model",
        "tiny",
        "--batches",
        "1,3",
        "--repeats",
        "1",
        "--new-tokens",
        "6",
        "--query-length",
        "160",
        "--sides",
        sides,
    )
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        for side in sides.split(","):
            assert row[f"{side}_identical"] is True  # greedy decoding: token for token the same as the first side's
            # ms per step is a difference of two timings: at this size it is noise, possibly below 0
            assert (
                row[f"{side}_tokens_per_s"] > 0
                and isinstance(row[f"{side}_ms_per_step"], float)
                and row[f"{side}_speedup_vs_hf-eager"] > 0
            )
            assert row[f"{side}_decoded_positions"] <= 6 and row[f"{side}_peak_memory_bytes"] > 0
        # what each of our sides ran: CUDA graphs, asked for on a CPU, fell back to eager steps
        assert [row[f"ours-{way}_decoding"] for way in ("eager", "buckets", "graphs")] == ["eager", "buckets", "eager"]
        assert_memory_limit_beside_each_side(row, sides.split(","))


def assert_memory_limit_beside_each_side(row: dict, sides: list[str]) -> None:
    """The step's bytes add up, its limit is those bytes at the measured bandwidth, and each side's ms per
    step is stated over it (all three rounded as printed)."""
    assert row["memory_copy_gb_per_s"] > 0 and row["memory_read_gb_per_s"] > 0 and row["step_limit_ms"] > 0
    assert row["memory_gb_per_s"] == max(row["memory_copy_gb_per_s"], row["memory_read_gb_per_s"])
    assert row["step_bytes"] == row["step_weight_bytes"] + row["step_kv_cache_bytes"]
    assert row["step_limit_ms"] == pytest.approx(row["step_bytes"] / row["memory_gb_per_s"] / 1e6, abs=1e-3)
    for side in sides:
        over = row[f"{side}_ms_per_step"] / row["step_limit_ms"]
        assert row[f"{side}_ms_per_step_over_limit"] == pytest.approx(over, abs=0.006)


def test_decode_matmuls_benchmark_times_every_linear_layer_with_both_kernels():
    (row,) = run_benchmark("decode_matmuls.py", "--model", "tiny", "--rows", "2", "--repeats", "1")
    # the tiny Llama: 2 layers of q, k, v, o, gate, up, down, and the LM head
    assert row["linear_layers"] == 2 * 7 + 1
    for kernel in ("linear", "onednn_packed"):
        assert row[f"{kernel}_ms"] > 0 and row[f"{kernel}_gb_per_s"] > 0 and row[f"{kernel}_gflops"] > 0
    assert row["onednn_max_abs_diff"] < 1e-3


def test_decoding_step_bytes_match_a_hand_count_tied_and_untied():
    sys.path.insert(0, str(BENCHMARKS))
    from benchmark_common import decode_weight_bytes, kv_cache_bytes_per_position
    from transformers import LlamaConfig, LlamaForCausalLM

    def config(tied: bool) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=tied,
        )

    # per layer: q, o 32x32; k, v 32x16 (2 kv heads x head dim 8); gate, up, down 32x48; two norms of 32
    layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48 + 2 * 32
    body = 2 * layer + 32  # and the final norm
    # tied: the embedding once, as the LM head; untied: the LM head, and not the input embedding
    for tied in (True, False):
        model = LlamaForCausalLM(config(tied))
        assert decode_weight_bytes(model) == 4 * (body + 100 * 32)
        assert decode_weight_bytes(model.to(torch.bfloat16)) == 2 * (body + 100 * 32)
    # 2 layers x keys and values x 2 kv heads x head dim 8
    assert kv_cache_bytes_per_position(config(True), torch.float32) == 2 * 2 * 2 * 8 * 4
    assert kv_cache_bytes_per_position(config(True), torch.bfloat16) == 2 * 2 * 2 * 8 * 2


# a 135M model built and run on the CPU, sampled in groups as GRPO samples
def test_generation_benchmark_builds_the_seeds_shapes_with_random_weights():
    sides = ["ours-eager", "ours-buckets", "hf-eager"]
    (row,) = run_benchmark(
        "generation.py",
        "--model",
        "shape:smollm2-135m",
        "--batches",
        "4",
        "--group",
        "2",
        "--repeats",
        "1",
        "--new-tokens",
        "3",
        "--query-length",
        "200",
        "--sides",
        ",".join(sides),
        "--profile",
    )
    assert row["query_tokens_max"] == 200 and row["batch"] == 4 and row["group"] == 2
    assert row["ours-eager_decoded_positions"] == 3
    # ours encodes each of the 2 queries once, generate each of the 4 rows: the same greedy tokens
    assert row["ours-buckets_identical"] is True and row["hf-eager_identical"] is True
    # SmolLM2-135M: 30 layers of 3,538,944 matmul weights and 2 x 576 norm weights, the final norm, and
    # the 49,152 x 576 embedding once (tied: the LM head), in fp32
    assert row["step_weight_bytes"] == 4 * (30 * (3_538_944 + 2 * 576) + 576 + 49_152 * 576)
    # 30 layers x keys and values x 3 kv heads x head dim 64 x 4 bytes, 4 rows, 200 + 3 / 2 positions
    assert row["step_kv_cache_bytes"] == round(30 * 2 * 3 * 64 * 4 * 4 * (200 + 3 / 2))
    assert_memory_limit_beside_each_side(row, sides)
    for side in sides:
        ops = row[f"{side}_step_top_ops"]
        assert len(ops) == 8 and any(name == "aten::mm" for name, _, _ in ops)
        # a difference of two profiles: the prompt call's noise can exceed 3 tokens' steps, so only its shape
        assert ops[0][1] > 0 and [ms for _, ms, _ in ops] == sorted((ms for _, ms, _ in ops), reverse=True)
        assert isinstance(row[f"{side}_step_profiled_ms"], float)


def test_generation_precision_benchmark_times_fp32_and_bf16_autocast_with_and_without_the_bf16_cache():
    rows = run_benchmark(
        "generation_precision.py",
        "--models",
        "tiny",
        "--prompts",
        "2",
        "--batch",
        "2",
        "--new-tokens",
        "4",
        "--query-length",
        "64",
        "--repeats",
        "1",
        "--frozen",
    )
    modes = {row["mode"]: row for row in rows}
    assert list(modes) == ["fp32", "bf16_recast", "bf16", "bf16_frozen_recast", "bf16_frozen"]
    assert (
        all(row["s"] > 0 and row["decode_s"] > 0 and row["ratio_to_fp32"] > 0 for row in rows)
        and modes["fp32"]["ratio_to_fp32"] == 1
    )
    # bf16: the same tokens and log-probabilities as with the bf16 cache and the cast-once switched off, without
    # casting the cache or a frozen weight at each token
    assert modes["bf16"]["identical_to"] == modes["bf16_frozen"]["identical_to"] == "bf16_recast"
    assert (
        modes["bf16_recast"]["cache_casts"] > 0
        and modes["bf16"]["cache_casts"] == modes["bf16_frozen"]["cache_casts"] == 0
    )
    assert (
        modes["bf16_frozen_recast"]["weight_casts"]
        > modes["bf16_frozen"]["weight_casts"]
        == modes["bf16"]["weight_casts"]
        > 0
    )


def test_matmul_peak_probe_reports_fp32_and_bf16():
    rows = run_benchmark("matmul_peak.py", "--sizes", "128,256", "--seconds", "0.05")
    assert [r["precision"] for r in rows] == ["fp32", "bf16"]
    for row in rows:
        assert (
            set(row["gflops_by_size"]) == {"128", "256"}
            and row["peak_gflops"] == max(row["gflops_by_size"].values()) > 0
        )


def test_training_benchmark_reports_mfu_against_the_measured_peak():
    (row,) = run_benchmark(
        "train_throughput.py",
        "--stage",
        "sft",
        "--model",
        "tiny",
        "--batch",
        "2",
        "--seq",
        "64",
        "--steps",
        "1",
        "--warmup",
        "1",
    )
    assert row["tokens_per_s"] > 0 and row["matmul_peak_gflops"] > 0
    # both fields are rounded: the MFU to 3 decimals, the achieved GFLOP/s to 1
    assert (
        abs(row["mfu"] - row["model_gflops_per_s"] / row["matmul_peak_gflops"])
        <= 5e-4 + 0.05 / row["matmul_peak_gflops"]
    )


def test_training_flops_count_matches_a_hand_count_for_smollm2_shapes():
    sys.path.insert(0, str(BENCHMARKS))
    from flops import training_flops_per_token
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536
    )
    # per layer: q, o 576x576 each; k, v 576x192 each; MLP 3 x 576x1536 -> 3,538,944 weights; x6 x30 layers
    # plus attention 12 x 30 x 576 x 512
    assert training_flops_per_token(config, 512) == 6 * 30 * 3_538_944 + 12 * 30 * 576 * 512


def test_padding_benchmark_counts_less_padding_with_length_buckets():
    (row,) = run_benchmark(
        "padding.py", "--stages", "sft", "--limit", "48", "--total-batch", "16", "--micro-batch", "4"
    )
    assert row["steps"] == 3 and row["real_tokens"] <= row["computed_tokens_bucketed"] <= row["computed_tokens_plain"]
    assert row["bucketed_over_plain"] == round(row["computed_tokens_bucketed"] / row["computed_tokens_plain"], 4)


def test_onpolicy_benchmark_splits_an_update_into_phases():
    (row,) = run_benchmark(
        "onpolicy_throughput.py",
        "--algorithm",
        "grpo",
        "--model",
        "tiny",
        "--batch",
        "4",
        "--micro-batch",
        "2",
        "--query-length",
        "16",
        "--response-length",
        "4",
        "--update-epochs",
        "1",
        "--updates",
        "1",
        "--warmup",
        "0",
        "--decoding",
        "buckets",
    )
    assert row["samples_per_prompt"] == 4 and row["batch"] == 4 and row["decoding"] == "buckets"
    # micro-batches of 2 would split a group of 4: unshared rows; K = 1 with the KL in the loss: reused forward
    assert row["shared_prefix"] == "auto" and not row["shared_rows_used"] and row["old_logprobs_from_update"]
    assert row["generation_s"] > 0 and row["scoring_s"] > 0 and row["update_s"] > 0
    assert (
        0 < row["generation_share"] < 1 and row["collect_peak_memory_bytes"] > 0 and row["update_peak_memory_bytes"] > 0
    )
    assert row["update_total_s"] >= row["generation_s"] + row["scoring_s"] + row["update_s"] - 1e-3


def test_compare_methods_sets_runs_beside_the_sft_policy_with_intervals(ppo_dirs, tmp_path):
    from rlhfkit.cli import main as cli_main

    from ..support.tiny import cli_args, stage_args

    out = tmp_path / "dr-grpo"
    options = stage_args("grpo", ppo_dirs, out, samples_per_prompt=4, eval_samples=3, max_steps=1)
    assert cli_main(["grpo", "--preset", "tldr-dr-grpo", *cli_args(options)]) == 0
    sft, *methods = run_benchmark("compare_methods.py", str(out), str(out))
    assert sft["run"] == "sft" and sft["prompts"] == 3
    for row in methods:
        low, high = row["minus_sft_interval"]
        assert low <= row["minus_sft"] <= high and row["beats_sft_baseline"] == 0.5
        assert row["episodes_trained"] == 8 and row["responses_sampled"] == 8 and 0 <= row["question_ending_share"] <= 1


def test_random_model_copies_a_folders_tokenizer_and_architecture_with_fresh_weights(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (row,) = run_benchmark(
        "random_model.py", "--like", str(tiny_model_dir), "--out", str(tmp_path / "random"), "--seed", "7"
    )
    source = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    built = AutoModelForCausalLM.from_pretrained(tmp_path / "random")
    assert type(built) is type(source) and row["parameters"] == sum(p.numel() for p in built.parameters())
    assert built.config.num_hidden_layers == source.config.num_hidden_layers
    assert not torch.equal(built.model.embed_tokens.weight, source.model.embed_tokens.weight)
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "random").get_vocab()
        == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    )
    (tiny,) = run_benchmark("random_model.py", "--like", str(tiny_model_dir), "--out", str(tmp_path / "t"), "--tiny")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "t").config.num_hidden_layers == 2 and tiny["tiny"]


def test_pipeline_summary_gives_each_stage_its_seconds_median_perf_and_first_and_last_loss(tmp_path):
    (tmp_path / "pipeline.json").write_text(json.dumps({"sft": {"seconds": 12.5, "headline": {"loss": 1}}}))
    (tmp_path / "sft").mkdir()
    steps = [(1, 3.0, 9.0), (2, 2.0, 1.0), (3, 1.5, 2.0)]
    rows = [{"step": s, "train/loss": loss, "perf/step_s": t} for s, loss, t in steps]
    (tmp_path / "sft" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"eval": 1}\n')
    (line,) = run_benchmark("pipeline_summary.py", str(tmp_path))
    assert line == {
        "stage": "sft",
        "seconds": 12.5,
        "logged_steps": 3,
        "median perf/step_s": 2.0,
        "train/loss first/last": [3.0, 1.5],
        "headline": {"loss": 1},
    }
