#!/usr/bin/env bash
# The honest noise of rollout verification on the Qwen2.5-0.5B shape (random bf16 weights, vocab
# 151936; docs/SECURITY.md, "Noise at the Qwen2.5-0.5B size"): workers generate with bench's
# verify_noise on one kernel path, build and thread count, and the verifier recomputes and checks
# on another, as serve does (recompute forward on OpenBLAS forced with OPENBLAS_CORETYPE), and
# teacher-forces the worker's decode on every kernel path. Resumable: every generated batch
# (OUT/g-*.lhrb) and every check (OUT/c-*.json) is skipped when present; delete a check's file
# (or all: rm OUT/*.json OUT/*.lhrb) to run it again with a new build.
# Two models: the random one, whose softmax is near uniform (the most BORDERLINE positions), and
# a copy whose logits are 8 times larger (bench/scale_norm.py: as large as a trained model's, so
# that the noise, which grows with them, is not understated).
# Usage: verify_noise.sh [OUT] (default build/verify-noise); needs build/ and build-noomp/ with
# longhaul and bench/verify_noise built (make trust-calibrate builds build-noomp's longhaul;
# cmake --build build-noomp --target verify_noise; make trust-noise does both). VN, VN0 and LH
# name other binaries (verify_noise of the OpenMP and the non-OpenMP builds, longhaul).
set -euo pipefail
OUT=${1:-build/verify-noise}
mkdir -p "$OUT"
VN=${VN:-build/bench/verify_noise} VN0=${VN0:-build-noomp/bench/verify_noise} LH=${LH:-build/longhaul}
M=$OUT/model
if [ ! -f "$M/model.safetensors" ]; then
  cat >"$OUT/q05.json" <<'JSON'
{"vocab_size":151936,"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
 "num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
 "tie_word_embeddings":true,"rope_theta":1000000.0,"rms_norm_eps":1e-6}
JSON
  "$LH" init-model --arch qwen2 --preset "$OUT/q05.json" --seed 1 --dtype bf16 --out "$M" >&2
fi
# gen NAME BIN KERNEL THREADS [GROUPS GROUP_SIZE MAX_NEW]: a worker's batch (prompts of 16, 8 slots)
gen() {
  [ -f "$OUT/$1.lhrb" ] && return 0
  OMP_NUM_THREADS=$4 OPENBLAS_NUM_THREADS=$4 LH_KERNEL=$3 "$2" gen "$M" "$OUT/$1.lhrb.tmp" \
    "${5:-2}" "${6:-4}" "${7:-48}" 16 1 8 >"$OUT/$1.gen.json"
  mv "$OUT/$1.lhrb.tmp" "$OUT/$1.lhrb"
}
# check NAME BATCH BIN THREADS CORE PATHS: the verifier on OpenBLAS core CORE, and the worker's
# decode teacher-forced on PATHS
check() {
  [ -f "$OUT/$1.json" ] && return 0
  OMP_NUM_THREADS=$4 OPENBLAS_NUM_THREADS=$4 OPENBLAS_CORETYPE=$5 "$3" check "$M" "$OUT/$2.lhrb" "$6" \
    >"$OUT/$1.json.tmp" 2>"$OUT/$1.err"
  jq -c --arg bin "$3" --arg core "$5" '. + {bin: $bin, core: $core}' "$OUT/$1.json.tmp" >"$OUT/$1.json"
  rm "$OUT/$1.json.tmp"
  echo "verify_noise: $1 done" >&2
}
# the random model (near-uniform softmax, logits of std ~0.6), then the same with logits 8 times
# larger (final norm weight 8: std ~5, as large as a trained model's; files x8.*)
for tag in "" x8.; do
  M=$OUT/model
  if [ -n "$tag" ]; then
    M=$OUT/model-x8
    [ -f "$M/model.safetensors" ] || /usr/bin/python3 bench/scale_norm.py "$OUT/model" "$M" 8
  fi
  gen ${tag}g-omp-avx512-t2 $VN avx512 2
  gen ${tag}g-noomp-avx2-t1 $VN0 avx2 1
  gen ${tag}g-omp-scalar-t1 $VN scalar 1 1 2 16
  check ${tag}c-omp-avx512-t2.by-omp-t2-SkylakeX ${tag}g-omp-avx512-t2 $VN 2 SkylakeX avx512,avx2
  check ${tag}c-omp-avx512-t2.by-noomp-t1-Haswell ${tag}g-omp-avx512-t2 $VN0 1 Haswell avx512,avx2
  check ${tag}c-noomp-avx2-t1.by-omp-t2-SkylakeX ${tag}g-noomp-avx2-t1 $VN 2 SkylakeX none
  check ${tag}c-omp-scalar-t1.by-omp-t2-SkylakeX ${tag}g-omp-scalar-t1 $VN 2 SkylakeX scalar,avx2
done
{
  echo "check (worker batch . verifier) | tokens | |logit| max | reported log-prob diff worst | recompute s | train step s | check s, every token | check / recompute | check / train step | lh_sample_check s | with the chance s"
  jq -r '"\(input_filename | split("/") | .[-1] | rtrimstr(".json")) | \(.completion_tokens) | \(.logit_absmax) | \(.reported_worst) | \(.recompute_s) | \(.train_step_s) | \(.no_borderline_bound.verify_s // "-") | \(if .no_borderline_bound then .no_borderline_bound.verify_s / .recompute_s else "-" end) | \(if .no_borderline_bound then .no_borderline_bound.verify_s / .train_step_s else "-" end) | \(.sample_check_s // "-") | \(.sample_check_chance_s // "-")"' "$OUT"/c-*.json "$OUT"/x8.c-*.json
  echo "check | logit_tol | groups rejected | tokens checked | BORDERLINE | honest chances summed | most in one member | least room to a member's bound | check s"
  jq -r '(input_filename | split("/") | .[-1] | rtrimstr(".json")) as $n | .verdicts | to_entries[] |
    "\($n) | \(.value.logit_tol)\(if .key == 0 then " (default)" else "" end) | \(.value.rejected) | \(.value.tokens_checked) | \(.value.borderline) | \(.value.borderline_expected // "-") | \(.value.borderline_member_max) | \(.value.borderline_headroom // "-") | \(.value.verify_s)"' "$OUT"/c-*.json "$OUT"/x8.c-*.json
  echo "check | worker decode path | logit diff worst | logit diff p99.9 (all entries) | token log-prob diff worst | p99.9"
  jq -r '(input_filename | split("/") | .[-1] | rtrimstr(".json")) as $n | .paths[] |
    "\($n) | \(.path) | \(.logit_worst) | \(.logit_p999) | \(.logprob_worst) | \(.logprob_p999)"' "$OUT"/c-*.json "$OUT"/x8.c-*.json
} | tee "$OUT/summary.txt"
