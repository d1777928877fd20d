#!/usr/bin/env bash
# Integration test of `longhaul export`: each GGUF is read by two independent implementations,
# @huggingface/gguf (metadata and tensor shapes/types against config.json) and llama.cpp itself
# (node-llama-cpp 3.21.1's prebuilt CPU build): F32 exports of qwen2, qwen3 and llama models
# (biases, q/k norms, tied and untied heads, GQA, llama3 rope_scaling) continue prompts greedily
# exactly as `longhaul generate` does; f16, bf16 and q8_0 exports load and generate; the real
# Qwen3 and Llama-3 tokenizers and the built-in character tokenizer embedded in a GGUF tokenize
# a corpus as longhaul does. The Hugging
# Face directory (single file and sharded) loads in the PyTorch reference with the same logits,
# and longhaul loads it back. Refusals give clear errors. The model card is checked by
# tests/integration/export_card.sh.
# Usage: bash export.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: export.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: export.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/export.h" ] || { echo "export.sh: $SRC is not the longhaul source tree"; exit 1; }
NODE_DIR=$SRC/tests/ref/gguf/node_modules
if [ ! -d "$NODE_DIR/node-llama-cpp" ] || [ ! -d "$NODE_DIR/@huggingface/gguf" ]; then
  echo "FAIL: $NODE_DIR lacks node-llama-cpp or @huggingface/gguf: run scripts/install-deps.sh"
  exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-export.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
JOBS=$TMP/gguf_jobs.jsonl # what tests/ref/gguf_check.mjs checks, in one node process at the end
job() { # job MODEL GGUF TYPE PRE [KEY VALUE]...: one line of $JOBS
  local line="{\"model\":\"$1\",\"gguf\":\"$2\",\"type\":\"$3\",\"pre\":\"$4\""
  shift 4
  while [ $# -ge 2 ]; do
    line+=",\"$1\":$2"
    shift 2
  done
  echo "$line}" >>"$JOBS"
}
export OMP_NUM_THREADS=2
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}

# name arch tied intermediate extra-json: every model is 2 layers, hidden 64, 4 query heads,
# perturbed. llama_bias's intermediate 168 is no multiple of 32: its ffn_down cannot be q8_0
# blocks and goes f16.
VARIANTS=(
  "qwen2_untied qwen2 false 160 ,\"num_key_value_heads\":2,\"head_dim\":16"
  "qwen3_tied   qwen3 true  160 ,\"num_key_value_heads\":2,\"head_dim\":24"
  "llama_gqa    llama false 160 ,\"num_key_value_heads\":2,\"head_dim\":16,\"rope_theta\":500000.0,\"rms_norm_eps\":1e-5"
  "llama_bias   llama true  168 ,\"num_key_value_heads\":1,\"head_dim\":16,\"attention_bias\":true"
  "llama_rope3  llama false 160 ,\"num_key_value_heads\":2,\"head_dim\":16,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":32}"
)
for p in "3+4=" "hello world" "The answer is 42."; do
  "$BIN" tokenize --tokenizer chars --text "$p"
done >"$TMP/prompts.jsonl"

NAMES=()
for v in "${VARIANTS[@]}"; do
  read -r name arch tied ffn extra <<<"$v"
  cat >"$TMP/$name.json" <<JSON
{"hidden_size":64,"intermediate_size":$ffn,"num_hidden_layers":2,"num_attention_heads":4,
 "max_position_embeddings":128,"tie_word_embeddings":$tied${extra}}
JSON
  "$BIN" init-model --arch "$arch" --preset "$TMP/$name.json" --seed 5 --tokenizer chars \
    --out "$TMP/$name" >/dev/null 2>"$TMP/init.err" && NAMES+=("$name") ||
    fail "$name: init-model: $(cat "$TMP/init.err")"
done
"$PY" "$SRC/tests/ref/perturb_model.py" "${NAMES[@]/#/$TMP/}" || fail "perturb_model.py"
PAIRS=()
for name in "${NAMES[@]}"; do
  "$BIN" export --model "$TMP/$name" --out "$TMP/$name.out" --gguf f32 >/dev/null 2>"$TMP/exp.err" ||
    { fail "$name: export: $(cat "$TMP/exp.err")"; continue; }
  job "$TMP/$name" "$TMP/$name.out/model-f32.gguf" f32 default greedy "\"$TMP/prompts.jsonl\"" max_new 24
  PAIRS+=("$TMP/$name" "$TMP/$name.out")
done

# the built-in character tokenizer, as embedded: llama.cpp tokenizes its corpus as longhaul does
node -e 'const fs=require("fs");for(const l of fs.readFileSync(process.argv[1],"utf8").split("\n")){if(!l)continue;const o=JSON.parse(l);if(o.tokenizer==="chars")console.log(JSON.stringify(o.text))}' \
  "$SRC/tests/fixtures/tokenizer/expected.jsonl" >"$TMP/chars.corpus.jsonl"
job "$TMP/llama_gqa" "$TMP/llama_gqa.out/model-f32.gguf" f32 default corpus "\"$TMP/chars.corpus.jsonl\""

# other tensor types load in llama.cpp and generate (rows of 64 and 160 are q8_0 blocks; the
# qwen3 q/k norms of 24 stay f32; llama_bias's ffn_down rows of 168 fall back to f16)
for tn in f16:qwen3_tied bf16:llama_bias q8_0:qwen2_untied q8_0:qwen3_tied q8_0:llama_bias; do
  IFS=: read -r t name <<<"$tn"
  "$BIN" export --model "$TMP/$name" --out "$TMP/$name.$t" --gguf "$t" >/dev/null 2>"$TMP/exp.err" ||
    { fail "$name $t: export: $(cat "$TMP/exp.err")"; continue; }
  job "$TMP/$name" "$TMP/$name.$t/model-$t.gguf" "$t" default greedy "\"$TMP/prompts.jsonl\"" max_new 16
done

# sharded Hugging Face export: the reference loads it, and so does longhaul
"$BIN" export --model "$TMP/qwen2_untied" --out "$TMP/sharded" --shard-bytes 60000 >/dev/null \
  2>"$TMP/exp.err" || fail "sharded export: $(cat "$TMP/exp.err")"
PAIRS+=("$TMP/qwen2_untied" "$TMP/sharded:4")
"$PY" "$SRC/tests/ref/export_check.py" "${PAIRS[@]}" || fail "the Hugging Face directories (above)"
a=$("$BIN" generate --model "$TMP/sharded" --prompt "3+4=" --temperature 0 --max-new 12 --json 2>&1)
b=$("$BIN" generate --model "$TMP/qwen2_untied.out" --prompt "3+4=" --temperature 0 --max-new 12 --json 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "longhaul generate on the sharded export: $a vs $b"

# the real tokenizers embedded: llama.cpp tokenizes the corpus as longhaul does
for tk in qwen3:qwen2:qwen3 llama3:llama-bpe:llama; do
  IFS=: read -r tname pre arch <<<"$tk"
  zstd -q -d "$SRC/tests/fixtures/tokenizer/$tname.tokenizer.json.zst" -o "$TMP/$tname.tokenizer.json"
  echo '{"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,"max_position_embeddings":256}' >"$TMP/$tname.preset.json"
  "$BIN" init-model --arch "$arch" --preset "$TMP/$tname.preset.json" --seed 1 \
    --tokenizer "$TMP/$tname.tokenizer.json" --out "$TMP/$tname" >/dev/null 2>"$TMP/init.err" ||
    { fail "$tname: init-model: $(cat "$TMP/init.err")"; continue; }
  "$BIN" export --model "$TMP/$tname" --out "$TMP/$tname.out" --gguf q8_0 >/dev/null 2>"$TMP/exp.err" ||
    { fail "$tname: export: $(cat "$TMP/exp.err")"; continue; }
  node -e 'const fs=require("fs");for(const l of fs.readFileSync(process.argv[1],"utf8").split("\n")){if(!l)continue;const o=JSON.parse(l);if(o.tokenizer===process.argv[2])console.log(JSON.stringify(o.text))}' \
    "$SRC/tests/fixtures/tokenizer/expected.jsonl" "$tname" >"$TMP/$tname.corpus.jsonl"
  job "$TMP/$tname" "$TMP/$tname.out/model-q8_0.gguf" q8_0 "$pre" corpus "\"$TMP/$tname.corpus.jsonl\""
  grep -q '"chat_template"' "$TMP/$tname.out/tokenizer_config.json" || fail "$tname: no chat_template in tokenizer_config.json"
done

node "$SRC/tests/ref/gguf_check.mjs" "$BIN" "$JOBS" || fail "GGUF files in llama.cpp and @huggingface/gguf (above)"

# refusals
expect_fail() { # expect_fail WHAT PATTERN CMD...
  local what=$1 pat=$2
  shift 2
  if "$@" >"$TMP/out.txt" 2>"$TMP/err.txt"; then
    fail "$what: succeeded"
  elif ! grep -q -- "$pat" "$TMP/err.txt"; then
    fail "$what: expected /$pat/, got: $(cat "$TMP/err.txt")"
  fi
}
"$BIN" init-model --arch qwen2 --preset tiny --seed 1 --out "$TMP/notok" >/dev/null 2>&1
expect_fail "no tokenizer.json" "no tokenizer.json" "$BIN" export --model "$TMP/notok" --out "$TMP/x1"
expect_fail "non-empty --out" "not empty (pass --force" "$BIN" export --model "$TMP/qwen2_untied" --out "$TMP/qwen2_untied.out"
"$BIN" export --model "$TMP/qwen2_untied" --out "$TMP/qwen2_untied.out" --force --gguf bf16 >/dev/null 2>&1 ||
  fail "--force into an existing export"
expect_fail "bad --gguf" "expected f32, f16, bf16 or q8_0" "$BIN" export --model "$TMP/qwen2_untied" --out "$TMP/x2" --gguf q4_0
echo '{"attention_bias":true}' >"$TMP/q3b.json"
"$BIN" init-model --arch qwen3 --preset "$TMP/q3b.json" --seed 1 --tokenizer chars --out "$TMP/q3b" >/dev/null 2>&1
expect_fail "qwen3 with biases" "llama.cpp's qwen3 graph" "$BIN" export --model "$TMP/q3b" --out "$TMP/x3" --gguf f16
[ ! -e "$TMP/x3/model-f16.gguf" ] || fail "a refused GGUF was left behind"

if [ "$FAILED" -ne 0 ]; then
  echo "export.sh: $FAILED check(s) failed"
  exit 1
fi
echo "export.sh: all checks passed"
