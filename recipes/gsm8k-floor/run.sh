#!/usr/bin/env bash
# GSM8K, where SmolLM2-135M-Instruct is at the floor (recipes/gsm8k-floor/README.md).
# Usage: recipes/gsm8k-floor/run.sh [full|short]
#   full: GRPO with the gsm8k-grpo preset (about 80 minutes on a 2-core CPU), then base and GRPO on the first 320 test
#   problems, into runs/
#   short: the floor itself: the base model's greedy answers to the first 32 test problems (about 1 minute); no
#   training, so there is nothing for learning_rate=0 to switch off. ROOT=<folder> writes elsewhere.
# Run it from the repository root with ../shared beside it.
set -euo pipefail
VARIANT=${1:-full}
TEST=../shared/data/gsm8k/test.jsonl.gz
case "$VARIANT" in
full)
  ROOT=runs
  rlhfkit grpo --preset gsm8k-grpo data=../shared/data/gsm8k/train.jsonl.gz output_dir=runs/gsm8k-grpo
  rlhfkit eval gsm8k models=base=smollm2-135m,grpo=runs/gsm8k-grpo/model data=$TEST max_prompts=320 \
    max_response_length=200 out=runs/gsm8k-eval
  ;;
short)
  ROOT=${ROOT:-runs/gsm8k-floor-short}
  rlhfkit eval gsm8k models=base=smollm2-135m data=$TEST max_prompts=32 max_response_length=200 \
    generation_batch_size=32 out="$ROOT/gsm8k-eval"
  ;;
*) echo "usage: $0 [full|short]" >&2; exit 2 ;;
esac
rlhfkit recipe check expected=recipes/gsm8k-floor variant="$VARIANT" root="$ROOT"
