# Sourced by the fixture scripts of tests/ref: checks the one argument (the longhaul binary) and
# that Python can import torch, and sets BIN, ROOT (the source tree) and PYTHON.
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
