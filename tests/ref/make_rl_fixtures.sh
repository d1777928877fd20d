#!/usr/bin/env bash
# Regenerates the RL fixtures in tests/fixtures/rl/ for tests/unit/test_rl_parity.c (see
# tests/ref/README.md): loss.safetensors, the policy loss cases of tests/ref/loss_ref.py.
# LONGHAUL_BIN, as for the other fixture scripts, is for the fixtures that start from
# `longhaul init-model`.
# Usage: tests/ref/make_rl_fixtures.sh LONGHAUL_BIN   (`make fixtures` runs it with build/longhaul)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 LONGHAUL_BIN" >&2
  exit 2
fi
BIN=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
if [ ! -x "$BIN" ]; then
  echo "$0: $BIN is not an executable (build longhaul first: make build)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "$0: $PYTHON cannot import torch (Debian: apt-get install python3-torch)" >&2
  exit 1
fi

OUT="$ROOT/tests/fixtures/rl"
mkdir -p "$OUT"

"$PYTHON" "$ROOT/tests/ref/loss_ref.py" "$OUT/loss.safetensors"

size=$(du -sk "$OUT" | cut -f1)
if [ "$size" -gt 400 ]; then
  echo "$0: $OUT is ${size} KiB, over its ~300 KB budget; shrink the cases or the model" >&2
  exit 1
fi
echo "RL fixtures written to $OUT"
