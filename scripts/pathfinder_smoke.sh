#!/usr/bin/env bash
# Smoke check of the Pathfinder generator + reader + training CLI: generate COUNT Pathfinder32 images
# (DIFFICULTY, default the hardest: contour length 14), train the 2-layer ATTENTION (default softmax) encoder for at most MAX_STEPS steps
# or MAX_TIME wall-clock, and print the best validation accuracy (chance is 50%). lr is raised to 1e-3
# (DESIGN's 1e-4 is tuned for 62400 steps at batch 256). Generation runs at ~25 images/s per free core;
# training wants TRAINER=gpu: on a busy 2-core CPU one step of batch 64 x 1024 tokens took ~30 s.
#   OUT=/tmp/pf_smoke COUNT=6000 MAX_STEPS=3000 TRAINER=gpu scripts/pathfinder_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-outputs/pathfinder_smoke}
COUNT=${COUNT:-6000}
WORKERS=${WORKERS:-2}
MAX_STEPS=${MAX_STEPS:-3000}
MAX_TIME=${MAX_TIME:-00:00:10:00}
EVAL_EVERY=${EVAL_EVERY:-250}
TRAINER=${TRAINER:-cpu}
ATTENTION=${ATTENTION:-softmax}     # curformer trains ~6x faster on a CPU (softmax with dropout materialises n x n)
DIFFICULTY=${DIFFICULTY:-14}        # contour length: 6 (curv_baseline, easiest), 9 or 14 (LRA's hardest)
case "$DIFFICULTY" in 6) LEVEL=curv_baseline ;; *) LEVEL=curv_contour_length_$DIFFICULTY ;; esac
DATA="$OUT/data/pathfinder32/$LEVEL"

if ! compgen -G "$DATA/metadata/*.npy" > /dev/null; then
  "$PYTHON" -m lra.tasks.pathfinder generate --out "$DATA" --resolution 32 --difficulty "$DIFFICULTY" \
    --count "$COUNT" --seed 0 --workers "$WORKERS"
fi
start=$(date +%s)
"$PYTHON" -m lra.train task=pathfinder "attention=$ATTENTION" "trainer=$TRAINER" "task.data_dir=$DATA" "paths.cache_dir=$OUT/cache" \
  task.batch_size=64 task.warmup_steps=100 "task.eval_every=$EVAL_EVERY" "trainer.max_steps=$MAX_STEPS" \
  "+trainer.max_time=$MAX_TIME" optimizer.lr=1e-3 logger=csv "hydra.run.dir=$OUT/run"
echo "training took $(( $(date +%s) - start )) s"
"$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1])); print('best val acc', r['val_acc_best'], 'test acc', r['test_acc'])" "$OUT/run/results.json"
