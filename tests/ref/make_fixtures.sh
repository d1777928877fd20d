#!/usr/bin/env bash
# Regenerates the PyTorch parity fixtures in tests/fixtures/<variant>/ (see tests/ref/README.md):
# for each variant, `longhaul init-model` writes a small model from a preset file, then
# make_fixture.py perturbs it and stores float64 torch's logits, gradients and AdamW losses.
# Usage: tests/ref/make_fixtures.sh LONGHAUL_BIN   (`make fixtures` runs it with build/longhaul)
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

TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-fixtures.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# name arch seed kv tied extra-json
VARIANTS=(
  "qwen2_tied_gqa   qwen2 1 2 true  "
  "qwen2_untied_mha qwen2 2 4 false "
  "llama_untied_gqa llama 3 2 false ,\"attention_bias\":false,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-5"
  "llama_tied_mqa   llama 4 1 true  ,\"attention_bias\":true"
)

for v in "${VARIANTS[@]}"; do
  read -r name arch seed kv tied extra <<<"$v"
  preset="$TMP/$name.json"
  cat >"$preset" <<JSON
{"vocab_size":96,"hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,
 "num_attention_heads":4,"num_key_value_heads":$kv,"head_dim":16,
 "max_position_embeddings":64,"tie_word_embeddings":$tied${extra:-}}
JSON
  "$BIN" init-model --arch "$arch" --preset "$preset" --seed "$seed" --out "$TMP/$name"
  out="$ROOT/tests/fixtures/$name"
  rm -rf "$out"
  "$PYTHON" "$ROOT/tests/ref/make_fixture.py" "$TMP/$name" "$out"
  size=$(du -sk "$out" | cut -f1)
  if [ "$size" -gt 1100 ]; then
    echo "$0: $out is ${size} KiB, over the ~1 MB budget; shrink the variant" >&2
    exit 1
  fi
done
echo "fixtures written to $ROOT/tests/fixtures"
