#!/usr/bin/env bash
# The recipe's exact commands (recipes/arithmetic-grpo/README.md): the task, GRPO and RLOO from the embedded
# SmolLM2-135M-Instruct, the held-out evaluation of both beside the base model, the base model's pass@4, the
# curves, and the check of every number against expected.json.
# Usage: recipes/arithmetic-grpo/run.sh [full|short]   (full: about 65 minutes on a 2-core CPU; short: about 9)
# Run it from the repository root with ../shared beside it; ROOT=<folder> writes elsewhere.
set -euo pipefail
VARIANT=${1:-full}
RECIPE=recipes/arithmetic-grpo
ROOT=${ROOT:-runs/arithmetic-grpo-$VARIANT}
case "$VARIANT" in
  full) STEPS=30; PROBLEMS=524; ANSWER_TOKENS=96; PASS_K_PROBLEMS=256; SIZE=() ;;
  # the full run's first 5 updates (10 optimizer steps); base and GRPO on the first 64 held-out problems
  short) STEPS=5; PROBLEMS=64; ANSWER_TOKENS=64; PASS_K_PROBLEMS=0; SIZE=() ;;
  *) echo "usage: $0 [full|short]" >&2; exit 2 ;;
esac
shift || true
OPTIONS=("$@")  # key=value after the variant go to the trainers (learning_rate=0 switches learning off)

rlhfkit data make-task task=mul digits=2 seed=0 held_out_percent=75 train_problems=196 test_problems=524 \
  out="$ROOT/data" overwrite=true
rlhfkit grpo --config "$RECIPE/grpo.yaml" data="$ROOT/data/train.jsonl" max_steps=$STEPS output_dir="$ROOT/grpo" \
  ${SIZE[@]+"${SIZE[@]}"} ${OPTIONS[@]+"${OPTIONS[@]}"}
[ "$VARIANT" = short ] || rlhfkit rloo --config "$RECIPE/rloo.yaml" data="$ROOT/data/train.jsonl" max_steps=$STEPS \
  output_dir="$ROOT/rloo" ${OPTIONS[@]+"${OPTIONS[@]}"}
MODELS="base=smollm2-135m,grpo=$ROOT/grpo/model"
[ "$VARIANT" = short ] || MODELS="$MODELS,rloo=$ROOT/rloo/model"
# greedy answers of every model to the same held-out problems; the full recipe leaves room to spare (96 tokens, where
# training used 64) so that the base model's longer answers are not cut
rlhfkit eval gsm8k models="$MODELS" data="$ROOT/data/test.jsonl" max_prompts=$PROBLEMS \
  max_response_length=$ANSWER_TOKENS \
  generation_batch_size=64 out="$ROOT/eval"
if [ "$PASS_K_PROBLEMS" -gt 0 ]; then  # the base model's best of 4 at the training temperature
  rlhfkit eval gsm8k models=base=smollm2-135m data="$ROOT/data/test.jsonl" max_prompts=$PASS_K_PROBLEMS pass_k=4 \
    temperature=0.7 max_response_length=96 generation_batch_size=64 out="$ROOT/eval-base-pass-k"
  rlhfkit report runs="$ROOT/grpo,$ROOT/rloo" out="$ROOT/report"
  python "$RECIPE/curves.py" "$ROOT" "$ROOT/curves.png"  # the README's image (recipes/arithmetic-grpo/curves.png)
fi
rlhfkit recipe check expected="$RECIPE" variant="$VARIANT" root="$ROOT"
