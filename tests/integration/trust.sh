#!/usr/bin/env bash
# Rollout verification against a real `longhaul serve` on loopback: two honest workers run
# throughout while cheating workers (`worker --adversary MODE`) come and go, a few modes at a
# time. Checks: no group of a detectable cheat is trained on; no honest group is rejected; each
# cheat's refusal is in the ledger with its reason (and, for verification, the failing member
# and position); selective submission gets 403 abandoning; a key past --ban-after gets 403
# banned, its worker stops, and the ban holds after a restart of the server; rejections the
# server caused (an exec environment that fails to score) never ban; an --allow-keys
# server refuses other keys with 403 not_allowed; the server stays responsive (under
# slowloris too): an honest worker's submission round trips under attack stay within a bound
# of those measured before it; and the trained model improves on held-out tasks (`longhaul
# eval`, paired against the base, sampled at temperature 1). Everything started is stopped on
# exit.
# Usage: trust.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
. "$(dirname "$0")/lib.bash"
lh_setup trust
fail_detail() {
  [ -f "$TMP/run/ledger.sqlite" ] && sqlite3 "$TMP/run/ledger.sqlite" \
    "SELECT w.name || ': ' || g.state || ' ' || g.reason FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker WHERE g.state = 2 LIMIT 40"
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
cd "$TMP"
T0=$(date +%s)
# serve's state for the phase lines: how long /v1/status takes to answer, or that serve exited,
# so a server that slows down over the phases shows it
serve_state() {
  [ -n "${SERVE:-}" ] || return 0
  lh_alive "$SERVE" || { echo " [serve exited: $(tail -1 serve.log)]"; return 0; }
  curl -s -m 5 -o /dev/null -w ' [/v1/status %{http_code} in %{time_total} s]' "$URL/v1/status" || true
}
phase() { echo "trust.sh: $(($(date +%s) - T0)) s: $*$(serve_state)" >&2; }
# /v1/status must answer 200 within 2 s; when it does not, the failure says whether serve had
# exited, and if not, where each of its threads waits (gdb, into serve-stacks.txt)
status_answers() { # when
  local t0 t1 code
  lh_alive "$SERVE" || fail "serve exited before /v1/status $1: $(tail -2 serve.log)"
  t0=$(date +%s%N)
  code=$(curl -s -m 5 -o status.json -w '%{http_code}' "$URL/v1/status") || true
  t1=$(date +%s%N)
  if [ "$code" != 200 ] || [ $(((t1 - t0) / 1000000)) -ge 2000 ]; then
    if lh_alive "$SERVE" && command -v gdb >/dev/null; then
      gdb -p "$SERVE" -batch -ex "thread apply all bt" >serve-stacks.txt 2>&1 || true
      echo "--- serve's threads (serve-stacks.txt)" >&2
      grep -E '^(Thread|#[0-9]+ )' serve-stacks.txt | grep -v -E ' in (__|pthread_|clone|start_thread)' >&2 || true
    fi
    fail "/v1/status $1: HTTP ${code:-none} in $(((t1 - t0) / 1000000)) ms (200 within 2000 ms expected): $(head -c 300 status.json 2>/dev/null)"
  fi
  phase "/v1/status $1: 200 in $(((t1 - t0) / 1000000)) ms"
}
ENV=sort:count=3,digits=1
# a base that learns within the test: 110 sft steps (greedy pass@1 about 0.8, sampled about 0.5)
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1
"$BIN" sft --model m0 --env $ENV --steps 110 --batch 32 --log-every 110 --threads 1 \
  --out base >/dev/null 2>&1
"$BIN" keygen --out trainer.key >/dev/null 2>&1

# --max-wall: serve is stopped by the test; this only ends one the test could not stop (a killed
# test). It is the test's own limit under TSan (ctest's TIMEOUT, tests/CMakeLists.txt), where
# the whole test took 20 minutes on a loaded machine; a serve that stopped at 240 s was what
# the slowloris check met there four times (no answer: a refused connection).
# --max-staleness: under TSan, generation (instrumented kernels) is slower against training
# (uninstrumented OpenBLAS) than in the other builds, so the trainer moves on by more versions
# while a worker makes a group; at 4, the slower cheats' groups (best-of-n makes 4 for each it
# sends) arrived 8-11 versions old and were dropped unverified, and the test waited for a
# rejection that never came. 12 keeps about the same window in time.
# SLOW: the waits below for workers and servers are that many times longer under TSan (seen: a
# fresh worker at nice 10 on a loaded machine took 40 s to sync and lease, 60 s to send the
# oversized body); what they wait for is the same.
STALE=4 SLOW=1
case ${LH_BUILD_KIND:-} in *thread*) STALE=12 SLOW=3 ;; esac
SERVE_ARGS=(--run run --model base --env $ENV --key trainer.key --steps 100000 --max-wall 1500
  --prompts 4 --group 8 --max-new 12 --max-staleness $STALE --lease-s 5 --lr 1e-4 --loss tis
  --ban-after 3 --abandon-after 8 --threads 1)
# a restarted serve first rebuilds the weights of its staleness window from the blobs: under
# TSan, with 13 versions and each rebuilt from its keyframe on its own, it once wrote no port
# within 30 s
LH_SERVE_WAIT_S=$((20 * SLOW))
start_serve() { # port-file
  lh_serve serve.log "$1" "${SERVE_ARGS[@]}"
}
phase "sft done"
start_serve port
# Workers, honest and cheating, run at a lower priority: on a real network they run on machines
# of their own, and here they must not starve the server of the CPU that the latency checks
# measure (the probes below run at the server's). All at the same one: under TSan generation is
# the bottleneck (the trainer's matrix products run in uninstrumented OpenBLAS), and cheats below
# the honest workers' priority got almost no CPU, so each group they sent was past
# --max-staleness when it arrived and was dropped unverified, and no cheat was ever caught.
LH_WORKER_NICE=10
worker() { # name [mode]
  lh_worker "$URL" "$1" --threads 1 ${2:+--adversary "$2"}
  LAST=$WORKER
}
# An honest worker that submits 8 groups and stops; prints its submission round trips (ms):
# "p50 p90".
probe() { # name
  timeout $((60 * SLOW)) "$BIN" worker --server "$URL" --key "$1.key" --trust-key trainer.key.pub \
    --dir "$1" --slots 8 --threads 1 --name "$1" --max-groups 8 >"$1.log" 2>&1 ||
    fail "the probe $1 did not submit 8 groups: $(tail -2 "$1.log")"
  sed -n 's/.*round trip p50 \([0-9]*\) ms, p90 \([0-9]*\) ms.*/\1 \2/p' "$1.log"
}
q() { sqlite3 -cmd ".timeout 10000" run/ledger.sqlite "$1"; } # the server writes meanwhile
J="SELECT w.name AS name, g.state AS state, g.reason AS reason FROM groups g JOIN leases l ON l.id = g.lease JOIN workers w ON w.id = l.worker"
count() { q "SELECT count(*) FROM ($J) WHERE $1"; }
worker wa
worker wb
for _ in $(seq 1 $((300 * SLOW))); do [ "$(count "name IN ('wa','wb') AND state = 3")" -ge 6 ] && break; sleep 0.1; done
[ "$(count "name IN ('wa','wb') AND state = 3")" -ge 6 ] || fail "honest workers trained nothing"
# honest submission latency with no cheat around
read -r Q50 Q90 <<<"$(probe wq)"
[ -n "${Q90:-}" ] || fail "the quiet probe printed no round trips: $(tail -2 wq.log)"

# The cheats, a few at a time: each runs until the server has decided on one of its groups and
# rejected one (or 50 s), then stops. decided = rejected, trained or dropped.
declare -A APID
run_batch() {
  for m in "$@"; do
    worker "x-$m" "$m"
    APID[$m]=$LAST
  done
  local waiting="" open
  for _ in $(seq 1 $((250 * SLOW))); do
    waiting=""
    for m in "$@"; do
      case $m in oversized | slowloris) continue ;; esac
      open=0
      if [ "$m" = selective ]; then # it submits honest groups: refused leases, not groups
        grep -q 'HTTP 403 abandoning' "x-$m.log" || open=1
      else
        [ "$(count "name = 'x-$m' AND state IN (2, 3, 4)")" -ge 1 ] || open=1
        # a cheat that sometimes sends an honest group (best-of-n, version, replay, quant8, ...)
        # runs until one of its groups is rejected; reward claims are never rejected
        [ "$open" = 1 ] || [ "$m" = reward ] || [ "$(count "name = 'x-$m' AND state = 2")" -ge 1 ] || open=1
      fi
      [ "$open" = 0 ] || waiting="$waiting $m"
    done
    [ -z "$waiting" ] && break
    lh_alive "$SERVE" || fail "serve exited while the cheats$waiting ran: $(tail -1 serve.log)"
    if [ $((SECONDS % 5)) = 0 ] && [ "$SECONDS" != "${SHOWN:-}" ]; then
      SHOWN=$SECONDS
      # what became of each waiting cheat's groups so far, by state (dropped: too stale)
      local states=""
      for m in $waiting; do
        states="$states $m:$(q "SELECT coalesce(sum(state = 1), 0) || '/' || coalesce(sum(state = 2), 0) || '/' || coalesce(sum(state = 3), 0) || '/' || coalesce(sum(state = 4), 0) FROM ($J) WHERE name = 'x-$m'")"
      done
      phase "waiting for (leased/rejected/trained/dropped)$states"
    fi
    sleep 0.2
  done
  for m in "$@"; do kill -TERM "${APID[$m]}" 2>/dev/null || true; done
  for m in "$@"; do wait "${APID[$m]}" 2>/dev/null || true; done
}
trained0=$(count "name IN ('wa','wb') AND state = 3")
# an honest probe submits while the first cheats run
probe wr1 >probe1.txt &
PROBE1=$!
phase "cheats: tokens temperature logprobs other-model quant4"
run_batch tokens temperature logprobs other-model quant4
wait "$PROBE1" || true
read -r A50 A90 <probe1.txt || true
phase "cheats: best-of-n version top-p prompt drop-member"
run_batch best-of-n version top-p prompt drop-member
phase "cheats: replay garbage reward dup-member quant8"
run_batch replay garbage reward dup-member quant8
# selective submission holds its abandoned leases until they expire, and they count toward the
# server's backpressure (docs/SECURITY.md): it runs last, so it does not slow the others
phase "cheats: selective truncate"
run_batch selective truncate
# slowloris and oversized bodies: the server goes on answering and training
phase "slowloris and oversized bodies"
worker x-slowloris slowloris
LORIS=$LAST
worker x-oversized oversized
BIG=$LAST
sleep 3
status_answers "under slowloris"
before=$(count "name IN ('wa','wb') AND state = 3")
read -r S50 S90 <<<"$(probe wr2)"
sleep 1
after=$(count "name IN ('wa','wb') AND state = 3")
[ "$after" -gt "$before" ] || fail "no honest group trained during slowloris ($before, $after)"
for _ in $(seq 1 $((600 * SLOW))); do grep -q 'HTTP 413' x-oversized.log && break; sleep 0.1; done
kill -TERM "$LORIS" "$BIG" 2>/dev/null || true
wait "$LORIS" "$BIG" 2>/dev/null || true
grep -q 'HTTP 413' x-oversized.log || fail "the oversized body did not get 413: $(tail -2 x-oversized.log)"
# honest latency under attack: within 10x of the quiet figures plus 1 s (p50) and 2 s (p90), as
# the shared machine's load moves between the phases; a server that stalls on slow or oversized
# requests (a connection's timeout is 30 s) fails it
for w in "wr1 ${A50:-} ${A90:-}" "wr2 ${S50:-} ${S90:-}"; do
  read -r name p50 p90 <<<"$w"
  [ -n "${p90:-}" ] || fail "$name printed no round trips: $(tail -2 "$name.log")"
  [ "$p50" -le $((10 * Q50 + 1000)) ] && [ "$p90" -le $((10 * Q90 + 2000)) ] ||
    fail "$name: honest round trips p50 $p50 ms, p90 $p90 ms under attack; $Q50, $Q90 ms before"
done

phase "what the ledger says"
# ---------------------------------------------------------------- what the ledger says
honest_rej=$(count "name IN ('wa','wb','wq','wr1','wr2') AND state = 2")
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
expect truncate 'stop: member * position *: * tokens of at most 12, and no stop token at the end*'
# selective submission: only the most likely of every 4 groups was sent (honest groups, so they
# may be trained), the others expired, and the key gets no more leases
grep -q 'HTTP 403 abandoning' x-selective.log || fail "selective: never refused: $(tail -2 x-selective.log)"
# honest workers whose leases ran out under this load (5 s leases) are not refused: what they
# submit late, and what they submit on time, keeps them under the bound
! grep -l 'abandoning' wa.log wb.log wq.log wr1.log wr2.log >/dev/null 2>&1 ||
  fail "an honest worker was refused for abandoning: $(grep -l abandoning wa.log wb.log wq.log wr1.log wr2.log)"
expect logprobs 'logprob: member 0 position 0: *'
# other weights and another temperature: a group passes when, at every position of every
# member, the seed selects the same token under both and the log-probs differ by less than
# logprob_tol (a policy confident everywhere: it happened once in an ASan run; docs/SECURITY.md)
expect temperature '[lt]o[gk]*: member *' 1
expect other-model '[tl]o[kg]*: member *' 1
expect quant4 '[tl]o[kg]*: member *' 1
# best-of-n submits the leased seed's own group when it is the most likely of the 4: that group
# is honest. A version lie is refused when that version is not published (version), else caught
# by the token and log-prob checks under the claimed version's weights (this policy learns, so
# they differ), or passes when an update left the tokens' logits within the tolerances.
expect best-of-n 'token: member *' some
expect version '[tlv][oe][kgr]*' some
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
for _ in $(seq 1 $((600 * SLOW))); do kill -0 "$LAST" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$LAST" 2>/dev/null || fail "the banned worker did not stop"
grep -q 'HTTP 403 banned' x-ban.log || fail "the banned worker was not told 403 banned: $(tail -2 x-ban.log)"
[ "$(count "name = 'x-ban' AND state = 2")" -ge 3 ] || fail "x-ban was banned before three rejections"
curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="banned"} [1-9]' ||
  fail "/metrics counts no banned request"
curl -sf "$URL/metrics" | grep -q '^longhaul_groups_refuted_total [1-9]' ||
  fail "/metrics counts no refuted group"
curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="abandoning"} [1-9]' ||
  fail "/metrics counts no lease refused for abandoning"
# the honest workers train on to 150 updates (a slower machine has made fewer by now) for the
# held-out check below, 80 s at most (after 80 updates the gain ranged from +0.001 to +0.069
# between runs: too close to 0 for a check that must not flake)
for _ in $(seq 1 $((400 * SLOW))); do
  [ "$(grep -c '"reward"' run/metrics.jsonl)" -ge 150 ] && break
  sleep 0.2
done
kill -TERM "$SERVE" "${PIDS[@]:1:2}" 2>/dev/null || true
wait "$SERVE" || true
grep -q '"verify_s"' run/metrics.jsonl || fail "metrics.jsonl has no verify_s"
# the ban is read from the ledger: a restarted server refuses the key at once
phase "restart: the ban holds"
start_serve port-b
worker x-ban garbage
for _ in $(seq 1 $((300 * SLOW))); do kill -0 "$LAST" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$LAST" 2>/dev/null || fail "the banned worker was served after a restart"
[ "$(grep -c 'HTTP 403 banned' x-ban.log)" -ge 2 ] || fail "no 403 banned after the restart: $(tail -2 x-ban.log)"
kill -TERM "$SERVE"
wait "$SERVE" || true

# ---------------------------------------------------------------- the trained model improved
phase "eval"
# paired against the base on 1000 held-out tasks, 4 samples each at temperature 1 (what RL
# trains), the same sampler streams for both (an unchanged model scores exactly +0): the lower
# end of the 95% interval must be above 0
"$BIN" eval --model run --env $ENV --n 1000 --samples 4 --temperature 1 --max-new 12 \
  --compare base --threads 2 --json eval.json >eval.txt 2>&1 || fail "eval: $(tail -2 eval.txt)"
read -r GAIN LO HI STEPS <<<"$(/usr/bin/python3 - <<'PYEOF'
import json
d = json.load(open("eval.json"))["paired"]["pass_at_1"]
steps = sum(1 for l in open("run/metrics.jsonl") if '"reward"' in l)
print(f"{d['mean']:+.3f} {d['lo']:+.3f} {d['hi']:+.3f} {steps}")
PYEOF
)"
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$LO') > 0 else 1)" ||
  fail "the trained model did not improve: pass@1 $GAIN [$LO, $HI] against the base after $STEPS updates"

phase "allowlist and rate limits"
# ---------------------------------------------------------------- allowlist and rate limits
# wa's key among others (the server sorts the list and searches it)
for k in a1 a2 a3; do "$BIN" keygen --out $k.key >/dev/null 2>&1; done
cat a1.key.pub a2.key.pub wa.key.pub a3.key.pub >allow.txt
lh_serve serve2.log port2 --run run2 --model base --env $ENV --key trainer.key \
  --steps 100000 --max-wall $((60 * SLOW)) --prompts 2 --group 4 --max-new 8 --allow-keys allow.txt \
  --rate-limit 0.5
worker wa
worker wb
wait "$LAST" 2>/dev/null || true
grep -q 'HTTP 403 not_allowed' wb.log || fail "a key not on the allowlist was served: $(tail -2 wb.log)"
limited=0
for _ in $(seq 1 $((100 * SLOW))); do
  curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="rate_limited"} [1-9]' &&
    limited=1 && break
  sleep 0.1
done
[ "$limited" = 1 ] || fail "the allowed worker was never rate limited at 0.5 requests/s"
kill -TERM "$SERVE"
wait "$SERVE" || true

# ---------------------------------------------------------------- rejections the worker did not cause
# an exec environment that fails to score every task (a reward of 5): each group is rejected
# with reason env: ..., and none counts toward the ban, even at --ban-after 1
phase "an environment that fails to score"
lh_serve serve3.log port3 --run run3 --model base --key trainer.key --steps 100000 \
  --env "exec:path=/usr/bin/python3 $SRC/tests/fixtures/env/exec_env.py badreward" \
  --max-wall $((60 * SLOW)) --prompts 2 --group 2 --max-new 4 --ban-after 1
worker we
excused=0
for _ in $(seq 1 $((150 * SLOW))); do
  excused=$(sqlite3 run3/ledger.sqlite "SELECT count(*) FROM groups WHERE state = 2 AND reason GLOB 'env: *'")
  [ "$excused" -ge 3 ] && break
  sleep 0.1
done
[ "$excused" -ge 3 ] || fail "the failing environment rejected $excused groups: $(tail -2 serve3.log)"
kill -0 "$LAST" 2>/dev/null || fail "the worker stopped: $(tail -2 we.log)"
! grep -q 'HTTP 403 banned' we.log || fail "a key was banned for the environment's failures"
curl -sf "$URL/metrics" | grep -q '^longhaul_requests_refused_total{why="banned"} 0' ||
  fail "/metrics counts a banned request"
kill -TERM "$SERVE" "$LAST"
wait "$SERVE" || true
! grep -l 'Sanitizer' ./*.log >/dev/null 2>&1 || fail "a sanitizer report: $(grep -l Sanitizer ./*.log)"
trained_x=$(q "SELECT name || ' ' || count(*) FROM ($J) WHERE name LIKE 'x-%' AND state = 3 GROUP BY name" | paste -sd, -)
echo "trust.sh: ok ($trained1 honest groups trained, 0 rejected; $(q "SELECT count(*) FROM groups WHERE state = 2") cheating groups rejected; trained (as docs/SECURITY.md allows): ${trained_x:-none}; honest round trips p50/p90 quiet $Q50/$Q90 ms, with cheats $A50/$A90 ms, under slowloris and oversized bodies $S50/$S90 ms; held-out pass@1 $GAIN [$LO, $HI] after $STEPS updates)"
