#!/usr/bin/env bash
# GSM8K with the calculator (recipes/gsm8k-calculator/README.md): SFT of the embedded SmolLM2-135M-Instruct on
# GSM8K's annotated training solutions, so that it writes `<<48/2=`; GRPO from it with the calculator answering
# every call; then the base model, the SFT model without and with the calculator, and the GRPO model with it, on
# the same first test problems, greedy; then the check of every number against expected.json.
# Usage: recipes/gsm8k-calculator/run.sh [full] [key=value ...]
#   full: 200 SFT steps of 16 solutions, 16 GRPO updates of 4 problems x 8 answers, 300 test problems. There is no
#   short variant: 6 SFT steps teach no annotation (measured: none in 16 answers), so a short run would show nothing
#   of the calculator, whose mechanics the tests hold (tests/environments/test_environments.py).
#   key=value after the variant go to both trainers (learning_rate=0 switches learning off).
# Run it from the repository root with ../shared beside it; ROOT=<folder> writes elsewhere.
set -euo pipefail
VARIANT=${1:-full}
RECIPE=recipes/gsm8k-calculator
ROOT=${ROOT:-runs/gsm8k-calculator-$VARIANT}
TRAIN=../shared/data/gsm8k/train.jsonl.gz
TEST=../shared/data/gsm8k/test.jsonl.gz
case "$VARIANT" in
  full) SFT_STEPS=200; GRPO_STEPS=16; PROBLEMS=300 ;;
  *) echo "usage: $0 [full]" >&2; exit 2 ;;
esac
shift || true
OPTIONS=("$@")

# SFT on the solutions as they are written, annotations kept, the last line "The answer is N." (data_format=gsm8k)
rlhfkit sft model=smollm2-135m data=$TRAIN data_format=gsm8k max_query_length=320 max_response_length=256 \
  max_steps=$SFT_STEPS total_batch_size=16 micro_batch_size=4 learning_rate=2e-5 lr_scheduler=cosine validation_posts=64 eval_samples=0 \
  output_dir="$ROOT/sft" ${OPTIONS[@]+"${OPTIONS[@]}"}
rlhfkit grpo --config "$RECIPE/grpo.yaml" model="$ROOT/sft/model" data=$TRAIN max_steps=$GRPO_STEPS \
  output_dir="$ROOT/grpo" ${OPTIONS[@]+"${OPTIONS[@]}"}
MODELS="base=smollm2-135m,sft=$ROOT/sft/model,sft-calc=$ROOT/sft/model,grpo-calc=$ROOT/grpo/model"
ENVIRONMENTS="sft-calc=gsm8k-calculator,grpo-calc=gsm8k-calculator"
# every model on the same first test problems, greedy, 256 tokens (an episode's: the policy's and the calculator's)
# paired differences beside those from the base model: the calculator's on the SFT model, and RL's with the calculator
PAIRS="sft-calc:sft,grpo-calc:sft-calc"
rlhfkit eval gsm8k models="$MODELS" environments="$ENVIRONMENTS" pairs="$PAIRS" data=$TEST \
  max_prompts=$PROBLEMS max_response_length=256 generation_batch_size=32 out="$ROOT/eval"
rlhfkit recipe check expected="$RECIPE" variant="$VARIANT" root="$ROOT"
