#!/usr/bin/env bash
# The project's checks: lint, layering contracts, types of the pure core, then the test suite.
#   scripts/test.sh               everything (what CI runs)
#   scripts/test.sh -m "not slow" the fast subset; other arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PWD/.venv/bin:$PATH"

echo "== ruff"; ruff check .
echo "== import contracts"; lint-imports
echo "== mypy (pure core)"; mypy
echo "== pytest"; python -m pytest "$@"
