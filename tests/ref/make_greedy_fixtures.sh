#!/usr/bin/env bash
# Regenerates the greedy-decoding fixtures in tests/fixtures/greedy/<variant>/ for
# tests/unit/test_generate_parity.c: `longhaul init-model --dtype bf16` writes a tiny model, then
# tests/ref/greedy_ref.py rescales it (still BF16 on disk) and stores float64 torch's greedy
# continuations of four prompts. The models have no eos token, so generation never stops early.
# Usage: tests/ref/make_greedy_fixtures.sh LONGHAUL_BIN
set -euo pipefail

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-greedy.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# name arch seed kv tied extra-json. llama_tied_bias has attention_bias: q/k/v and o_proj biases.
VARIANTS=(
  "qwen2_tied_gqa   qwen2 11 2 true  "
  "llama_untied_gqa llama 12 2 false ,\"attention_bias\":false,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-5"
  "llama_tied_bias  llama 13 1 true  ,\"attention_bias\":true"
)

for v in "${VARIANTS[@]}"; do
  read -r name arch seed kv tied extra <<<"$v"
  preset="$TMP/$name.json"
  cat >"$preset" <<JSON
{"vocab_size":256,"hidden_size":64,"intermediate_size":160,"num_hidden_layers":2,
 "num_attention_heads":4,"num_key_value_heads":$kv,"head_dim":16,
 "max_position_embeddings":128,"tie_word_embeddings":$tied,
 "bos_token_id":null,"eos_token_id":null${extra:-}}
JSON
  "$BIN" init-model --arch "$arch" --preset "$preset" --seed "$seed" --out "$TMP/$name" --dtype bf16
  out="$ROOT/tests/fixtures/greedy/$name"
  rm -rf "$out"
  "$PYTHON" "$ROOT/tests/ref/greedy_ref.py" "$TMP/$name" "$out" --seed "$seed"
done
echo "greedy fixtures written to $ROOT/tests/fixtures/greedy"
