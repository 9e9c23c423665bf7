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
echo "== the first instructions of its PE (Tensor engine) listing"
# Into a file first: a reader that stops early (head) would end the lister with SIGPIPE, which pipefail reports.
neuronx-cc-lite disasm build/mlp_wide.neff --engine PE --no-data > build/mlp_wide.s
grep -m 12 -E '^ +[0-9]+ ' build/mlp_wide.s | cut -c1-220
