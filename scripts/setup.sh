#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with torch 2.13.0 (CPU) and prudent.
# Extra arguments are more pip requirements, e.g. `bash scripts/setup.sh -e '.[bench]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "torch==2.13.0"
"${pip[@]}" install -e ".[dev,examples,tune,ui,lightning,transformers,keras,bench]" "$@"
