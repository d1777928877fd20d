#!/usr/bin/env bash
# Regenerates tests/fixtures/patch: a small bf16 policy (parent/, a model directory) and the patch
# of one real RL update from it (v1-v2.lhp), which tests/ref/patch_decode.py, an independent
# decoder, applies in tests/integration/patch.sh. Usage: make_patch_fixture.sh LONGHAUL_BIN
set -euo pipefail
BIN=${1:?usage: make_patch_fixture.sh LONGHAUL_BIN}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$SRC/tests/fixtures/patch
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat >"$T/preset.json" <<'JSON'
{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "intermediate_size": 128}
JSON
"$BIN" init-model --arch qwen2 --preset "$T/preset.json" --tokenizer chars --seed 5 --out "$T/m" >/dev/null 2>&1
"$BIN" sft --model "$T/m" --env arith:digits=1 --steps 60 --batch 16 --threads 1 --out "$T/s" 2>/dev/null
"$BIN" rl --model "$T/s" --env arith:digits=1 --out "$T/r" --steps 2 --save-every 1 --lr 1e-4 \
  --threads 1 >/dev/null 2>&1
"$BIN" patch make --from "$T/r/checkpoints/step-000001" --to "$T/r/checkpoints/step-000001" \
  --out "$T/none.lhp" 2>/dev/null
rm -rf "$OUT/parent"
"$BIN" patch apply --model "$T/r/checkpoints/step-000001" --patch "$T/none.lhp" --out "$OUT/parent" 2>/dev/null
rm -f "$OUT/parent/tokenizer.json"
"$BIN" patch make --from "$OUT/parent" --to "$T/r/checkpoints/step-000002" --out "$OUT/v1-v2.lhp" \
  --from-version 1 --to-version 2
