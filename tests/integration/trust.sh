#!/usr/bin/env bash
# Rollout verification against a real `longhaul serve` on loopback: two honest workers run
# throughout while cheating workers (`worker --adversary MODE`) come and go, a few modes at a
# time. Checks: no group of a detectable cheat is trained on; no honest group is rejected; each
# cheat's refusal is in the ledger with its reason (and, for verification, the failing member
# and position); a key past --ban-after gets 403 banned and its worker stops; an --allow-keys
# server refuses other keys with 403 not_allowed; the server stays responsive (under
# slowloris too) and honest groups keep being trained. Everything started is stopped on exit.
# Usage: trust.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.log; do echo "--- $f" >&2; tail -4 "$f" >&2; done
  [ -f "$TMP/run/ledger.sqlite" ] && sqlite3 "$TMP/run/ledger.sqlite" \
    "SELECT w.name || ': ' || g.state || ' ' || g.reason FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker WHERE g.state = 2 LIMIT 40" >&2
  exit 1
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
cd "$TMP"
ENV=sort:count=3,digits=1
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1
"$BIN" sft --model m0 --env $ENV --steps 40 --batch 16 --log-every 40 --out base >/dev/null 2>&1
"$BIN" keygen --out trainer.key >/dev/null 2>&1

"$BIN" serve --run run --model base --env $ENV --key trainer.key --port-file port \
  --steps 100000 --max-wall 240 --prompts 3 --group 4 --max-new 12 --max-staleness 4 \
  --lease-s 5 --ban-after 3 >serve.log 2>&1 &
SERVE=$!
PIDS+=("$SERVE")
for _ in $(seq 1 200); do [ -s port ] && break; sleep 0.05; done
[ -s port ] || fail "serve did not write its port"
PORT=$(cat port)
URL=http://127.0.0.1:$PORT
worker() { # name [mode]
  "$BIN" worker --server "$URL" --key "$1.key" --trust-key trainer.key.pub --dir "$1" --slots 4 \
    --threads 1 --name "$1" ${2:+--adversary "$2"} >>"$1.log" 2>&1 &
  PIDS+=("$!")
  LAST=$!
}
q() { sqlite3 run/ledger.sqlite "$1"; }
J="SELECT w.name AS name, g.state AS state, g.reason AS reason FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker"
count() { q "SELECT count(*) FROM ($J) WHERE $1"; }
worker wa
worker wb
for _ in $(seq 1 300); do [ "$(count "name IN ('wa','wb') AND state = 3")" -ge 6 ] && break; sleep 0.1; done
[ "$(count "name IN ('wa','wb') AND state = 3")" -ge 6 ] || fail "honest workers trained nothing"

# The cheats, a few at a time: each runs until the server has decided on two of its groups and
# rejected one (or 50 s), then stops. decided = rejected, trained or dropped.
declare -A APID
run_batch() {
  for m in "$@"; do
    worker "x-$m" "$m"
    APID[$m]=$LAST
  done
  for _ in $(seq 1 250); do
    local pending=0
    for m in "$@"; do
      case $m in oversized | slowloris) continue ;; esac
      [ "$(count "name = 'x-$m' AND state IN (2, 3, 4)")" -ge 2 ] || pending=1
      # a cheat that sometimes sends an honest group (best-of-n, version, replay, quant8, ...)
      # runs until one of its groups is rejected; reward claims are never rejected
      [ "$m" = reward ] || [ "$(count "name = 'x-$m' AND state = 2")" -ge 1 ] || pending=1
    done
    [ "$pending" = 0 ] && break
    sleep 0.2
  done
  for m in "$@"; do kill -TERM "${APID[$m]}" 2>/dev/null || true; done
  for m in "$@"; do wait "${APID[$m]}" 2>/dev/null || true; done
}
trained0=$(count "name IN ('wa','wb') AND state = 3")
run_batch tokens temperature logprobs other-model
run_batch quant4 best-of-n version top-p
run_batch prompt drop-member replay garbage
run_batch reward dup-member quant8
# slowloris and oversized bodies: the server goes on answering and training
worker x-slowloris slowloris
LORIS=$LAST
worker x-oversized oversized
BIG=$LAST
sleep 3
t0=$(date +%s%N)
curl -sf -m 5 "$URL/v1/status" >/dev/null || fail "/v1/status did not answer under slowloris"
t1=$(date +%s%N)
[ $(((t1 - t0) / 1000000)) -lt 2000 ] || fail "/v1/status took $(((t1 - t0) / 1000000)) ms under slowloris"
before=$(count "name IN ('wa','wb') AND state = 3")
sleep 6
after=$(count "name IN ('wa','wb') AND state = 3")
[ "$after" -gt "$before" ] || fail "no honest group trained during slowloris ($before, $after)"
for _ in $(seq 1 600); do grep -q 'HTTP 413' x-oversized.log && break; sleep 0.1; done
kill -TERM "$LORIS" "$BIG" 2>/dev/null || true
wait "$LORIS" "$BIG" 2>/dev/null || true
grep -q 'HTTP 413' x-oversized.log || fail "the oversized body did not get 413: $(tail -2 x-oversized.log)"

# ---------------------------------------------------------------- what the ledger says
honest_rej=$(count "name IN ('wa','wb') AND state = 2")
[ "$honest_rej" = 0 ] || fail "$honest_rej honest groups rejected"
trained1=$(count "name IN ('wa','wb') AND state = 3")
[ "$trained1" -gt "$trained0" ] || fail "honest groups stopped being trained"
# every detectable cheat: nothing trained, at least one rejection, for the expected reason
expect() { # mode reason-pattern [most trained: 0, or 'some' for any]
  local m=$1 pat=$2 most=${3:-0} tr rej
  tr=$(count "name = 'x-$m' AND state = 3")
  rej=$(count "name = 'x-$m' AND state = 2 AND reason GLOB '$pat'")
  [ "$most" = some ] || [ "$tr" -le "$most" ] || fail "$m: $tr groups trained on"
  [ "$rej" -ge 1 ] || fail "$m: no group rejected for '$pat'"
}
expect tokens 'token: member * position *: * (after * of * tokens)'
expect temperature '[lt]o[gk]*: member *'
expect logprobs 'logprob: member 0 position 0: *'
expect other-model '[tl]o[kg]*: member *'
expect quant4 '[tl]o[kg]*: member *'
# best-of-n submits the leased seed's own group when it is the most likely of the 4: that group
# is honest. A version lie passes when the claimed version's weights equal the used one's (this
# policy gets reward 0 and does not move); it is refused when that version is not published.
expect best-of-n 'token: member *' some
expect version '*version*' some
expect prompt 'prompt: *'
expect drop-member 'shape: *'
expect replay '[st][ea][es][dk]: *' 1 # its first body is the honest original
expect garbage 'bad_body: *'
# top-p 0.95 changes a token only where it drops one, dup-member is caught only when the copy is
# not what its own stream gives, and quant8 is caught on most groups, not all
# (docs/SECURITY.md): only that each is caught at least once
expect top-p '[lt]o[gk]*: member *' some
expect dup-member 'token: member *' some
expect quant8 '[lt]o[gk]*: member *' some
# reward claims: the server scores every group itself, so the claim is simply overwritten
[ "$(count "name = 'x-reward' AND state = 2")" = 0 ] || fail "a reward-claiming group was rejected"

# bans: three rejections and the key is refused (403 banned); its worker stops by itself
worker x-ban garbage
for _ in $(seq 1 600); do kill -0 "$LAST" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$LAST" 2>/dev/null || fail "the banned worker did not stop"
grep -q 'HTTP 403 banned' x-ban.log || fail "the banned worker was not told 403 banned: $(tail -2 x-ban.log)"
[ "$(count "name = 'x-ban' AND state = 2")" -ge 3 ] || fail "x-ban was banned before three rejections"
curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="banned"} [1-9]' ||
  fail "/metrics counts no banned request"
curl -sf "$URL/metrics" | grep -q '^longhaul_groups_refuted_total [1-9]' ||
  fail "/metrics counts no refuted group"
kill -TERM "$SERVE"
wait "$SERVE" || true
grep -q '"verify_s"' run/metrics.jsonl || fail "metrics.jsonl has no verify_s"

# ---------------------------------------------------------------- allowlist and rate limits
cat wa.key.pub >allow.txt
"$BIN" serve --run run2 --model base --env $ENV --key trainer.key --port-file port2 \
  --steps 100000 --max-wall 60 --prompts 2 --group 4 --max-new 8 --allow-keys allow.txt \
  --rate-limit 0.5 >serve2.log 2>&1 &
SERVE2=$!
PIDS+=("$SERVE2")
for _ in $(seq 1 200); do [ -s port2 ] && break; sleep 0.05; done
URL=http://127.0.0.1:$(cat port2)
worker wa
worker wb
wait "$LAST" 2>/dev/null || true
grep -q 'HTTP 403 not_allowed' wb.log || fail "a key not on the allowlist was served: $(tail -2 wb.log)"
limited=0
for _ in $(seq 1 100); do
  curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="rate_limited"} [1-9]' &&
    limited=1 && break
  sleep 0.1
done
[ "$limited" = 1 ] || fail "the allowed worker was never rate limited at 0.5 requests/s"
kill -TERM "$SERVE2"
wait "$SERVE2" || true
! grep -l 'Sanitizer' ./*.log >/dev/null 2>&1 || fail "a sanitizer report: $(grep -l Sanitizer ./*.log)"
trained_x=$(q "SELECT name || ' ' || count(*) FROM ($J) WHERE name LIKE 'x-%' AND state = 3 GROUP BY name" | paste -sd, -)
echo "trust.sh: ok ($trained1 honest groups trained, 0 rejected; $(q "SELECT count(*) FROM groups WHERE state = 2") cheating groups rejected; trained (as docs/SECURITY.md allows): ${trained_x:-none})"
