#!/usr/bin/env bash
# Consecutive bf16 policies of real `longhaul rl` runs, the data of the policy-patch benchmark
# (issue 14; docs/PERFORMANCE.md, "Patch trajectories and baseline (measurements)").
#
# Usage: bench/patch_trajectories.sh BUILD_DIR OUT_DIR
#   CASES="tiny-1e-4 small-1e-6 ..." selects cases (default: all five, cheapest first);
#   STEPS (default 20) is the number of policy updates per case, Q05_STEPS (default STEPS) that
#   of the Qwen2.5-0.5B-shape cases; THREADS (default 2) the threads of every rl run (results
#   depend on the thread count, so a resumed case must keep it).
#
# For each case OUT_DIR/CASE/ gets v00.bf16 .. vNN.bf16 (the raw little-endian bf16 slab of the
# policy: v00 the starting policy, vK after update K, in the Hugging Face tensor order of the
# model's table), tensors.json (that table: names, shapes, element offsets and counts, computed
# from config.json as src/model/params.c does and checked against the safetensors file order),
# case.json (the commands, settings and the time of every step) and DONE when finished.
# Resumable: finished cases are skipped, and an interrupted one continues from its newest slab
# (rl --resume is bit-exact at the same thread count).
#
# Each update is one `rl --steps K --save-every 1 --keep 1` (the first fresh, the rest
# --resume); the new fp32 checkpoint is converted to its bf16 slab (bench/patch_slab.py, rounding
# as lh_bf16_from_f32) before the next step deletes it, so at most two checkpoints exist at once
# (12 GB for the 0.5B shape). Cases:
#   tiny-1e-4   the tiny preset with the chars tokenizer, sft 110 steps on sort (as
#               scripts/demo.sh), then rl on sort:count=4,digits=1 at lr 1e-4, max-new 16
#   small-1e-6, small-3e-6
#               the `small` preset's shape and weights (seed 1; vocab 4096 kept, the chars
#               tokenizer added so rl can decode), random weights, rl with bench/patch_env.py
#               (reward: the fraction of ASCII letters and digits in the completion), 16 prompts
#               x 8, max-new 16
#   q05-1e-6, q05-3e-6
#               a random model of the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14/2 heads,
#               intermediate 4864, vocab 151936, tied; 494M parameters) with the Qwen3
#               tokenizer fixture, the same environment, 2 prompts x 4, max-new 8
set -euo pipefail

BUILD=${1:?usage: bench/patch_trajectories.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: bench/patch_trajectories.sh BUILD_DIR OUT_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$BUILD" && pwd)/longhaul
PY=${PYTHON:-/usr/bin/python3}
STEPS=${STEPS:-20}
Q05_STEPS=${Q05_STEPS:-$STEPS}
THREADS=${THREADS:-2}
CASES=${CASES:-tiny-1e-4 small-1e-6 small-3e-6 q05-1e-6 q05-3e-6}
SLAB="$PY $SRC/bench/patch_slab.py"
ENV_EXEC="exec:path=$PY $SRC/bench/patch_env.py"
[ -x "$BIN" ] || {
  echo "patch_trajectories: $BIN is not an executable" >&2
  exit 1
}
mkdir -p "$OUT/models" "$OUT/runs"
OUT=$(cd "$OUT" && pwd)
M=$OUT/models

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
now() { date +%s.%N; }

# make_model NAME COMMAND...: runs COMMAND with $DEST set to a temporary directory, then renames
# it to models/NAME, so an interrupted build leaves nothing that looks finished.
make_model() {
  local name=$1
  shift
  [ -f "$M/$name/model.safetensors" ] && return 0
  log "model $name"
  rm -rf "$M/$name.tmp"
  DEST="$M/$name.tmp" "$@"
  mv "$M/$name.tmp" "$M/$name"
}

tiny_model() {
  "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$M/tiny-chars.tmp0"
  "$BIN" sft --model "$M/tiny-chars.tmp0" --env sort:count=4,digits=1 --steps 110 --batch 32 \
    --log-every 110 --threads "$THREADS" --out "$DEST"
  rm -rf "$M/tiny-chars.tmp0"
}

small_model() {
  # the small preset's config with vocab_size given, so the chars tokenizer keeps 4096 rows:
  # the weights are those of `init-model --preset small --seed 1` (same table, same seed)
  cat >"$M/small.json" <<'JSON'
{"vocab_size":4096,"hidden_size":512,"intermediate_size":1408,"num_hidden_layers":8,
 "num_attention_heads":8,"num_key_value_heads":4,"max_position_embeddings":2048,
 "tie_word_embeddings":true,"rope_theta":10000.0,"rms_norm_eps":1e-6}
JSON
  "$BIN" init-model --arch qwen2 --preset "$M/small.json" --tokenizer chars --seed 1 --out "$DEST"
}

q05_model() {
  cat >"$M/q05.json" <<'JSON'
{"vocab_size":151936,"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
 "num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
 "tie_word_embeddings":true,"rope_theta":1000000.0,"rms_norm_eps":1e-6}
JSON
  zstd -dqf "$SRC/tests/fixtures/tokenizer/qwen3.tokenizer.json.zst" -o "$M/qwen3.tokenizer.json"
  "$BIN" init-model --arch qwen2 --preset "$M/q05.json" --tokenizer "$M/qwen3.tokenizer.json" \
    --seed 1 --out "$DEST"
}

# run_case CASE MODEL N RL_FLAGS...
run_case() {
  local name=$1 model=$2 n=$3
  shift 3
  local dir=$OUT/$name run=$OUT/runs/$name
  if [ -f "$dir/DONE" ]; then
    log "$name: done already"
    return 0
  fi
  mkdir -p "$dir"
  if [ ! -f "$dir/v00.bf16" ]; then
    $SLAB "$model" "$dir/v00.bf16" --table "$dir/tensors.json"
  fi
  # the settings, once; the step times are appended as they come
  if [ ! -f "$dir/case.json.head" ]; then
    "$PY" - "$dir/case.json.head" "$name" "$model" "$n" "$THREADS" "$*" <<'PY'
import json, sys
out, name, model, n, threads, flags = sys.argv[1:]
json.dump({"case": name, "model": model, "updates": int(n), "threads": int(threads),
           "rl": "longhaul rl --model MODEL " + flags + " --save-every 1 --keep 1 --threads "
                 + threads + " --out RUN --steps K   (K = 1; then --out RUN --resume --steps K)"},
          open(out, "w"))
PY
  fi
  local k
  for ((k = 1; k <= n; k++)); do
    local v
    v=$(printf 'v%02d.bf16' "$k")
    [ -f "$dir/$v" ] && continue
    local at=0
    [ -f "$run/latest" ] && at=$(sed -n 's/^step-0*\([0-9][0-9]*\).*/\1/p' "$run/latest")
    [ -n "$at" ] || at=0
    if [ "$at" -gt "$k" ]; then
      echo "patch_trajectories: $run is at step $at but $dir/$v is missing: remove both" >&2
      exit 1
    fi
    local t0 t1 t2
    t0=$(now)
    if [ "$at" -lt "$k" ]; then
      if [ -f "$run/run.json" ]; then
        "$BIN" rl --out "$run" --resume --steps "$k" --save-every 1 --keep 1 --threads "$THREADS" \
          --log-every 1 2>>"$dir/rl.log"
      else
        "$BIN" rl --model "$model" "$@" --steps "$k" --save-every 1 --keep 1 \
          --threads "$THREADS" --log-every 1 --out "$run" 2>>"$dir/rl.log"
      fi
    fi
    t1=$(now)
    local ck
    ck=$(printf '%s/checkpoints/step-%06d' "$run" "$k")
    $SLAB "$ck" "$dir/$v"
    t2=$(now)
    awk -v k="$k" -v a="$t0" -v b="$t1" -v c="$t2" \
      'BEGIN { printf "{\"update\":%d,\"rl_s\":%.2f,\"convert_s\":%.2f}\n", k, b - a, c - b }' \
      >>"$dir/steps.jsonl"
    log "$name: $v $(tail -n 1 "$dir/steps.jsonl")"
  done
  "$PY" - "$dir" <<'PY'
import json, os, sys
d = sys.argv[1]
doc = json.load(open(os.path.join(d, "case.json.head")))
doc["steps"] = [json.loads(l) for l in open(os.path.join(d, "steps.jsonl"))] \
    if os.path.exists(os.path.join(d, "steps.jsonl")) else []
json.dump(doc, open(os.path.join(d, "case.json"), "w"), indent=1)
PY
  cp "$run/metrics.jsonl" "$dir/metrics.jsonl"
  # the fp32 checkpoints are not data of the benchmark; the run's metrics are kept above
  rm -rf "$run/checkpoints"
  touch "$dir/DONE"
  log "$name: finished"
}

for c in $CASES; do
  case $c in
  tiny-1e-4)
    make_model tiny-sort-base tiny_model
    run_case "$c" "$M/tiny-sort-base" "$STEPS" --env sort:count=4,digits=1 --lr 1e-4 --max-new 16
    ;;
  small-1e-6 | small-3e-6)
    make_model small-chars small_model
    run_case "$c" "$M/small-chars" "$STEPS" --env "$ENV_EXEC" --lr "${c#small-}" --max-new 16
    ;;
  q05-1e-6 | q05-3e-6)
    make_model q05 q05_model
    run_case "$c" "$M/q05" "$Q05_STEPS" --env "$ENV_EXEC" --lr "${c#q05-}" --prompts 2 --group 4 \
      --max-new 8
    ;;
  *)
    echo "patch_trajectories: unknown case $c" >&2
    exit 1
    ;;
  esac
done
log "all cases in $OUT"
