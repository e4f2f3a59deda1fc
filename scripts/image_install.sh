#!/usr/bin/env bash
# The image's install steps: the Dockerfile runs this, and a test runs it in a fresh copy of the
# tree. It installs the way scripts/setup.sh does (a .venv in the tree, torch first, then the
# project), with torch from the PyTorch index of the variant and Ray pinned to the version the
# chart's rayVersion names.
#   VARIANT=cpu|cuda   RAY_VERSION (default 2.60.0)   TORCH_VERSION (default 2.13.0)
#   TORCH_INDEX_URL    overrides the variant's index ("" installs torch from the default index)
set -euo pipefail
cd "$(dirname "$0")/.."

variant=${VARIANT:-cpu}
ray_version=${RAY_VERSION:-2.60.0}
case "$variant" in
  cpu) index=https://download.pytorch.org/whl/cpu ;;
  cuda) index=https://download.pytorch.org/whl/cu128 ;;
  *) echo "VARIANT: unknown value '$variant'; use cpu or cuda" >&2; exit 2 ;;
esac
export TORCH_INDEX_URL=${TORCH_INDEX_URL-$index}

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "ray==${ray_version}" > "$constraints"
PIP_CONSTRAINT="$constraints" bash scripts/setup.sh

# What the pods run: `orchestrator run`, `python -m operators.hetero`, `ray start`.
.venv/bin/orchestrator --help > /dev/null
.venv/bin/python -c "import operators.hetero.handlers"
installed=$(.venv/bin/python -c "import ray; print(ray.__version__)")
if [ "$installed" != "$ray_version" ]; then
  echo "RAY_VERSION: image has Ray $installed, expected $ray_version" >&2
  exit 1
fi
PATH="$PWD/.venv/bin:$PATH" command -v ray > /dev/null || { echo "no ray command" >&2; exit 1; }
echo "image install: ready ($variant, Ray $installed)"
