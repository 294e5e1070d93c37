#!/usr/bin/env bash
# The GPU figures of the efficient-attention speed table, in two parts that each fit a short GPU loan:
# `scripts/gpu_perf.sh speed [OUT_DIR]` (the default, about 6 minutes on an H100/H200): steps 1-3 eager and the
# kernel profile (2b); `scripts/gpu_perf.sh compiled [OUT_DIR]` (about 10 more): step 3b, step 3 compiled, steps 4-5.
#   1. kernel launches per attention layer forward + backward (meta device, as the CUDA path runs), the launch plan
#      (lra.bench plan: grid, serial loop and dtypes of each kernel, to read beside the profile of 2b), the fused
#      pseudo-inverse against its PyTorch form (lra.bench pinv), and the fused forms' rows stage by FlashCUR's
#      kernel (a) against its split-K form (lra.bench rows: the choice attention.impl's Forms.rows made by prediction)
#   2. attention forward + backward, bf16, B 8, H 2, d 32, n 1024..16384 (CUR, FlashCUR, Nyström vs SDPA and the
#      materialised Transformer), then the CUR paper's Fig. 4 shapes: B 64, H 16, d 64, m 64, n 1024..4096
#      (steps 1-2 time medians of 7 calls after 2 warm-up calls: 10 after 3 before step 2b, whose time came from there)
#  2b. the kernels of one forward and one backward at n 4096 (B 8, H 2, d 32) of SDPA softmax, CUR, FlashCUR and
#      Nyström: CUDA ms, launches and grid (programs) per kernel (lra.bench profile --device cuda), each phase with
#      what the model of lra.bench plan --predict says on this GPU (h100, h200 or a100 by its name): measured /
#      predicted per Triton kernel (same name in both), for ATen's kernels together, and for the phase
#      (lra/bench/calibrate.py); then the whole plan --predict table (it AOT-compiles the Triton kernels for the
#      occupancy, a minute or two of CPU, hence its doubled timeout)
#   3. training samples/s and peak memory, bf16, Text n 4096 and ListOps n 2000, batch 32, in the CUR paper's
#      Table 2 format (vs the materialised "Transformer" and vs SDPA "FlashAttention"), eager, then compiled
#   3b. (compiled part, first) Proxyformer's Table 2: 6 encoder layers, inference memory per sequence and throughput
#      at n 2048 / 4096, every row at that table's settings, x the materialised Transformer (lra.bench train --inference)
#   4. model.compile=true trainer=gpu: a few compiled training steps of every variant through lra.train
#   5. python -m lra.bench.gpu_check --only kernels meta (FlashCUR/FlashL1 vs references, host-sync check)
# Each step runs under `timeout`; a step that fails or times out is reported and the next one runs. Everything
# goes to outputs/gpu_perf/<timestamp>/ (CSV, PNG, one log per step) and summary.md; the first line names the
# machine. GPU_PERF_SMOKE=1 runs the same steps at tiny sizes on the CPU (what tests/bench/test_gpu_perf_script.py
# runs), to check the script without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
PART="${1:-speed}"
[[ $PART == speed || $PART == compiled ]] || { echo "usage: scripts/gpu_perf.sh [speed|compiled] [OUT_DIR]" >&2; exit 2; }
OUT="${2:-outputs/gpu_perf/$(date -u +%Y%m%d-%H%M%S)-$PART}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"

if [[ "${GPU_PERF_SMOKE:-0}" == 1 ]]; then  # tiny shapes on the CPU: checks the commands, measures nothing
  DEVICE=(--device cpu --threads 1) ; DTYPE=fp32 ; N_ATTN=(64 128) ; N_FIG4=(64) ; FIG4=(--batch 2 --heads 2 --head-dim 16)
  TEXT=(--n 128 --batch 2) ; LISTOPS=(--n 128 --batch 2) ; STEPS=(--steps 1 --warmup 0) ; REPEATS=(--warmup 0 --repeats 1)
  PROFILE=(--n 64 --batch 2 --heads 2 --head-dim 16 --warmup 0 --repeats 1) ; TABLE2=(--n 128 --batch 2)
  TRAIN_STEPS=2 ; TASK=listops_small ; T=${GPU_PERF_STEP_TIMEOUT:-600} ; ONLY_CHECK=()
  ROWS=(--n 64 97 --batch 2 --heads 2 --head-dim 16 --landmarks 16)
else
  DEVICE=(--device cuda) ; DTYPE=bf16 ; N_ATTN=(1024 4096 16384) ; N_FIG4=(1024 2048 4096) ; FIG4=(--batch 64 --heads 16 --head-dim 64)
  TEXT=(--n 4096 --batch 32) ; LISTOPS=(--n 2000 --batch 32) ; STEPS=(--steps 10 --warmup 3) ; REPEATS=(--warmup 2 --repeats 7)
  PROFILE=(--n 4096 --batch 8 --heads 2 --head-dim 32 --warmup 2 --repeats 3) ; TABLE2=(--n 2048 4096 --batch 32)
  TRAIN_STEPS=20 ; TASK=listops_small ; T=${GPU_PERF_STEP_TIMEOUT:-150} ; ONLY_CHECK=(--only kernels meta)
  ROWS=(--n 1024 4096 16384 --batch 8 --heads 2 --head-dim 32 --landmarks 64)
fi
VARIANTS=(curformer flashcur nystromformer)
FAILED=0

machine=$("$PYTHON" -c "from lra.bench import common; import torch; d = common.resolve_device('${DEVICE[1]}'); print(common.machine_line(common.machine(d)))" 2>&1)
{ echo "# GPU speed table, $PART ($(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"; echo; echo "machine: $machine"; echo; } > "$SUMMARY"
echo "[gpu_perf] $machine -> $OUT"

step() {  # step NAME SECONDS COMMAND...: run under timeout, log to $OUT/NAME.log, record the outcome
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "[gpu_perf] $name (timeout ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local outcome="ok"; [[ $rc -eq 124 || $rc -eq 137 ]] && outcome="timed out after ${limit}s"; [[ $rc -ne 0 && $outcome == ok ]] && outcome="failed (exit $rc)"
  [[ $outcome != ok ]] && FAILED=1
  { echo "## $name: $outcome, $((SECONDS - start)) s"; echo; echo '```'; tail -n 40 "$OUT/$name.log"; echo '```'; echo; } >> "$SUMMARY"
  echo "[gpu_perf] $name: $outcome ($((SECONDS - start)) s)"
}

if [[ $PART == speed ]]; then
  step launches "$T" "$PYTHON" -m lra.bench launches --out "$OUT/launches"
  step plan "$T" "$PYTHON" -m lra.bench plan --out "$OUT/plan"
  step pinv "$T" "$PYTHON" -m lra.bench pinv "${DEVICE[@]}" --m 32 64 --problems 16 256 1024 "${REPEATS[@]}" --out "$OUT/pinv"
  step rows "$T" "$PYTHON" -m lra.bench rows "${DEVICE[@]}" --dtype "$DTYPE" "${ROWS[@]}" "${REPEATS[@]}" --out "$OUT/rows"
  step attention "$T" "$PYTHON" -m lra.bench attention "${DEVICE[@]}" --dtype "$DTYPE" --n "${N_ATTN[@]}" --batch 8 --heads 2 \
    --head-dim 32 "${REPEATS[@]}" --variants "${VARIANTS[@]}" --variant-overrides --out "$OUT/attention"
  step attention_fig4 "$T" "$PYTHON" -m lra.bench attention "${DEVICE[@]}" --dtype "$DTYPE" --n "${N_FIG4[@]}" "${FIG4[@]}" \
    "${REPEATS[@]}" --variants curformer flashcur --variant-overrides --out "$OUT/attention_fig4"
  gpu_kind=$(echo "${machine#*GPU }" | grep -oiE 'H100|H200|A100' | head -1 | tr 'A-Z' 'a-z')
  PREDICT=()  # the profile's kernels beside the time model's (lra/bench/calibrate.py); not in the smoke run (no GPU)
  [[ -n $gpu_kind && "${GPU_PERF_SMOKE:-0}" != 1 ]] && PREDICT=(--predict "$gpu_kind")
  step profile "$T" "$PYTHON" -m lra.bench profile "${DEVICE[@]}" --dtype "$DTYPE" --variant "${VARIANTS[@]}" --softmax \
    "${PROFILE[@]}" --top 12 "${PREDICT[@]}"
  if [[ "${GPU_PERF_SMOKE:-0}" != 1 ]]; then  # no GPU in the smoke run; the AOT compiles of --predict take minutes
    [[ -n $gpu_kind ]] && step predict "$((2 * T))" "$PYTHON" -m lra.bench plan --predict "$gpu_kind" --n 4096 --batches 8 \
      --variants "${VARIANTS[@]}" --out "$OUT/predict"
  fi
  step train_text "$T" "$PYTHON" -m lra.bench train "${DEVICE[@]}" --dtype "$DTYPE" --task text "${TEXT[@]}" "${STEPS[@]}" \
    --variants "${VARIANTS[@]}" --variant-overrides --out "$OUT/train_text"
  step train_listops "$T" "$PYTHON" -m lra.bench train "${DEVICE[@]}" --dtype "$DTYPE" --task listops "${LISTOPS[@]}" "${STEPS[@]}" \
    --variants "${VARIANTS[@]}" --variant-overrides --out "$OUT/train_listops"
else
  # Proxyformer's Table 2 (6 layers, inference memory per sequence and throughput, x the materialised Transformer),
  # every row at that table's settings; float32, as the Nyströmformer LRA code behind the table runs its attention
  step table2_inference "$((4 * T))" "$PYTHON" -m lra.bench train --inference "${DEVICE[@]}" --dtype fp32 --task text \
    "${TABLE2[@]}" "${STEPS[@]}" --experiment proxyformer_table1 \
    --variant-overrides nystromformer:num_landmarks=128,conv_kernel_size=null --out "$OUT/table2_inference"
  step train_text_compiled "$T" "$PYTHON" -m lra.bench train "${DEVICE[@]}" --dtype "$DTYPE" --task text "${TEXT[@]}" \
    "${STEPS[@]}" --variants curformer flashcur --variant-overrides --compile --out "$OUT/train_text_compiled"
  for variant in $("$PYTHON" -c "from lra.bench import common; print(' '.join(common.discover_variants()))"); do
    if [[ "${GPU_PERF_SMOKE:-0}" == 1 ]]; then trainer=(trainer=cpu trainer.precision=bf16-mixed); else trainer=(trainer=gpu); fi
    [[ "${GPU_PERF_SMOKE:-0}" == 1 && $variant == flashcur ]] && continue  # FlashCUR needs CUDA (or the slow interpreter)
    step "compiled_train_$variant" "$T" "$PYTHON" -m lra.train task="$TASK" attention="$variant" "${trainer[@]}" \
      model.compile=true trainer.max_steps="$TRAIN_STEPS" task.eval_every="$TRAIN_STEPS" logger=csv \
      hydra.run.dir="$OUT/compiled_train/$variant"
  done
  if [[ "${GPU_PERF_SMOKE:-0}" != 1 ]]; then
    step gpu_check "$T" "$PYTHON" -m lra.bench.gpu_check "${ONLY_CHECK[@]}" --out "$OUT/gpu_check"
  fi
fi
echo "[gpu_perf] summary: $SUMMARY"
exit $FAILED
