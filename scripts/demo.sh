#!/usr/bin/env bash
# The main job: compile a bundled MLP, run it on the simulated chip, compare with onnxruntime, show its PE listing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p build
model=models/mlp_wide.onnx
echo "== compile $model"
neuronx-cc-lite compile "$model" -o build/mlp_wide.neff
echo "== run on the simulated trn1 and compare with onnxruntime"
neuronx-cc-lite check "$model"
echo "== the first lines of its PE (Tensor engine) listing"
neuronx-cc-lite disasm build/mlp_wide.neff --engine PE --no-data | grep -v '^;' | head -n 12 | cut -c1-220
