#!/usr/bin/env bash
# How the task was chosen: the embedded SmolLM2-135M-Instruct's greedy accuracy on 64 held-out problems of each
# candidate task (PASS_K=4 adds sampled accuracy and pass@4, four times the generation). A task whose base rate lies between about 10% and 60%
# gives a group of samples both right and wrong answers, which is what GRPO's advantages need.
# Usage: recipes/arithmetic-grpo/screen.sh [OUT] [CANDIDATES...]   (about 2 minutes a candidate on a 2-core CPU)
set -euo pipefail
OUT=${1:-runs/arithmetic-screen}
shift || true
CANDIDATES=("$@")
[ ${#CANDIDATES[@]} -gt 0 ] || CANDIDATES=("add 2" "add 3" "add 4" "sub 3" "mul 2" "mul 3" "add-mul 2")
for candidate in "${CANDIDATES[@]}"; do
  set -- $candidate
  name="$1-$2d"
  rlhfkit data make-task task="$1" digits="$2" train_problems=10 test_problems=100 out="$OUT/data/$name" overwrite=true
  rlhfkit eval gsm8k models=base=smollm2-135m data="$OUT/data/$name/test.jsonl" max_prompts=64 pass_k="${PASS_K:-0}" \
    temperature=0.7 max_response_length=96 out="$OUT/$name" > "$OUT/$name.log"
  python - "$OUT/$name/accuracy.json" "$name" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))["tables"]["all"][0]
keys = ("greedy_accuracy", "sampled_accuracy", "pass@4", "format_share", "length", "eos_rate")
print(json.dumps({"task": sys.argv[2], **{k: round(row[k], 3) for k in keys if k in row}}))
PY
done
