#!/usr/bin/env bash
# One ListOps run of the deep recipe (experiment=listops_deep) that fits a short GPU loan:
#   scripts/listops_gpu.sh ATTENTION [MINUTES]      (MINUTES of training, default 11)
# 1. generates full ListOps with its 20,000-example independent test into data/listops_full if absent (seed 0, the
#    data of docs/results.md; about 2 minutes);
# 2. measures the recipe's training speed here: PROBE_STEPS (40) steps on 2,000 generated full-length examples (a probe run in a
#    scratch dir, evaluation excluded);
# 3. trains experiment=listops_deep for the steps that fit MINUTES at that speed (90 % of it: evaluations take the
#    rest), warmup 5 % of them (the recipe's ratio), 8 evaluations (one, at the end, below 80 steps), then tests the
#    best checkpoint on the test and the independent test;
# 4. copies results.json, predictions.json and the best checkpoint to docs/runs/listops_deep_<attention>_<steps>_<device>_s<seed>/,
#    where lra.analysis.report docs/runs reads them.
# On a machine without CUDA it trains on the CPU (trainer=cpu): a smoke test of the same steps. Environment: DATA_DIR
# (default data/listops_full), SEED (0), PROBE_STEPS (40), PYTHON, EXTRA (more Hydra overrides, e.g.
# "task.datamodule.num_workers=8").
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: scripts/listops_gpu.sh ATTENTION [MINUTES]" >&2; exit 2; }
ATTENTION=$1
MINUTES=${2:-11}
PYTHON="${PYTHON:-python}"
DATA_DIR="${DATA_DIR:-data/listops_full}"
SEED="${SEED:-0}"
PROBE_STEPS="${PROBE_STEPS:-40}"
read -r -a EXTRA <<< "${EXTRA:-}"
[[ -f configs/attention/$ATTENTION.yaml ]] || { echo "no configs/attention/$ATTENTION.yaml: choose one of $(ls configs/attention | sed 's/.yaml//' | tr '\n' ' ')" >&2; exit 2; }
[[ $MINUTES =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "MINUTES must be a number, got '$MINUTES'" >&2; exit 2; }
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  TRAINER=gpu; DEVICE=gpu; WORKERS=(task.datamodule.num_workers=8)
else
  TRAINER=cpu; DEVICE=cpu; WORKERS=()
fi
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

if [[ ! -f $DATA_DIR/basic_independent_test.tsv ]]; then
  echo "[listops_gpu] generating full ListOps into $DATA_DIR (seed 0, with the independent test)"
  "$PYTHON" -m lra.tasks.listops generate --out "$DATA_DIR" --seed 0
fi

echo "[listops_gpu] measuring experiment=listops_deep attention=$ATTENTION on $DEVICE ($PROBE_STEPS steps)"
"$PYTHON" -m lra.tasks.listops generate --out "$SCRATCH/probe_data" --train 2000 --val 64 --test 64 \
  --independent-test 0 --seed 1 > "$SCRATCH/generate.log" 2>&1 || { cat "$SCRATCH/generate.log" >&2; exit 1; }
"$PYTHON" -m lra.train experiment=listops_deep attention="$ATTENTION" trainer="$TRAINER" seed="$SEED" \
  task.data_dir="$SCRATCH/probe_data" paths.cache_dir="$SCRATCH/cache" trainer.max_steps="$PROBE_STEPS" task.warmup_steps=1 \
  task.eval_every="$PROBE_STEPS" logger=none "${WORKERS[@]}" "${EXTRA[@]}" hydra.run.dir="$SCRATCH/probe" > "$SCRATCH/probe.log" 2>&1 \
  || { tail -n 20 "$SCRATCH/probe.log" >&2; echo "[listops_gpu] the probe run failed (log above)" >&2; exit 1; }
read -r STEPS WARMUP EVAL SPS < <("$PYTHON" - "$SCRATCH/probe/results.json" "$MINUTES" <<'EOF'
import json, sys
record = json.load(open(sys.argv[1]))
samples_per_s, seconds = record["samples_per_s"], float(sys.argv[2]) * 60 * 0.9
steps = max(10, int(seconds * samples_per_s / 64))  # batch 64: configs/experiment/listops_deep.yaml
evaluate_every = steps // 8 if steps >= 80 else steps  # 8 evaluations; a run this short only at its end
print(steps, max(1, steps // 20), evaluate_every, f"{samples_per_s:.1f}")
EOF
)
echo "[listops_gpu] $SPS samples/s: $STEPS steps (warmup $WARMUP, evaluated every $EVAL) fit $MINUTES min"

NAME="listops_deep_${ATTENTION}_${STEPS}_${DEVICE}_s${SEED}"
RUN="outputs/listops_gpu/$(date -u +%Y%m%d-%H%M%S)_$NAME"
"$PYTHON" -m lra.train experiment=listops_deep attention="$ATTENTION" trainer="$TRAINER" seed="$SEED" \
  task.data_dir="$DATA_DIR" trainer.max_steps="$STEPS" task.warmup_steps="$WARMUP" task.eval_every="$EVAL" \
  logger=csv "${WORKERS[@]}" "${EXTRA[@]}" hydra.run.dir="$RUN"

DEST="docs/runs/$NAME"
mkdir -p "$DEST"
cp "$RUN/results.json" "$RUN/predictions.json" "$DEST/"
best=$("$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1])).get('best_checkpoint') or '')" "$RUN/results.json")
[[ -n $best && -f $best ]] && cp "$best" "$DEST/"
"$PYTHON" - "$DEST/results.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"[listops_gpu] test {r.get('test_acc')}, independent test {r.get('independent_test_acc')} "
      f"(cue {r.get('shortcut_independent_test_acc')}), {r.get('steps')} steps, {r.get('samples_per_s')} samples/s")
EOF
echo "[listops_gpu] record: $DEST (commit it with its machine line in docs/results.md)"
