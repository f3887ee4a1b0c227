#!/usr/bin/env bash
# The recipe's exact commands (recipes/arithmetic-distill/README.md): the GRPO teacher of recipes/arithmetic-grpo
# (trained here, or reused with TEACHER=<its grpo/model folder>), then from the same base model: on-policy
# distillation with the reverse-KL advantage and with the JSD, SFT on the teacher's greedy answers (off-policy
# distillation); every model's greedy accuracy on the same held-out problems and on an addition task none trained on;
# the table; the check of every number against expected.json.
# Usage: recipes/arithmetic-distill/run.sh [full|short] [key=value ...]
#   full: about 105 minutes on a 2-core CPU with the teacher's training (27), 80 with TEACHER= given
#   short: about 9 minutes (a 3-update teacher, 4 distillation updates, 32 held-out problems)
# Run it from the repository root with ../shared beside it; ROOT=<folder> writes elsewhere. key=value options after
# the variant go to the distillation runs (learning_rate=0 switches learning off).
set -euo pipefail
VARIANT=${1:-full}
RECIPE=recipes/arithmetic-distill
ROOT=${ROOT:-runs/arithmetic-distill-$VARIANT}
case "$VARIANT" in
  full) TEACHER_STEPS=30; OPD_STEPS=14; PROBLEMS=524; ADD_PROBLEMS=200; ANSWER_TOKENS=96; EVERY_METHOD=1 ;;
  short) TEACHER_STEPS=3; OPD_STEPS=4; PROBLEMS=32; ADD_PROBLEMS=0; ANSWER_TOKENS=64; EVERY_METHOD=0 ;;
  *) echo "usage: $0 [full|short] [key=value ...]" >&2; exit 2 ;;
esac
shift || true
OPTIONS=("$@")
mkdir -p "$ROOT"
WALL="$ROOT/wall_seconds.tsv"  # each training's wall time, read by table.py
timed() { local name=$1 start; shift; start=$EPOCHREALTIME; "$@"; printf '%s\t%s\n' "$name" \
  "$(awk "BEGIN { print $EPOCHREALTIME - $start }")" >> "$WALL"; }
touch "$WALL"  # appended to: a rerun's time replaces an earlier one of the same name (table.py reads the last)

rlhfkit data make-task task=mul digits=2 seed=0 held_out_percent=75 train_problems=196 test_problems=524 \
  out="$ROOT/data" overwrite=true
TEACHER=${TEACHER:-}
if [ -z "$TEACHER" ]; then  # recipes/arithmetic-grpo's GRPO run, as its README gives it
  timed grpo rlhfkit grpo --config recipes/arithmetic-grpo/grpo.yaml data="$ROOT/data/train.jsonl" \
    max_steps=$TEACHER_STEPS output_dir="$ROOT/grpo" overwrite=true
  TEACHER="$ROOT/grpo/model"
fi
timed opd rlhfkit distill --config "$RECIPE/opd.yaml" teacher="$TEACHER" data="$ROOT/data/train.jsonl" \
  max_steps=$OPD_STEPS output_dir="$ROOT/opd" overwrite=true ${OPTIONS[@]+"${OPTIONS[@]}"}
MODELS="base=smollm2-135m,teacher=$TEACHER,opd=$ROOT/opd/model"
if [ "$EVERY_METHOD" = 1 ]; then
  timed opd-jsd rlhfkit distill --config "$RECIPE/opd.yaml" teacher="$TEACHER" data="$ROOT/data/train.jsonl" \
    distill_loss=jsd distill_beta=0.5 output_dir="$ROOT/opd-jsd" overwrite=true ${OPTIONS[@]+"${OPTIONS[@]}"}
  # off-policy distillation: the teacher's greedy answers to the training problems, then SFT on them
  timed teacher-answers rlhfkit eval gsm8k models=teacher="$TEACHER" data="$ROOT/data/train.jsonl" max_prompts=196 \
    max_response_length=$ANSWER_TOKENS generation_batch_size=64 out="$ROOT/teacher-answers" overwrite=true
  python "$RECIPE/teacher_answers.py" "$ROOT/teacher-answers/answers.jsonl" "$ROOT/data/train.jsonl" \
    "$ROOT/teacher-answers/sft.jsonl"
  timed sft rlhfkit sft --config "$RECIPE/sft.yaml" data="$ROOT/teacher-answers/sft.jsonl" output_dir="$ROOT/sft" \
    overwrite=true ${OPTIONS[@]+"${OPTIONS[@]}"}
  MODELS="$MODELS,opd-jsd=$ROOT/opd-jsd/model,sft=$ROOT/sft/model"
  # a point earlier on the JSD student's curve, timed on its own: its first 5 updates (the schedule is constant and
  # every sample's randomness is keyed by its update and row, so they are the 14-update run's first 5)
  timed opd-jsd-5 rlhfkit distill --config "$RECIPE/opd.yaml" teacher="$TEACHER" data="$ROOT/data/train.jsonl" \
    distill_loss=jsd distill_beta=0.5 max_steps=5 output_dir="$ROOT/opd-jsd-5" overwrite=true \
    ${OPTIONS[@]+"${OPTIONS[@]}"}
fi
# greedy answers of every model to the same held-out problems, each beside the base model's (paired)
rlhfkit eval gsm8k models="$MODELS" data="$ROOT/data/test.jsonl" max_prompts=$PROBLEMS \
  max_response_length=$ANSWER_TOKENS generation_batch_size=64 out="$ROOT/eval" overwrite=true
if [ "$EVERY_METHOD" = 1 ]; then  # the students part of the way: 5 and 7 updates (checkpoints of the runs above)
  rlhfkit eval gsm8k data="$ROOT/data/test.jsonl" max_prompts=$PROBLEMS max_response_length=$ANSWER_TOKENS \
    models="base=smollm2-135m,opd-7=$ROOT/opd/checkpoints/step-000007/model,opd-jsd-5=$ROOT/opd-jsd-5/model,opd-jsd-7=$ROOT/opd-jsd/checkpoints/step-000007/model" \
    generation_batch_size=64 out="$ROOT/eval-curve" overwrite=true
fi
if [ "$ADD_PROBLEMS" -gt 0 ]; then  # what each method forgets: 2-digit addition, which none trained on
  rlhfkit data make-task task=add digits=2 seed=0 held_out_percent=75 train_problems=100 test_problems=$ADD_PROBLEMS \
    out="$ROOT/add-data" overwrite=true
  rlhfkit eval gsm8k models="$MODELS" data="$ROOT/add-data/test.jsonl" max_prompts=$ADD_PROBLEMS \
    max_response_length=$ANSWER_TOKENS generation_batch_size=64 out="$ROOT/eval-add" overwrite=true
fi
python "$RECIPE/table.py" "$ROOT" | tee "$ROOT/table.md"
rlhfkit recipe check expected="$RECIPE" variant="$VARIANT" root="$ROOT"
