#!/usr/bin/env bash
# The CUDA-graph decoding GPU measurements (docs/performance.md, "On a CUDA GPU"), sized for the device tool's lent
# H100: each part fits one 10-minute command and writes its JSON lines to $OUT.
#
#   here, once:   bash benchmarks/gpu_suite.sh wheels     # what the GPU image lacks: .whl/ and .gpu/
#   there:        bash benchmarks/gpu_suite.sh stages     # every stage end to end: bf16, CUDA-graph decoding
#                 bash benchmarks/gpu_suite.sh generation # generation beside transformers generate
#                 bash benchmarks/gpu_suite.sh updates    # one PPO and two GRPO updates (shared rows on, off) per shape
#                 bash benchmarks/gpu_suite.sh quick      # stages, then the 135M shape's generation and updates
#
# Each call there carries .whl and .gpu (device tool: carry [".whl", ".gpu"]). The GPU image has torch,
# transformers, accelerate and peft; rlhfkit also imports rouge-score (with nltk), platformdirs and this
# repository's transformers version, which travel as wheels. The embedded SmolLM2 weights cannot travel
# (538 MB), so .gpu/ holds their config and tokenizer, from which `stages` builds random weights of the
# same shape, and the TL;DR samples of ../shared/data that the stages read (../shared does not travel).
# STAGES_TINY=1 runs `stages` on a 2-layer model of the same tokenizer: a CPU check of the commands.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"wheels, stages, generation, updates or quick"}
out=${OUT:-runs/gpu_suite}
mkdir -p "$out"

if [ "$part" = wheels ]; then
    grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude
    # all pure Python (rouge-score exists only as a source archive, built here)
    python3 -m pip wheel -q --no-deps -w .whl transformers==5.24.0 rouge-score==0.1.2 nltk==3.10.4 platformdirs==4.14.7 defusedxml==0.7.1 typer==0.24.1
    grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
    embedded=$(python3 -c "from rlhfkit.models import embedded_dir; print(embedded_dir('smollm2-135m'))")
    mkdir -p .gpu/smollm2-135m .gpu/data
    cp "$embedded"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .gpu/smollm2-135m/
    cp ../shared/data/tldr-sft-sample/tldr_sft_sample.jsonl.gz ../shared/data/summarize-from-feedback-comparisons/batch13.jsonl.gz .gpu/data/
    exit 0
fi

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi: $(uname -m) CPU"; } | tee "$out/gpu.txt"

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
*)
    echo "unknown part $part: wheels, stages, generation, updates or quick" >&2
    exit 2
    ;;
esac
