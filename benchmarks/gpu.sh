#!/usr/bin/env bash
# The prepared GPU check: caprecon against raw diffusers at generator batch 1, 8 and 32, VQAScore
# batched against a per-sample loop, and peak GPU memory, on the tiny models built here (or real
# ones: --sd PATH, --vlm PATH), offline, in under five minutes. `--device cpu` checks the script
# on a machine without a GPU (use small sizes: --images 8 --side 64 --steps 1).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
HF_HUB_OFFLINE=1 exec timeout 300 "$python" benchmarks/gpu.py "$@"
