#!/usr/bin/env bash
# Pathfinder32 end to end: generate COUNT images (DIFFICULTY, default contour length 6 = curv_baseline, the
# easiest), print how far the marker-distance shortcut alone gets (python -m lra.analysis.pathfinder_cue), train the
# 2-layer ATTENTION encoder through python -m lra.train for at most MAX_STEPS steps or MAX_TIME, print its accuracy.
# Departures from the recipe of docs/design.md §3, for a small budget: no dropout, batch BATCH=32, lr 1e-3 (the recipe's 1e-4 is tuned for 62400
# steps at batch 256), gradient clipping 1.0, bf16 autocast. Measured on 2 CPU cores: generation ~100 images/s,
# training ~0.75 s/step, and 4,520 steps stayed at chance (docs/pathfinder.md): train on a GPU.
#   OUT=/tmp/pf TRAINER=gpu WORKERS=16 COUNT=200000 BATCH=256 MAX_STEPS=20000 MAX_TIME=00:03:00:00 scripts/pathfinder_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-outputs/pathfinder_smoke}
COUNT=${COUNT:-60000}
WORKERS=${WORKERS:-2}
MAX_STEPS=${MAX_STEPS:-7000}
MAX_TIME=${MAX_TIME:-00:01:35:00}
EVAL_EVERY=${EVAL_EVERY:-1000}
BATCH=${BATCH:-32}
TRAINER=${TRAINER:-cpu}
PRECISION=${PRECISION:-bf16-mixed}
ATTENTION=${ATTENTION:-softmax}
ATTENTION_ARGS=${ATTENTION_ARGS-attention.dropout=0}   # overrides for the variant, space-separated; ATTENTION_ARGS= for none
DIFFICULTY=${DIFFICULTY:-6}         # contour length: 6 (curv_baseline), 9 or 14 (LRA's)
case "$DIFFICULTY" in 6) LEVEL=curv_baseline ;; *) LEVEL=curv_contour_length_$DIFFICULTY ;; esac
DATA="$OUT/data/pathfinder32/$LEVEL"

if ! compgen -G "$DATA/metadata/*.npy" > /dev/null; then
  "$PYTHON" -m lra.tasks.pathfinder generate --out "$DATA" --resolution 32 --difficulty "$DIFFICULTY" \
    --count "$COUNT" --seed 1 --workers "$WORKERS"
fi
"$PYTHON" -m lra.analysis.pathfinder_cue "$DATA"
start=$(date +%s)
"$PYTHON" -m lra.train task=pathfinder "attention=$ATTENTION" "trainer=$TRAINER" "trainer.precision=$PRECISION" \
  "task.data_dir=$DATA" "paths.cache_dir=$OUT/cache" model.dropout=0 $ATTENTION_ARGS \
  "task.batch_size=$BATCH" task.warmup_steps=300 "task.eval_every=$EVAL_EVERY" "trainer.max_steps=$MAX_STEPS" \
  "+trainer.max_time=$MAX_TIME" trainer.gradient_clip_val=1.0 optimizer.lr=1e-3 logger=csv "hydra.run.dir=$OUT/run"
echo "training took $(( $(date +%s) - start )) s"
"$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1])); print('best val acc', r['val_acc_best'], 'test acc', r['test_acc'], 'steps', r['steps'])" "$OUT/run/results.json"
