#!/usr/bin/env bash
# Issue 26's GPU measurements (docs/performance.md, "On a CUDA GPU"), sized for the device tool's lent
# H100: each part fits one 10-minute command and writes its JSON lines to $OUT.
#
#   here, once:   bash benchmarks/gpu_suite.sh wheels     # the packages the GPU image lacks, into .whl/
#   there:        bash benchmarks/gpu_suite.sh generation # generation beside transformers generate
#                 bash benchmarks/gpu_suite.sh updates    # one PPO and one GRPO update per shape
#
# The GPU image has torch, transformers, accelerate and peft; rlhfkit also imports rouge-score (with
# nltk), platformdirs and this repository's transformers version, which travel as wheels (carry .whl).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"wheels, generation or updates"}
out=${OUT:-runs/gpu_suite}
mkdir -p "$out"

if [ "$part" = wheels ]; then
    grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >> .git/info/exclude
    # all pure Python (rouge-score exists only as a source archive, built here)
    python3 -m pip wheel -q --no-deps -w .whl transformers==5.23.0 rouge-score==0.1.2 nltk==3.10.4 platformdirs==4.14.7 defusedxml==0.7.1 typer==0.24.1
    exit 0
fi

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

case "$part" in
generation)
    # the 135M shape at the issue's three batch sizes, every side; the 1B shapes at batch 64, ours beside eager generate
    python3 benchmarks/generation.py --model shape:smollm2-135m --batches 16,64,256 --bf16 --repeats 3 | tee "$out/generation_135m.jsonl"
    for shape in pythia-1b-deduped llama-3.2-1b; do
        python3 benchmarks/generation.py --model "shape:$shape" --batches 64 --bf16 --repeats 2 \
            --sides ours-eager,ours-graphs,hf-eager,hf-static | tee "$out/generation_$shape.jsonl"
    done
    ;;
updates)
    for shape in smollm2-135m pythia-1b-deduped llama-3.2-1b; do
        for algorithm in ppo grpo; do
            for episodes in 64 512; do
                python3 benchmarks/onpolicy_throughput.py --algorithm "$algorithm" --model "shape:$shape" --batch "$episodes" \
                    --micro-batch 16 --generation-batch 128 --query-length 512 --bf16 --updates 1 --warmup 1 | tee -a "$out/updates.jsonl"
            done
        done
    done
    ;;
*)
    echo "unknown part $part: wheels, generation or updates" >&2
    exit 2
    ;;
esac
