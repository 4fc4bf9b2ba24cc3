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
"${pip[@]}" install -e ".[dev,examples,tune,ui,lightning,transformers,keras,bench,ft]" "$@"
# The report's and dashboard's chart bundle (Plotly's basic partial bundle) from the npm
# registry, pinned by src/prudent/report/package-lock.json; a wheel built after this carries it.
# Without npm every page takes the full bundle of the plotly Python package (slower to open).
if command -v npm >/dev/null; then
    npm ci --prefix src/prudent/report --no-audit --no-fund --ignore-scripts --loglevel=error
else
    echo "setup: npm not found: prudent report/ui fall back to plotly's full bundle" >&2
fi
