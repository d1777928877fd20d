#!/usr/bin/env bash
# Regenerates the RL fixtures in tests/fixtures/rl/ for tests/unit/test_rl_parity.c (see
# tests/ref/README.md): loss.safetensors, the policy loss cases of tests/ref/loss_ref.py, and
# update/, a tiny model from `longhaul init-model` with what one lh_rl_update does to it in
# float64 torch (tests/ref/rl_update_ref.py).
# Usage: tests/ref/make_rl_fixtures.sh LONGHAUL_BIN   (`make fixtures` runs it with build/longhaul)
set -euo pipefail

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-rl-fixtures.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
OUT="$ROOT/tests/fixtures/rl"
mkdir -p "$OUT"

"$PYTHON" "$ROOT/tests/ref/loss_ref.py" "$OUT/loss.safetensors"

# 5.3k parameters, 21 KB in F32: the weights and first moments after each of the four
# scenarios make ~200 KB.
cat >"$TMP/preset.json" <<JSON
{"vocab_size":32,"hidden_size":16,"intermediate_size":32,"num_hidden_layers":2,
 "num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,
 "max_position_embeddings":32,"tie_word_embeddings":true}
JSON
"$BIN" init-model --arch qwen2 --preset "$TMP/preset.json" --seed 21 --out "$TMP/model"
rm -rf "$OUT/update"
"$PYTHON" "$ROOT/tests/ref/rl_update_ref.py" "$TMP/model" "$OUT/update"

size=$(du -sk "$OUT" | cut -f1)
if [ "$size" -gt 400 ]; then
  echo "$0: $OUT is ${size} KiB, over its ~300 KB budget; shrink the cases or the model" >&2
  exit 1
fi
echo "RL fixtures written to $OUT"
