#!/usr/bin/env bash
# Regenerates the PyTorch parity fixtures in tests/fixtures/<variant>/ (see tests/ref/README.md):
# for each variant, `longhaul init-model` writes a small model from a preset file, then
# make_fixture.py perturbs it and stores float64 torch's logits, gradients and AdamW losses.
# Usage: tests/ref/make_fixtures.sh LONGHAUL_BIN   (`make fixtures` runs it with build/longhaul)
set -euo pipefail

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-fixtures.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# name arch seed kv head-dim tied max-positions seqs extra-json ("-" seqs: the three short
# defaults). qwen2_long has sequences of 150 and 70 tokens: attention runs in 64-row query
# blocks, so these cross block boundaries (full, partial and diagonal blocks). qwen3_qknorm has
# per-head q/k norms and head_dim 24 != hidden/heads. llama3_ropescale stretches RoPE as Llama
# 3.1 does, with an original context of 32 that the long sequences run far past.
LLAMA3='"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":32}'
VARIANTS=(
  "qwen2_tied_gqa   qwen2 1 2 16 true  64  - "
  "qwen2_untied_mha qwen2 2 4 16 false 64  - "
  "llama_untied_gqa llama 3 2 16 false 64  - ,\"attention_bias\":false,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-5"
  "llama_tied_mqa   llama 4 1 16 true  64  - ,\"attention_bias\":true"
  "qwen2_long       qwen2 5 2 16 true  256 150:20:10,70:5:0,5:1:1 "
  "qwen3_qknorm     qwen3 6 2 24 true  64  - "
  "llama3_ropescale llama 7 2 16 false 256 150:20:10,70:5:0,5:1:1 ,$LLAMA3"
)

for v in "${VARIANTS[@]}"; do
  read -r name arch seed kv hd tied maxpos seqs extra <<<"$v"
  preset="$TMP/$name.json"
  cat >"$preset" <<JSON
{"vocab_size":96,"hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,
 "num_attention_heads":4,"num_key_value_heads":$kv,"head_dim":$hd,
 "max_position_embeddings":$maxpos,"tie_word_embeddings":$tied${extra:-}}
JSON
  "$BIN" init-model --arch "$arch" --preset "$preset" --seed "$seed" --out "$TMP/$name"
  out="$ROOT/tests/fixtures/$name"
  rm -rf "$out"
  seqargs=()
  if [ "$seqs" != "-" ]; then seqargs=(--seqs "$seqs"); fi
  "$PYTHON" "$ROOT/tests/ref/make_fixture.py" "$TMP/$name" "$out" "${seqargs[@]}"
  size=$(du -sk "$out" | cut -f1)
  if [ "$size" -gt 1100 ]; then
    echo "$0: $out is ${size} KiB, over the ~1 MB budget; shrink the variant" >&2
    exit 1
  fi
done
echo "fixtures written to $ROOT/tests/fixtures"
