#!/usr/bin/env bash
# The one command to run on a CUDA machine: FlashCUR vs CUR, the meta-device check, compiled vs eager training
# (model.compile=true), lra.bench attention/train, a few hundred trainer=gpu steps of every variant; writes
# outputs/gpu_check/<timestamp>/report.md. Arguments pass through
# (python -m lra.bench.gpu_check --help; --dry-run prints the plan without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m lra.bench.gpu_check "$@"
