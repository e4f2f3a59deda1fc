#!/usr/bin/env bash
# Set up everything the project needs, from nothing: a virtual environment in .venv with the CPU
# build of torch (installed first, so no CUDA build is ever pulled), the project and its extras.
#   scripts/setup.sh          run-time: enough for `orchestrator demo`
#   scripts/setup.sh --dev    also the test tools: linters, the helm binary, Prometheus (apt)
# Idempotent: a second run changes nothing and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
dev=0
[ "${1:-}" = "--dev" ] && dev=1

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# torch first, CPU build: a bare `torch` requirement would pull a multi-GB CUDA build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    "${pip[@]}" "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
  else
    "${pip[@]}" "torch==${TORCH_VERSION}"
  fi
fi

if [ "$dev" = 1 ]; then
  "${pip[@]}" -e ".[dev]"
  bash scripts/install_tools.sh
else
  "${pip[@]}" -e .
fi
echo "setup: ready (.venv)"
