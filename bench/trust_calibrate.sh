#!/usr/bin/env bash
# Calibration of rollout verification (docs/SECURITY.md, "Calibration"): real `longhaul serve`
# runs on loopback with honest workers under different engines (builds with and without OpenMP,
# thread counts 1 and 2, batch compositions through --slots, and the kernel paths: the workers'
# bf16 path forced with LH_KERNEL, the server's OpenBLAS sgemm forced with OPENBLAS_CORETYPE,
# so that a worker on one path is checked by a verifier on another), and runs with one cheating
# worker per adversary mode beside two honest ones, the workers on another kernel path than
# the server. Each run leaves OUT/NAME.json (what the ledger and the metrics say, and the build
# that ran it) and is skipped when that file exists: the script resumes where it stopped.
# Usage: trust_calibrate.sh [OUT]   (make trust-calibrate)
# Environment:
#   BINS="build/longhaul build-noomp/longhaul"  builds (the first also makes the model)
#   ROUNDS (honest rounds over every engine, default 2: about 13,000 rollouts), STEPS (updates per run, default 20)
#   PAIRS  worker:server kernel paths of the honest runs, default below; the worker's is
#          LH_KERNEL (avx512, avx2, scalar, auto), the server's an OpenBLAS core (SkylakeX:
#          AVX-512, Haswell: AVX2, Nehalem: SSE only, auto) with LH_KERNEL set to match
#   ADV_PAIR  the same for the adversary runs (default avx2:SkylakeX)
#   WORKER_BLAS=match (default): the workers' OpenBLAS core follows their LH_KERNEL (avx512:
#          SkylakeX, avx2: Haswell, scalar: Nehalem), as on a CPU whose best path that is (the
#          inference engine's attention runs on OpenBLAS sgemv); the run's name says it
#          (wavx2.Haswell). auto: the library's choice (the first calibration's runs, named wavx2)
#   MODES (adversary modes, default all), SERVE_FLAGS (tolerances to try, e.g. --logit-tol 1e-4)
#   ONLY   a regular expression: run only the runs whose names match (e.g. ONLY=-w for the
#          kernel-path runs, ONLY=^adv- for the adversaries)
#   REDO=stale  run again the runs whose record names another build (a binary with other
#          bytes); their old records move to OUT/stale/BUILD/. The summary counts each build.
# Prints the summary at the end (also OUT/summary.txt); ONLY='^$' runs nothing and prints it.
set -euo pipefail
OUT=${1:-build/trust-calib}
read -r -a BINS <<<"${BINS:-build/longhaul build-noomp/longhaul}"
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
MODES=${MODES:-other-model quant4 quant8 prompt tokens temperature top-p best-of-n drop-member dup-member logprobs reward replay version garbage oversized slowloris selective truncate}
SERVE_FLAGS=${SERVE_FLAGS:-}
PAIRS=${PAIRS:-avx2:SkylakeX avx512:Haswell scalar:SkylakeX avx512:Nehalem avx512:SkylakeX avx2:Haswell}
ADV_PAIR=${ADV_PAIR:-avx2:SkylakeX}
ONLY=${ONLY:-}
REDO=${REDO:-}
WORKER_BLAS=${WORKER_BLAS:-match}
ENV=sort:count=3,digits=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for i in "${!BINS[@]}"; do BINS[$i]=$(realpath "${BINS[$i]}"); done
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

B0=${BINS[0]}
if [ ! -f "$OUT/base/config.json" ]; then
  (cd "$OUT" && rm -rf m0 base &&
    "$B0" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1 &&
    OMP_NUM_THREADS=2 "$B0" sft --model m0 --env $ENV --steps 40 --batch 16 --log-every 40 --out base >/dev/null 2>&1 &&
    "$B0" keygen --out trainer.key >/dev/null 2>&1)
fi

# The build a binary is: the first 12 hex digits of its SHA-256 (a rebuild with other kernels
# reads as another build); its repository's commit (-dirty with uncommitted changes) goes in the
# record beside it.
declare -A BUILD GIT
for b in "${BINS[@]}"; do
  BUILD[$b]=$(sha256sum "$b" | cut -c1-12)
  GIT[$b]=$(git -C "$(dirname "$b")" describe --always --dirty 2>/dev/null || echo unknown)
done

# blas_kernel CORE: the LH_KERNEL that matches an OpenBLAS core (what a server on that CPU runs)
# kernel_blas KERNEL: the OpenBLAS core of a CPU whose best bf16 path is KERNEL (the inference
# engine's attention runs on OpenBLAS sgemv, so a worker's logits depend on both)
kernel_blas() {
  case $1 in avx512) echo SkylakeX ;; avx2) echo Haswell ;; scalar) echo Nehalem ;; *) echo auto ;; esac
}
# wname KERNEL: the worker part of a run's name (KERNEL.CORE when the worker's core is forced)
wname() {
  if [ "$WORKER_BLAS" = match ] && [ "$1" != auto ]; then echo "$1.$(kernel_blas "$1")"; else echo "$1"; fi
}
blas_kernel() {
  case $1 in SkylakeX | Cooperlake) echo avx512 ;; Haswell | Zen) echo avx2 ;; auto) echo auto ;; *) echo scalar ;; esac
}

# run NAME BIN THREADS SLOTS MODE WORKER_KERNEL SERVER_CORE [FLAGS]: serve for STEPS updates with two
# honest workers (THREADS generation threads, SLOTS sequences at once, LH_KERNEL=WORKER_KERNEL)
# and, unless MODE is none, a cheating worker; serve's sgemm on OpenBLAS core SERVER_CORE.
run() {
  local name=$1 bin=$2 threads=$3 slots=$4 mode=$5 wk=$6 vk=$7 flags=${8:-} wb=auto
  [ "$WORKER_BLAS" = match ] && wb=$(kernel_blas "$wk")
  [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]] && return 0
  if [ -f "$OUT/$name.json" ]; then
    local was
    was=$(jq -r '.build // "unknown"' "$OUT/$name.json")
    [ "$REDO" = stale ] && [ "$was" != "${BUILD[$bin]}" ] || return 0
    mkdir -p "$OUT/stale/${was//[^A-Za-z0-9._-]/_}"
    mv "$OUT/$name.json" "$OUT/stale/${was//[^A-Za-z0-9._-]/_}/"
    echo "trust_calibrate: $name: recorded with build $was, running it again with ${BUILD[$bin]}" >&2
  fi
  local d="$OUT/runs/$name"
  rm -rf "$d" && mkdir -p "$d"
  (
    cd "$d"
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE
    local senv=() wenv=()
    [ "$vk" != auto ] && senv=(OPENBLAS_CORETYPE="$vk" LH_KERNEL="$(blas_kernel "$vk")")
    [ "$wk" != auto ] && wenv=(LH_KERNEL="$wk")
    [ "$wb" != auto ] && wenv+=(OPENBLAS_CORETYPE="$wb")
    # shellcheck disable=SC2086
    env "${senv[@]}" "$bin" serve --run run --model "$OUT/base" --env $ENV --key "$OUT/trainer.key" --port-file port \
      --steps "$STEPS" --prompts 3 --group 4 --max-new 16 --lease-s 5 --ban-after 0 \
      --max-wall 120 $SERVE_FLAGS $flags >serve.log 2>&1 &
    local sp=$!
    PIDS+=("$sp")
    for _ in $(seq 1 200); do [ -s port ] && break; sleep 0.05; done
    local port
    port=$(cat port)
    local ws=()
    for w in wa wb; do
      env "${wenv[@]}" "$bin" worker --server "http://127.0.0.1:$port" --key "$w.key" --trust-key "$OUT/trainer.key.pub" \
        --dir "$w" --slots "$slots" --threads "$threads" --name "$w" >"$w.log" 2>&1 &
      ws+=("$!")
    done
    if [ "$mode" != none ]; then
      env "${wenv[@]}" "$bin" worker --server "http://127.0.0.1:$port" --key wx.key --trust-key "$OUT/trainer.key.pub" \
        --dir wx --slots "$slots" --threads "$threads" --name wx --adversary "$mode" >wx.log 2>&1 &
      ws+=("$!")
    fi
    PIDS+=("${ws[@]}")
    local rc=0
    wait "$sp" || rc=$?
    for p in "${ws[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${ws[@]}"; do wait "$p" 2>/dev/null || true; done
    q() { sqlite3 run/ledger.sqlite "$1"; }
    local J="SELECT w.name, g.state, g.reason FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker"
    # honest: verified = groups that reached verification (trained, dropped, refuted or queued)
    local h_ok h_rej a_sub a_rej a_tr reasons until h_why
    h_ok=$(q "SELECT count(*) FROM ($J) WHERE name IN ('wa','wb') AND state IN (1,3,4)")
    h_rej=$(q "SELECT count(*) FROM ($J) WHERE name IN ('wa','wb') AND state = 2")
    h_why=$(q "SELECT reason FROM ($J) WHERE name IN ('wa','wb') AND state = 2" | jq -Rs 'split("\n") | map(select(. != ""))')
    a_sub=$(q "SELECT count(*) FROM ($J) WHERE name = 'wx' AND state IN (1,2,3,4)")
    a_rej=$(q "SELECT count(*) FROM ($J) WHERE name = 'wx' AND state = 2")
    a_tr=$(q "SELECT count(*) FROM ($J) WHERE name = 'wx' AND state = 3")
    # selective submission: groups abandoned (expired, never submitted) and leases refused
    local a_exp a_aband
    a_exp=$(q "SELECT count(*) FROM ($J) WHERE name = 'wx' AND state = 5")
    a_aband=$( (grep -c 'HTTP 403 abandoning' wx.log 2>/dev/null || true) | head -1)
    reasons=$(q "SELECT substr(reason, 1, instr(reason || ':', ':') - 1) AS r, count(*) FROM ($J) WHERE name = 'wx' AND state = 2 GROUP BY r" |
      awk -F'|' 'BEGIN{printf "{"} {printf "%s\"%s\":%s", (NR>1 ? "," : ""), $1, $2} END{printf "}"}')
    # tokens until detection: "(after N of M tokens)" for verification, 0 for refusals before it
    until=$(q "SELECT reason FROM ($J) WHERE name = 'wx' AND state = 2" |
      sed -n 's/.*(after \([0-9]*\) of [0-9]* tokens)$/\1/p;t;s/.*/0/p' | sort -n | tr '\n' ' ')
    local stats
    stats=$(jq -s '{tokens: (map(.verified_tokens // 0) | add), borderline: (map(.borderline // 0) | add),
      borderline_expected: (map(.borderline_expected // 0) | add),
      borderline_member_max: (map(.borderline_member_max // 0) | max),
      logprob_err_max: (map(.logprob_err_max // 0) | max), recompute_s: (map(.recompute_s // 0) | add),
      verify_s: (map(.verify_s // 0) | add), train_s: (map(.train_s // 0) | add), steps: length}' run/metrics.jsonl)
    # the server stayed responsive: /v1/status was not needed after exit; steps reached
    jq -n --arg name "$name" --arg mode "$mode" --arg flags "$flags" --arg bin "$bin" --arg build "${BUILD[$bin]}" --arg git "${GIT[$bin]}" --arg wk "$wk" --arg wb "$wb" --arg vk "$vk" \
      --argjson steps "$STEPS" --argjson threads "$threads" \
      --argjson slots "$slots" --argjson rc "$rc" --argjson h_ok "$h_ok" --argjson h_rej "$h_rej" \
      --argjson a_sub "$a_sub" --argjson a_rej "$a_rej" --argjson a_tr "$a_tr" \
      --argjson a_exp "$a_exp" --argjson a_aband "${a_aband:-0}" \
      --argjson reasons "$reasons" --argjson h_why "$h_why" --arg until "$until" --argjson stats "$stats" \
      '{name: $name, mode: $mode, flags: $flags, bin: $bin, build: $build, git: $git, worker_kernel: $wk, worker_blas: $wb,
        server_blas: $vk, steps: $steps, threads: $threads, slots: $slots, serve_rc: $rc,
        honest_groups: $h_ok, honest_rejected: $h_rej, honest_reasons: $h_why, adv_submitted: $a_sub, adv_rejected: $a_rej,
        adv_trained: $a_tr, adv_expired: $a_exp, adv_lease_refusals: $a_aband, reasons: $reasons,
        tokens_until: ($until | split(" ") | map(select(. != "") | tonumber)), metrics: $stats}' \
      >"$OUT/$name.json.tmp"
    mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  )
  rm -rf "$d"
  echo "trust_calibrate: $name done" >&2
}

# honest runs: every build, thread counts 1 and 2, every worker:server kernel pair, and batch
# compositions of 1, 4 and 8 slots taken in turn (each pair meets each composition over the
# builds, thread counts and rounds)
SLOTS=(1 4 8)
for r in $(seq 1 "$ROUNDS"); do
  for bi in "${!BINS[@]}"; do
    b=${BINS[$bi]}
    kind=$(basename "$(dirname "$b")")
    for t in 1 2; do
      pi=0
      for pair in $PAIRS; do
        wk=${pair%%:*} vk=${pair#*:}
        sl=${SLOTS[$(((pi + bi + 2 * t + r) % 3))]}
        run "honest-$kind-w$(wname "$wk")-v$vk-t$t-s$sl-r$r" "$b" "$t" "$sl" none "$wk" "$vk"
        pi=$((pi + 1))
      done
    done
  done
done
# one run per adversary mode (the first build, 2 threads, 8 slots, every worker on ADV_PAIR's
# worker path and the server on its core)
awk_=${ADV_PAIR%%:*} avk=${ADV_PAIR#*:}
for m in $MODES; do run "adv-$m-w$(wname "$awk_")-v$avk" "$B0" 2 8 "$m" "$awk_" "$avk"; done
# the generation cheats again with the log-prob check off: what the token check alone catches
# (a cheat that reports the log-probs of the leased distribution; for a wrong model it cannot)
for m in $MODES; do
  case $m in other-model | quant4 | quant8 | temperature | top-p | best-of-n | tokens | dup-member)
    run "adv-tokenonly-$m-w$(wname "$awk_")-v$avk" "$B0" 2 8 "$m" "$awk_" "$avk" "--logprob-tol 1000" ;;
  esac
done

# summary: every record in OUT (a rerun with another build replaces the records it runs again;
# the first lines say which builds the records come from). Rollouts = groups x 4 members.
{
  jq -rs 'group_by(.build // "unrecorded") | .[] |
    "binary \(.[0].bin | split("/") | .[-2:] | join("/")) \(.[0].build // "(unrecorded)") (commit \(.[0].git // "?")): \(length) runs (\(map(select(.mode == "none")) | length) honest)"' "$OUT"/*.json
  jq -rs '[.[] | select(.mode == "none")] |
    "honest: \(length) runs, \(map(.honest_groups) | add // 0) groups = \(map(.honest_groups) | (add // 0) * 4) rollouts verified, \(map(.honest_rejected) | add) rejected; \(map(.metrics.tokens) | add) tokens, \(map(.metrics.borderline) | add) BORDERLINE (at most \(map(.metrics.borderline_member_max // 0) | max) in one member, in the runs that record it); largest log-prob difference \(map(.metrics.logprob_err_max) | max); verification \(map(.metrics.verify_s) | add) s, recompute forwards \(map(.metrics.recompute_s) | add) s, training \(map(.metrics.train_s) | add) s"' "$OUT"/*.json
  echo "worker kernel | worker BLAS core | server BLAS core | runs | groups | rollouts | rejected | tokens | BORDERLINE | most in one member | largest log-prob difference"
  jq -rs '[.[] | select(.mode == "none")] | group_by("\(.worker_kernel // "auto") \(.worker_blas // "auto") \(.server_blas // "auto")") | .[] |
    "\(.[0].worker_kernel // "auto") | \(.[0].worker_blas // "auto") | \(.[0].server_blas // "auto") | \(length) | \(map(.honest_groups) | add) | \(map(.honest_groups) | add * 4) | \(map(.honest_rejected) | add) | \(map(.metrics.tokens) | add) | \(map(.metrics.borderline) | add) | \(map(.metrics.borderline_member_max // 0) | max) | \(map(.metrics.logprob_err_max) | max)"' "$OUT"/*.json
  echo "build | threads | runs | groups | rollouts | rejected | tokens | BORDERLINE | largest log-prob difference"
  jq -rs '[.[] | select(.mode == "none")] | group_by((.bin | split("/") | .[-2]) + " \(.threads)") | .[] |
    "\(.[0].bin | split("/") | .[-2]) | \(.[0].threads) | \(length) | \(map(.honest_groups) | add) | \(map(.honest_groups) | add * 4) | \(map(.honest_rejected) | add) | \(map(.metrics.tokens) | add) | \(map(.metrics.borderline) | add) | \(map(.metrics.logprob_err_max) | max)"' "$OUT"/*.json
  echo "slots | runs | groups | rollouts | rejected | BORDERLINE | largest log-prob difference"
  jq -rs '[.[] | select(.mode == "none")] | group_by(.slots) | .[] |
    "\(.[0].slots) | \(length) | \(map(.honest_groups) | add) | \(map(.honest_groups) | add * 4) | \(map(.honest_rejected) | add) | \(map(.metrics.borderline) | add) | \(map(.metrics.logprob_err_max) | max)"' "$OUT"/*.json
  echo "cost, runs recording borderline_member_max: build | threads | train_s | recompute_s | verify_s | recompute/train | verify/recompute | verify/train"
  jq -rs '[.[] | select(.mode == "none" and .metrics.borderline_member_max != null)] | group_by((.bin | split("/") | .[-2]) + " \(.threads)") | .[] |
    (map(.metrics.train_s) | add) as $t | (map(.metrics.recompute_s) | add) as $r | (map(.metrics.verify_s) | add) as $v |
    "\(.[0].bin | split("/") | .[-2]) | \(.[0].threads) | \($t) | \($r) | \($v) | \($r / $t) | \($v / $r) | \($v / $t)"' "$OUT"/*.json
  echo "mode | checks | worker kernel | worker BLAS core | server BLAS core | groups submitted | rejected | trained | caught of decided | by | tokens until detection (median, most)"
  jq -rs '.[] | select(.mode != "none") |
    "\(.mode) | \(if (.flags // "") == "" then "all" else "token only" end) | \(.worker_kernel // "auto") | \(.worker_blas // "auto") | \(.server_blas // "auto") | \(.adv_submitted) | \(.adv_rejected) | \(.adv_trained) | \(if .adv_rejected + .adv_trained > 0 then "\(.adv_rejected * 1000 / (.adv_rejected + .adv_trained) | round / 10)%" else "-" end) | \(.reasons | to_entries | map("\(.key) \(.value)") | join(", ")) | \(if (.tokens_until | length) > 0 then "\(.tokens_until | sort | .[(length - 1) / 2 | floor]), \(.tokens_until | max)" else "-" end)"' "$OUT"/*.json
  echo "every run: name | build | groups | rollouts | rejected | BORDERLINE | largest log-prob difference"
  jq -rs '.[] | select(.mode == "none") |
    "\(.name) | \(.build // "unrecorded") | \(.honest_groups) | \(.honest_groups * 4) | \(.honest_rejected) | \(.metrics.borderline) | \(.metrics.logprob_err_max)"' "$OUT"/*.json
} | tee "$OUT/summary.txt"
