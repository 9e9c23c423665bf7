#!/usr/bin/env bash
# Set up and run the default test suite (the slow tiers run with: .venv/bin/python -m pytest -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
