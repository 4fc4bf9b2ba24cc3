#!/usr/bin/env bash
# One command for the tests: set up, then run pytest. Extra arguments go to pytest:
# `bash scripts/test.sh -m ""` also runs the slow end-to-end tests (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
