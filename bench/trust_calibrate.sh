#!/usr/bin/env bash
# Calibration of rollout verification (docs/SECURITY.md, "Calibration"): real `longhaul serve`
# runs on loopback with honest workers under different engines (thread counts, OpenMP and
# non-OpenMP builds, batch compositions through --slots), and runs with one cheating worker per
# adversary mode beside an honest one. Each run leaves OUT/NAME.json (what the ledger and the
# metrics say) and is skipped when that file exists: the script resumes where it stopped, and a
# later session adds engines (kernel paths) and rounds by extending the lists below.
# Usage: trust_calibrate.sh [OUT]   (make trust-calibrate)
# Environment: BINS="build/longhaul build-noomp/longhaul" (each a build; the first also makes
# the model), ROUNDS (honest runs per engine, default 2), STEPS (updates per run, default 20),
# MODES (adversary modes, default all), SERVE_FLAGS (tolerances to try, e.g. --logit-tol 1e-4).
# Prints the summary table at the end (also OUT/summary.txt).
set -euo pipefail
OUT=${1:-build/trust-calib}
read -r -a BINS <<<"${BINS:-build/longhaul build-noomp/longhaul}"
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
MODES=${MODES:-other-model quant4 quant8 prompt tokens temperature top-p best-of-n drop-member dup-member logprobs reward replay version garbage oversized slowloris selective truncate}
SERVE_FLAGS=${SERVE_FLAGS:-}
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

# run NAME BIN THREADS SLOTS MODE [FLAGS]: serve for STEPS updates with two honest workers (THREADS
# generation threads, SLOTS sequences at once) and, unless MODE is none, a cheating worker.
run() {
  local name=$1 bin=$2 threads=$3 slots=$4 mode=$5 flags=${6:-}
  [ -f "$OUT/$name.json" ] && return 0
  local d="$OUT/runs/$name"
  rm -rf "$d" && mkdir -p "$d"
  (
    cd "$d"
    export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE
    # shellcheck disable=SC2086
    "$bin" serve --run run --model "$OUT/base" --env $ENV --key "$OUT/trainer.key" --port-file port \
      --steps "$STEPS" --prompts 3 --group 4 --max-new 16 --lease-s 5 --ban-after 0 \
      --max-wall 120 $SERVE_FLAGS $flags >serve.log 2>&1 &
    local sp=$!
    PIDS+=("$sp")
    for _ in $(seq 1 200); do [ -s port ] && break; sleep 0.05; done
    local port
    port=$(cat port)
    local ws=()
    for w in wa wb; do
      "$bin" worker --server "http://127.0.0.1:$port" --key "$w.key" --trust-key "$OUT/trainer.key.pub" \
        --dir "$w" --slots "$slots" --threads "$threads" --name "$w" >"$w.log" 2>&1 &
      ws+=("$!")
    done
    if [ "$mode" != none ]; then
      "$bin" worker --server "http://127.0.0.1:$port" --key wx.key --trust-key "$OUT/trainer.key.pub" \
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
      borderline_member_max: (map(.borderline_member_max // 0) | max),
      logprob_err_max: (map(.logprob_err_max // 0) | max), recompute_s: (map(.recompute_s // 0) | add),
      verify_s: (map(.verify_s // 0) | add), train_s: (map(.train_s // 0) | add), steps: length}' run/metrics.jsonl)
    # the server stayed responsive: /v1/status was not needed after exit; steps reached
    jq -n --arg name "$name" --arg mode "$mode" --arg flags "$flags" --arg bin "$bin" --argjson threads "$threads" \
      --argjson slots "$slots" --argjson rc "$rc" --argjson h_ok "$h_ok" --argjson h_rej "$h_rej" \
      --argjson a_sub "$a_sub" --argjson a_rej "$a_rej" --argjson a_tr "$a_tr" \
      --argjson a_exp "$a_exp" --argjson a_aband "${a_aband:-0}" \
      --argjson reasons "$reasons" --argjson h_why "$h_why" --arg until "$until" --argjson stats "$stats" \
      '{name: $name, mode: $mode, flags: $flags, bin: $bin, threads: $threads, slots: $slots, serve_rc: $rc,
        honest_groups: $h_ok, honest_rejected: $h_rej, honest_reasons: $h_why, adv_submitted: $a_sub, adv_rejected: $a_rej,
        adv_trained: $a_tr, adv_expired: $a_exp, adv_lease_refusals: $a_aband, reasons: $reasons,
        tokens_until: ($until | split(" ") | map(select(. != "") | tonumber)), metrics: $stats}' \
      >"$OUT/$name.json.tmp"
    mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  )
  rm -rf "$d"
  echo "trust_calibrate: $name done" >&2
}

# honest runs: every engine, thread counts 1 and 2, batch compositions of 1, 4 and 8 slots
for r in $(seq 1 "$ROUNDS"); do
  for b in "${BINS[@]}"; do
    kind=$(basename "$(dirname "$b")")
    for t in 1 2; do
      for sl in 1 4 8; do run "honest-$kind-t$t-s$sl-r$r" "$b" "$t" "$sl" none; done
    done
  done
done
# one run per adversary mode (the first engine, 2 threads, 8 slots)
for m in $MODES; do run "adv-$m" "$B0" 2 8 "$m"; done
# the generation cheats again with the log-prob check off: what the token check alone catches
# (a cheat that reports the log-probs of the leased distribution; for a wrong model it cannot)
for m in $MODES; do
  case $m in other-model | quant4 | quant8 | temperature | top-p | best-of-n | tokens | dup-member)
    run "adv-tokenonly-$m" "$B0" 2 8 "$m" "--logprob-tol 1000" ;;
  esac
done

# summary
{
  jq -rs '[.[] | select(.mode == "none")] |
    "honest: \(length) runs, \(map(.honest_groups) | add) groups verified, \(map(.honest_rejected) | add) rejected; \(map(.metrics.tokens) | add) tokens, \(map(.metrics.borderline) | add) BORDERLINE (at most \(map(.metrics.borderline_member_max // 0) | max) in one member, in the runs that record it); largest log-prob difference \(map(.metrics.logprob_err_max) | max); verification \(map(.metrics.verify_s) | add) s, recompute forwards \(map(.metrics.recompute_s) | add) s, training \(map(.metrics.train_s) | add) s"' "$OUT"/*.json
  echo "engine | threads | groups | rejected | tokens | BORDERLINE | largest log-prob difference"
  jq -rs '[.[] | select(.mode == "none")] | group_by((.bin | split("/") | .[-2]) + " \(.threads)") | .[] |
    "\(.[0].bin | split("/") | .[-2]) | \(.[0].threads) | \(map(.honest_groups) | add) | \(map(.honest_rejected) | add) | \(map(.metrics.tokens) | add) | \(map(.metrics.borderline) | add) | \(map(.metrics.logprob_err_max) | max)"' "$OUT"/*.json
  echo "slots | groups | rejected | BORDERLINE | largest log-prob difference"
  jq -rs '[.[] | select(.mode == "none")] | group_by(.slots) | .[] |
    "\(.[0].slots) | \(map(.honest_groups) | add) | \(map(.honest_rejected) | add) | \(map(.metrics.borderline) | add) | \(map(.metrics.logprob_err_max) | max)"' "$OUT"/*.json
  echo "cost, runs recording borderline_member_max: engine | threads | train_s | recompute_s | verify_s | recompute/train | verify/recompute"
  jq -rs '[.[] | select(.mode == "none" and .metrics.borderline_member_max != null)] | group_by((.bin | split("/") | .[-2]) + " \(.threads)") | .[] |
    (map(.metrics.train_s) | add) as $t | (map(.metrics.recompute_s) | add) as $r | (map(.metrics.verify_s) | add) as $v |
    "\(.[0].bin | split("/") | .[-2]) | \(.[0].threads) | \($t) | \($r) | \($v) | \($r / $t) | \($v / $r)"' "$OUT"/*.json
  echo "mode | checks | groups submitted | rejected | trained | by | tokens until detection (median)"
  jq -rs '.[] | select(.mode != "none") |
    "\(.mode) | \(if (.flags // "") == "" then "all" else "token only" end) | \(.adv_submitted) | \(.adv_rejected) | \(.adv_trained) | \(.reasons | to_entries | map("\(.key) \(.value)") | join(", ")) | \(if (.tokens_until | length) > 0 then (.tokens_until | sort | .[(length - 1) / 2 | floor]) else "-" end)"' "$OUT"/*.json
} | tee "$OUT/summary.txt"
