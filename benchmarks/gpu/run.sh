#!/usr/bin/env bash
# One GPU, under 8 minutes: both rollout engines (static, continuous) on the long-tailed workload,
# then a random-init Qwen2.5-0.5B (then 1.5B if time is left) at a paper-like batch, one sampler
# call and one learn step in bfloat16 on float32 master weights, model-FLOPs
# utilisation against the chip's bfloat16 peak, and XLA's predicted peak memory (the planner's
# measure, compiled for the GPU and for the CPU) against the device's measured peak. One JSON.
#
#   bash benchmarks/gpu/run.sh [OUT_JSON]        # default benchmarks/results/gpu_<device>.json
#
# Needs jax with CUDA, flax, optax. The model package also imports absl-py, chex, ml_collections and
# sentencepiece: they are installed from benchmarks/gpu/wheels/ when that folder exists
# (fill it on a connected machine: pip download -d benchmarks/gpu/wheels absl-py chex ml_collections sentencepiece).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -d benchmarks/gpu/wheels ]; then
  python -m pip install --no-index --find-links benchmarks/gpu/wheels absl-py chex ml_collections sentencepiece \
    >/dev/null
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # memory_stats then reports what the programs use
timeout 470 python benchmarks/gpu/gpu_bench.py --out "${1:-}" --budget_s 420
