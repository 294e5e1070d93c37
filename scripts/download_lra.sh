#!/usr/bin/env bash
# Fetch and unpack the LRA data under data/ (see data/README.md): a thin wrapper over `python -m lra.data download`.
#   scripts/download_lra.sh                     # lra_release + imdb + cifar10
#   scripts/download_lra.sh imdb cifar10        # only these
#   scripts/download_lra.sh --tfds imdb_reviews cifar10   # TFDS instead (pip install -r requirements-data.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" -m lra.data download "$@"
