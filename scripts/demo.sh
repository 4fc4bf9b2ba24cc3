#!/usr/bin/env bash
# One command for a new user: set up, train the digits example under `prudent run` on the
# embedded default store (./.prudent), then say in three lines how it went, where its report
# is and how to watch runs live. (`prudent show RUN --json` is the machine-readable record.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run_id="digits-demo-$(date +%Y%m%d-%H%M%S)"
.venv/bin/prudent run --run-id "$run_id" -- .venv/bin/python examples/digits.py
echo
.venv/bin/prudent report "$run_id"  # the verdict, then "report: <path>" (opens offline)
echo "dashboard: .venv/bin/prudent ui, then open http://127.0.0.1:8765/runs/$run_id"
