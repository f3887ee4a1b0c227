#!/usr/bin/env bash
# The GPU measurements of docs/performance.md ("On a CUDA GPU"), sized for the device tool's lent H200: each part
# fits one 10-minute command and writes its JSON lines to $OUT. Every line of `compare` and `real` carries `part`,
# `device` (the GPU's name, or the CPU's) and `date` (UTC), which the tables of docs/performance.md read.
#
#   here, once:   bash benchmarks/gpu_suite.sh wheels     # what the GPU image lacks: .whl/ (17 MiB) and .gpu/ (5 MiB)
#                 bash benchmarks/gpu_suite.sh split      # the embedded GGUF (94 MiB) cut into .gguf/ (3 parts)
#   there:        bash benchmarks/gpu_suite.sh stages     # every stage end to end: bf16, CUDA-graph decoding
#                 bash benchmarks/gpu_suite.sh generation # generation beside transformers generate
#                 bash benchmarks/gpu_suite.sh updates    # one PPO and two GRPO updates (shared rows on, off) per shape
#                 bash benchmarks/gpu_suite.sh quick      # stages, then the 135M shape's generation and updates
#                 bash benchmarks/gpu_suite.sh compare [SHAPE...]  # compare_trl.py, ours beside TRL: compare.jsonl
#                 bash benchmarks/gpu_suite.sh receive    # keep this call's GGUF part; join them once all came
#                 bash benchmarks/gpu_suite.sh real [recipe] [quickstart]  # the real weights: real.jsonl
#
# Carry (device tool `carry`; the working tree itself is about 5 MiB of the 64 a call may carry):
#   stages, generation, updates, quick, compare: [".whl", ".gpu"]. `compare` alone runs both shapes, about 10 minutes
#   by estimate (22 child processes, each loading torch, TRL and the weights; the 1B shape's checkpoints are 13 GB):
#   `compare smollm2-135m` and `compare llama-3.2-1b` on consecutive calls keep each well inside one command.
#   real, on consecutive calls of one warm machine (it is given back 30 s after a call, and the kept parts with it):
#     1. [".gguf/manifest.json", ".gguf/part-00"]                 bash benchmarks/gpu_suite.sh receive
#     2. [".gguf/manifest.json", ".gguf/part-01"]                 bash benchmarks/gpu_suite.sh receive
#     3. [".whl", ".gpu", ".gguf/manifest.json", ".gguf/part-02"] bash benchmarks/gpu_suite.sh real
#   (36, 36 and 56 MiB; the compare calls carry 26). `receive` prints the parts kept and missing; `real` receives
#   first, so its call brings the last part. If `real` outruns its command, `real recipe` and `real quickstart` split
#   it over two calls (the kept parts and the converted model stay on the warm machine in .gguf-store/).
#
# The GPU image has torch, transformers, accelerate and peft; rlhfkit also imports rouge-score (with nltk),
# platformdirs, gguf (to read the GGUF) and this repository's transformers version, and compare_trl.py TRL 1.13.0
# with datasets, dill and multiprocess: all travel as wheels, installed into /tmp/site on the GPU machine only (the
# CPU's virtual environment has them). The embedded weights as converted (538 MB) cannot travel, so .gpu/ holds
# SmolLM2's config and tokenizer, from which `stages` and `compare` build random weights of a shape, and the TL;DR
# samples of ../shared/data that the stages and the quick start read (../shared does not travel). The GGUF (94 MiB)
# travels in parts over consecutive calls (gguf_parts.py: sha256 of each part and of the whole), and `real`
# converts it with `rlhfkit models prepare`, as a user's first command does.
#
# Tiny forms, CPU checks of the commands (tests/benchmarks/test_gpu_suite.py):
#   STAGES_TINY=1  `stages` on a 2-layer model of the same tokenizer
#   COMPARE_TINY=1 `compare` on compare_trl's tiny model with tiny shapes, on the CPU
#   REAL_TINY=1    `real` cuts the GGUF itself (split, receive, join, prepare), then the recipe's short variant and
#                  the quick start, each cut to a step or two, on the CPU
# GGUF_PARTS, GGUF_STORE and SCRATCH move .gguf/, .gguf-store/ and the run folders (/tmp/gpu_suite) elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
parts="wheels, split, receive, stages, generation, updates, quick, compare or real"
part=${1:?"$parts"}
shift
out=${OUT:-runs/gpu_suite}
gguf_parts=$(realpath -m "${GGUF_PARTS:-.gguf}")
gguf_store=$(realpath -m "${GGUF_STORE:-.gguf-store}")
scratch=$(realpath -m "${SCRATCH:-/tmp/gpu_suite}")
mkdir -p "$out"

exclude() {
    # ignored here, so that a device call neither carries the folder nor clears it there
    [ -d .git/info ] || return 0
    grep -qx "/$1/" .git/info/exclude 2>/dev/null || echo "/$1/" >> .git/info/exclude
}

device_name() {
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 ||
        sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1
}
device=$(device_name)

tag() {
    # the JSON lines on stdin with part $1, the device and the date; further arguments are key=value fields
    python3 benchmarks/suite_lines.py --part "$1" --device "$device" "${@:2}"
}

split_gguf() {
    local gguf
    exclude .gguf
    exclude .gguf-store
    gguf=$(python3 -c "from rlhfkit.models import gguf_location; print(gguf_location('smollm2-135m'))")
    python3 benchmarks/gguf_parts.py split --file "$gguf" --parts "$gguf_parts"
}

receive() {
    # the GGUF parts of this call kept, as part $1; further arguments go to gguf_parts.py (stdlib only: it runs
    # before the wheels are installed)
    local as=$1
    shift
    python3 benchmarks/gguf_parts.py receive --parts "$gguf_parts" --store "$gguf_store" "$@" | tag "$as"
}

case "$part" in
wheels)
    exclude .whl
    # all pure Python (rouge-score exists only as a source archive, built here)
    python3 -m pip wheel -q --no-deps -w .whl transformers==5.24.0 rouge-score==0.1.2 nltk==3.10.4 \
        platformdirs==4.14.7 defusedxml==0.7.1 typer==0.24.1 gguf==0.19.0 trl==1.13.0 datasets==5.2.0 dill==0.4.1
    # multiprocess has one wheel per Python version: the GPU image's is 3.12
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl multiprocess==0.70.19
    exclude .gpu
    embedded=$(python3 -c "from rlhfkit.models import embedded_dir; print(embedded_dir('smollm2-135m'))")
    mkdir -p .gpu/smollm2-135m .gpu/data
    cp "$embedded"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .gpu/smollm2-135m/
    comparisons=../shared/data/summarize-from-feedback-comparisons
    cp ../shared/data/tldr-sft-sample/tldr_sft_sample.jsonl.gz "$comparisons"/batch13.jsonl.gz \
        "$comparisons"/batch18.jsonl.gz .gpu/data/
    du -sh .whl .gpu
    exit 0
    ;;
split)
    split_gguf | tag split
    du -sh "$gguf_parts"/*
    exit 0
    ;;
receive)
    receive receive | tee -a "$out/receive.jsonl"
    exit 0
    ;;
esac

# the wheels are for the GPU image's Python 3.12; a CPU runs the tiny forms in its own virtual environment
if [ -d .whl ] && command -v nvidia-smi > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi: $device"; } | tee "$out/gpu.txt"

stages() {
    # every stage that trains a policy, the reward model and evaluation, through `rlhfkit pipeline`
    # (benchmarks/gpu_stages.yaml), on random weights of SmolLM2-135M's shape
    local model=/tmp/random-smollm2-135m tiny="" run="$out/stages"
    [ -n "${STAGES_TINY:-}" ] && tiny=--tiny
    python3 benchmarks/random_model.py --like .gpu/smollm2-135m --out "$model" $tiny | tee "$out/stages.jsonl"
    rm -rf "$run"
    local began=$SECONDS status=0
    python3 -m rlhfkit.cli pipeline --config benchmarks/gpu_stages.yaml model="$model" output_dir="$run" \
        > "$out/stages.log" 2>&1 || status=$?
    grep -n -i -E "falls back|fell back|warning|error|traceback" "$out/stages.log" | head -40 || true
    echo "{\"part\": \"stages\", \"exit\": $status, \"seconds\": $((SECONDS - began))}" | tee -a "$out/stages.jsonl"
    [ -f "$run/pipeline.json" ] && python3 benchmarks/pipeline_summary.py "$run" | tee -a "$out/stages.jsonl"
    return $status
}

generation_135m() {
    # the 135M shape at the issue's three batch sizes, every side
    python3 benchmarks/generation.py --model shape:smollm2-135m --batches 16,64,256 --bf16 --repeats 3 \
        | tee "$out/generation_135m.jsonl"
}

update() {
    # one timed update of algorithm $1 at shape $2 with $3 episodes; further arguments go to the benchmark
    local algorithm=$1 shape=$2 episodes=$3
    shift 3
    python3 benchmarks/onpolicy_throughput.py --algorithm "$algorithm" --model "shape:$shape" --batch "$episodes" \
        --micro-batch 16 --generation-batch 128 --query-length 512 --bf16 --updates 1 --warmup 1 "$@" \
        | tee -a "$out/updates.jsonl"
}

# compare_trl.py's settings: bf16 on both sides, the seeds' lengths (562-token SFT rows, 638-token pairs, 400-token
# prompts, 53-token responses, G = 4, K = 4) at GPU batch sizes; 3 timed steps after 1 warm-up, one run per side,
# so that both shapes' 22 child processes (each loads torch, TRL and the weights anew) fit one command
COMPARE_GPU=(--device cuda --bf16 --steps 3 --warmup 1 --repeats 1 --threads 8 --sft-rows 16 --pairs 8
    --episodes 64 --micro-batch 16)
# compare_trl's own smoke-test shapes (tests/benchmarks/test_compare_trl.py), on the CPU, its default device
COMPARE_CPU=(--bf16 --steps 1 --warmup 1 --repeats 1 --threads 1 --sft-rows 2 --sft-length 40 --pairs 1
    --pair-length 40 --response-length 8 --episodes 4 --group 2 --micro-batch 2 --query-length 24 --update-epochs 2)

compare_trl() {
    # ours beside TRL for every trainer TRL has, on model $2 of shape $1; further arguments go to compare_trl.py
    local shape=$1 model=$2
    shift 2
    python3 benchmarks/compare_trl.py --trainers sft,rm,dpo,grpo,rloo --model "$model" "$@" \
        | tag compare shape="$shape" | tee -a "$out/compare.jsonl"
}

compare() {
    if [ -n "${COMPARE_TINY:-}" ]; then
        compare_trl tiny tiny "${COMPARE_CPU[@]}"
        return
    fi
    local shapes=("$@") shape model status=0
    [ ${#shapes[@]} -gt 0 ] || shapes=(smollm2-135m llama-3.2-1b)
    for shape in "${shapes[@]}"; do
        # random weights in the shipped shape, with SmolLM2's tokenizer (random_model.py --shape says why)
        model=/tmp/random-$shape
        python3 benchmarks/random_model.py --like .gpu/smollm2-135m --shape "$shape" --out "$model" \
            | tag compare shape="$shape" | tee -a "$out/compare.jsonl"
        compare_trl "$shape" "$model" "${COMPARE_GPU[@]}" || status=$?
    done
    return $status
}

record() {
    # a step of `real`: its JSON lines on stdin, tagged, into real.jsonl; arguments are key=value fields
    tag real "$@" | tee -a "$out/real.jsonl"
}

elapsed() {
    python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$1"
}

# the recipe's trainer options and the quick start's stage options: bf16 autocast (the recipe's YAML says fp32, for
# the CPU) and CUDA-graph decoding, as a GPU user runs them; eval commands decode as `auto` does, on CUDA graphs
RECIPE_GPU=(mixed_precision=bf16 decoding=cuda-graphs)
QUICKSTART_GPU=("sft={mixed_precision: bf16}" "rm={mixed_precision: bf16}"
    "ppo={mixed_precision: bf16, decoding: cuda-graphs}")
# the tiny forms: one update or step per trainer on a few rows, short answers, the rest as on the GPU (a CPU computes
# bf16 slowly, so its precision stays `auto`: fp32; cuda-graphs falls back to eager steps with the reason logged)
RECIPE_TINY=(decoding=cuda-graphs max_steps=1 total_batch_size=16 generation_batch_size=16 micro_batch_size=8
    forward_batch_size=16 max_response_length=16)
QUICKSTART_TINY=("sft={max_steps: 1, total_batch_size: 2, micro_batch_size: 2, validation_posts: 8}"
    "rm={max_steps: 1, total_batch_size: 2, micro_batch_size: 2, max_pairs: 16, validation_fraction: 0.01,
    eval_pairs: 4, normalization_samples: 4}"
    "ppo={max_steps: 1, total_batch_size: 2, micro_batch_size: 2, generation_batch_size: 2, forward_batch_size: 2,
    validation_posts: 8, eval_samples: 2, max_response_length: 8, decoding: cuda-graphs}" eval_posts=2)

command_line_tools() {
    # run.sh calls `rlhfkit` and `python`: where rlhfkit is not installed (the GPU image), the module stands in
    command -v rlhfkit > /dev/null && command -v python > /dev/null && return
    mkdir -p "$scratch/bin"
    printf '#!/bin/sh\nexec python3 -m rlhfkit.cli "$@"\n' > "$scratch/bin/rlhfkit"
    chmod +x "$scratch/bin/rlhfkit"
    command -v python > /dev/null || ln -sf "$(command -v python3)" "$scratch/bin/python"
    export PATH=$scratch/bin:$PATH
}

real_prepare() {
    # the user's first command; the line names the GGUF it read (the joined one) and the folder it wrote
    local began=$EPOCHREALTIME status=0 seconds paths="{}"
    python3 -m rlhfkit.cli models prepare smollm2-135m > "$out/prepare.log" 2>&1 || status=$?
    seconds=$(elapsed "$began")
    [ $status -eq 0 ] && paths=$(python3 -c "import json; from rlhfkit.models import gguf_location, embedded_dir
print(json.dumps({'gguf': str(gguf_location('smollm2-135m')), 'model': str(embedded_dir('smollm2-135m'))}))")
    echo "$paths" | record step=prepare seconds="$seconds" exit=$status
    return $status
}

real_recipe() {
    # recipes/arithmetic-grpo/run.sh full (REAL_TINY: short, cut to one update); its numbers beside the CPU's
    local variant=full options=("${RECIPE_GPU[@]}") root=$scratch/arithmetic-grpo began status=0 ran_through=0
    if [ -n "${REAL_TINY:-}" ]; then
        variant=short
        options=("${RECIPE_TINY[@]}")
    fi
    rm -rf "$root"
    began=$EPOCHREALTIME
    ROOT=$root recipes/arithmetic-grpo/run.sh "$variant" "${options[@]}" > "$out/recipe.log" 2>&1 || status=$?
    # exits 1 when a number is missing (the recipe did not run through); numbers out of the CPU's bands are reported
    python3 benchmarks/recipe_summary.py recipes/arithmetic-grpo --variant "$variant" --root "$root" \
        --seconds "$(elapsed "$began")" --exit $status | record step=recipe || ran_through=$?
    rm -rf "$root"  # checkpoints of gigabytes: only the summary comes back
    return $ran_through
}

real_quickstart() {
    # the README's quick start, `rlhfkit pipeline --preset quickstart`, with its own judge cache (a cached verdict
    # would skip the judge's work) and, where ../shared did not travel, the carried copy of its data
    local run=$scratch/quickstart options=("${QUICKSTART_GPU[@]}") began status=0
    [ -n "${REAL_TINY:-}" ] && options=("${QUICKSTART_TINY[@]}")
    [ -d ../shared/data ] || options+=(sft_data=.gpu/data/tldr_sft_sample.jsonl.gz
        comparisons=.gpu/data/batch13.jsonl.gz,.gpu/data/batch18.jsonl.gz)
    rm -rf "$run" "$scratch/judge-cache"
    began=$EPOCHREALTIME
    python3 -m rlhfkit.cli pipeline --preset quickstart output_dir="$run" "eval={cache_dir: $scratch/judge-cache}" \
        "${options[@]}" > "$out/quickstart.log" 2>&1 || status=$?
    echo "{\"seconds\": $(elapsed "$began"), \"exit\": $status}" | record step=quickstart
    # each stage's seconds, step times and headline numbers (ROUGE-L, RM score, KL, judge win rates)
    [ -f "$run/pipeline.json" ] && python3 benchmarks/pipeline_summary.py "$run" | record step=quickstart
    rm -rf "$run"
    return $status
}

real() {
    local runs=("$@") run status=0
    [ ${#runs[@]} -gt 0 ] || runs=(recipe quickstart)
    [ -n "${REAL_TINY:-}" ] && split_gguf | record
    receive real --require-all | tee -a "$out/real.jsonl"
    # the joined GGUF is the package `models prepare` reads; the converted model is kept beside it between calls
    export PYTHONPATH=$gguf_store/site:$PYTHONPATH RLHFKIT_CACHE=$gguf_store/cache
    command_line_tools
    real_prepare
    for run in "${runs[@]}"; do
        "real_$run" || status=$?
    done
    return $status
}

case "$part" in
stages)
    stages
    ;;
quick)
    # the stages, then the 135M shape alone for generation (every side), one PPO update, and one GRPO
    # update with each group's query read once (shared rows) and without
    status=0
    stages || status=$?
    generation_135m || status=$?
    update ppo smollm2-135m 64 || status=$?
    for shared in auto off; do
        update grpo smollm2-135m 64 --shared-prefix "$shared" || status=$?
    done
    exit $status
    ;;
generation)
    # the 1B shapes at batch 64, ours beside eager generate
    generation_135m
    for shape in pythia-1b-deduped llama-3.2-1b; do
        python3 benchmarks/generation.py --model "shape:$shape" --batches 64 --bf16 --repeats 2 \
            --sides ours-eager,ours-graphs,hf-eager,hf-static | tee "$out/generation_$shape.jsonl"
    done
    ;;
updates)
    for shape in smollm2-135m pythia-1b-deduped llama-3.2-1b; do
        for episodes in 64 512; do
            update ppo "$shape" "$episodes"
            for shared in auto off; do
                update grpo "$shape" "$episodes" --shared-prefix "$shared"
            done
        done
    done
    ;;
compare)
    compare "$@"
    ;;
real)
    real "$@"
    ;;
*)
    echo "unknown part $part: $parts" >&2
    exit 2
    ;;
esac
