#!/usr/bin/env bash
# One command for a new user: set up, train the digits example under `prudent run` on the
# embedded default store (./.prudent), then show what prudent recorded about the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run_id="digits-demo-$(date +%Y%m%d-%H%M%S)"
.venv/bin/prudent run --run-id "$run_id" -- .venv/bin/python examples/digits.py
.venv/bin/prudent show "$run_id"
.venv/bin/prudent show "$run_id" --json
