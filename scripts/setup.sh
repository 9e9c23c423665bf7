#!/usr/bin/env bash
# Create .venv (once) and install the project with its test tools into it. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
