"""Benchmarks and the GPU check: ``python -m lra.bench attention`` (latency / FLOPs / memory of every attention variant vs n)
and ``python -m lra.bench train`` (training and inference throughput and peak memory of each variant's real
model, as ratios to the softmax Transformer), ``python -m lra.bench.gpu_check`` (every kernel and variant on a
CUDA device against its reference). See docs/bench.md."""
