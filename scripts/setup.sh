#!/usr/bin/env bash
# Create .venv (once) and install the project with its test tools and optional extras (MPI ranks, the PyTorch
# front door) into it, so that the tests exercise them. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,mpi,torch]'
