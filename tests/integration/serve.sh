#!/usr/bin/env bash
# The networked loop end to end on loopback: `longhaul serve` with two `longhaul worker`s, one of
# them behind `longhaul netem` (60 ms round trip, 1% emulated drops), and a third that joins
# late and catches up through a keyframe. Checks: training progresses to --steps; every worker's
# weights hash to the published manifests (patches apply bit for bit); bad requests get 4xx with
# a JSON error and the server stays up; /metrics and /v1/status answer; then kill -9 of the
# server at random moments (10 times) with workers running, and after each restart the ledger
# shows every accepted group trained at most once in the live history (lh_ledger_audit's rules,
# checked here with SQL), and at the end every group a worker saw answered 202 is trained or
# dropped. Everything started is stopped on exit.
# Usage: serve.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
. "$(dirname "$0")/lib.bash"
lh_setup serve
fail_detail() {
  [ -f "$TMP/run/ledger.sqlite" ] && sqlite3 "$TMP/run/ledger.sqlite" \
    "SELECT 'groups in state ' || state || ': ' || count(*) FROM groups GROUP BY state"
}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$TMP"
ENV=sort:count=3,digits=1
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1
"$BIN" sft --model m0 --env $ENV --steps 40 --batch 16 --log-every 40 --out base >/dev/null 2>&1
"$BIN" keygen --out trainer.key >/dev/null 2>&1

PORT=0
declare -A WORKER_PID
start_serve() { # steps; the first start picks a free port, restarts keep it
  lh_serve serve.log port --run run --model base --env $ENV --key trainer.key \
    --listen "127.0.0.1:$PORT" \
    --steps "$1" --prompts 3 --group 4 --max-new 8 --max-staleness 4 --keyframe-every 4 \
    --lease-s 5
  PORT=$(cat port)
}
start_worker() { # name upstream_port
  lh_worker "http://127.0.0.1:$2" "$1"
  WORKER_PID[$1]=$WORKER
}

# ---------------------------------------------------------------- training progresses
start_serve 40
lh_netem netem "$PORT" --delay 30 --drop 0.01
NPORT=$NETEM_PORT
start_worker wa "$PORT"
start_worker wb "$NPORT"

# bad requests while it runs: 4xx with a JSON error, and the server stays up
code=$(curl -s -o bad.json -w '%{http_code}' -X POST --data 'garbage' "http://127.0.0.1:$PORT/v1/leases")
[ "$code" = 401 ] && grep -q '"code":"bad_auth"' bad.json || fail "unsigned lease: $code $(cat bad.json)"
code=$(curl -s -o bad.json -w '%{http_code}' "http://127.0.0.1:$PORT/v1/nothing")
[ "$code" = 404 ] || fail "unknown path: $code"
code=$(curl -s -o bad.json -w '%{http_code}' -X POST -H 'Content-Length: 999999999' \
  --data-binary @/dev/null "http://127.0.0.1:$PORT/v1/rollouts?lease=1&group=1")
[ "$code" = 413 ] || fail "oversized body: $code"
code=$(curl -s -o bad.json -w '%{http_code}' "http://127.0.0.1:$PORT/v1/blobs/zz")
[ "$code" = 404 ] || fail "bad blob name: $code"
code=$(curl -s -o bad.json -w '%{http_code}' -X DELETE "http://127.0.0.1:$PORT/v1/status")
[ "$code" = 405 ] || fail "DELETE /v1/status: $code"
curl -sf "http://127.0.0.1:$PORT/metrics" >metrics.txt || fail "/metrics did not answer"
grep -q '^longhaul_policy_version ' metrics.txt || fail "/metrics has no longhaul_policy_version"
promtool check metrics <metrics.txt >promtool.log 2>&1 || fail "promtool: $(cat promtool.log)"
curl -sf "http://127.0.0.1:$PORT/v1/status" >status.json || fail "/v1/status did not answer"
# the staleness bound asked for, and a lease window of 2 to 32 updates' worth (3 groups each)
python3 - status.json <<'PY' || fail "/v1/status: $(cat status.json)"
import json, sys
s = json.load(open(sys.argv[1]))
assert "workers" in s and s["max_staleness"] == 4, s
assert 6 <= s["lease_window"] <= 96 and s["lease_window"] % 3 == 0, s
PY

wait "$SERVE" || fail "serve exited with $?"
[ "$(wc -l <run/metrics.jsonl)" -eq 40 ] ||
  fail "metrics.jsonl has $(wc -l <run/metrics.jsonl) lines, not 40"
# the lease window follows the measured times, within its bounds, whatever the staleness bound
python3 - run/metrics.jsonl <<'PY' || fail "lease_window in metrics.jsonl"
import json, sys
w = [json.loads(l)["lease_window"] for l in open(sys.argv[1])]
assert all(6 <= x <= 96 and x % 3 == 0 for x in w), w
PY

# the kept weights are bounded in bytes too: the tiny model's 1.6 MB a version, 5 MB hold 3
# versions, so --max-staleness 16 becomes 2, said at the start; 1 MB holds none and is refused
lh_serve kept.log kept.port --run kept --model base --env $ENV --key trainer.key \
  --max-staleness 16 --max-kept-mb 5 --steps 1
grep -q "staleness bound is 2 versions, not --max-staleness 16" kept.log ||
  fail "no warning of the lowered bound: $(cat kept.log)"
curl -sf "$URL/v1/status" | grep -q '"max_staleness": *2[,}]' ||
  fail "/v1/status of --max-kept-mb 5 does not say max_staleness 2"
kill -TERM "$SERVE"
wait "$SERVE" 2>/dev/null || true
if "$BIN" serve --run kept1 --model base --env $ENV --key trainer.key --max-kept-mb 1 \
  --steps 1 >kept1.log 2>&1; then fail "serve --max-kept-mb 1 started"; fi
grep -q "holds not even the newest version's weights" kept1.log || fail "$(cat kept1.log)"

# each worker holds a version the ledger published, bit for bit (its slab hash)
holds() { # worker: ok when DIR/version's hash is the ledger's for that version
  [ -s "$1/version" ] || return 1
  local v h
  read -r v h <"$1/version"
  [ "$(sqlite3 run/ledger.sqlite "SELECT lower(hex(slab_hash)) FROM versions WHERE version = $v")" = "$h" ]
}
for w in wa wb; do holds $w || fail "$w: $(cat $w/version 2>/dev/null) is not a published version"; done

# a late worker: starts from nothing and catches up through a keyframe (every 4 versions),
# behind a link that resets every connection after 100 kB: the pieces of the ~1.1 MB snapshot
# that it fetches at once (8 connections, ~140 kB each) are cut, and it resumes the snapshot
# (Range) on its own connection, 100 kB a try
start_serve 1000
lh_netem netem-reset "$PORT" --reset-after 100000
RESET_NETEM=$NETEM
start_worker wc "$NETEM_PORT"
for _ in $(seq 1 300); do
  [ -s wc/version ] && [ "$(cut -d' ' -f1 wc/version)" -gt 41 ] && break
  sleep 0.1
done
holds wc || fail "the late worker holds $(cat wc/version 2>/dev/null)"
late=$(cut -d' ' -f1 wc/version)
[ "$late" -gt 41 ] || fail "the late worker did not catch up ($late)"
# its route began at a keyframe after version 0: that snapshot is in its blob store
kf=0
for h in $(sqlite3 run/ledger.sqlite "SELECT lower(hex(hash)) FROM blobs WHERE kind = 0 AND version > 0"); do
  [ -f "wc/blobs/$h" ] && kf=1
done
[ "$kf" = 1 ] || fail "the late worker did not start from a keyframe after version 0"
# chain=1 from a version two before a keyframe starts right after it, not at the keyframe (a
# worker one version behind a keyframe takes the patch from its version, not the snapshot);
# with nothing held, it starts at the newest keyframe
k=$(sqlite3 run/ledger.sqlite "SELECT max(version) FROM blobs WHERE kind = 0 AND version >= 2")
curl -s "http://127.0.0.1:$PORT/v1/policy?after=$((k - 2))&chain=1" >chain.txt
first=$(head -1 chain.txt | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
[ "$first" = $((k - 1)) ] || fail "chain=1 after $((k - 2)) began at version $first, expected $((k - 1))"
kf_before=$(sqlite3 run/ledger.sqlite "SELECT max(version) FROM blobs WHERE kind = 0")
curl -s "http://127.0.0.1:$PORT/v1/policy?after=-1&chain=1" >chain.txt
first=$(head -1 chain.txt | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
kf_after=$(sqlite3 run/ledger.sqlite "SELECT max(version) FROM blobs WHERE kind = 0")
[ "$first" = "$kf_before" ] || [ "$first" = "$kf_after" ] ||
  fail "chain=1 with nothing held began at $first, not the newest keyframe ($kf_before..$kf_after)"
kill -TERM "$RESET_NETEM"
wait "$RESET_NETEM" 2>/dev/null || true
grep -q 'reset=[1-9]' netem-reset.log || fail "the late worker's link reset nothing: $(tail -1 netem-reset.log)"
kill -TERM "$SERVE"
wait "$SERVE" || true
sqlite3 run/ledger.sqlite 'SELECT count(*) FROM versions' >nversions

# ---------------------------------------------------------------- kill -9 at random moments
before=$(sqlite3 run/ledger.sqlite "SELECT count(*) FROM groups WHERE state = 3")
start_serve 1000
for i in $(seq 1 10); do
  sleep "0.$((RANDOM % 9 + 1))"
  kill -9 "$SERVE" 2>/dev/null || true
  wait "$SERVE" 2>/dev/null || true
  start_serve 1000
  if [ "$i" = 5 ]; then # a worker killed while it holds leases: it loses them, nothing else
    held="SELECT g.id FROM groups g JOIN leases l ON g.lease = l.id JOIN workers w ON l.worker = w.id WHERE w.name = 'wb' AND g.state = 0"
    # what wb holds is read before the kill (a group it submits in between counts as sent);
    # up to 60 s: under load, wb behind its lossy link once held none within 15 s
    for _ in $(seq 1 1200); do
      sqlite3 run/ledger.sqlite "$held" >held.txt
      [ -s held.txt ] && break
      sleep 0.05
    done
    kill -9 "${WORKER_PID[wb]}" 2>/dev/null || true
    start_worker wb "$NPORT"
  fi
done
sleep 7 # longer than --lease-s: the killed worker's leases expire and their tasks are leased again
kill -TERM "$SERVE"
wait "$SERVE" || true
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
sleep 1

for w in wa wb wc; do holds $w || fail "$w: $(cat $w/version) is not a published version"; done
# the ledger: no group trained twice in the live log, every TRAINED group has exactly one live
# event, and no group trained at a version beyond the newest checkpoint's
q() { sqlite3 run/ledger.sqlite "$1"; }
twice=$(q "SELECT count(*) FROM (SELECT grp FROM training_log WHERE undone_by IS NULL GROUP BY grp HAVING count(*) > 1)")
[ "$twice" = 0 ] || fail "$twice groups trained twice in the live history"
orphans=$(q "SELECT count(*) FROM groups g WHERE g.state IN (3, 4) AND NOT EXISTS (SELECT 1 FROM training_log t WHERE t.grp = g.id AND t.undone_by IS NULL)")
[ "$orphans" = 0 ] || fail "$orphans trained or dropped groups without a live training event"
undone=$(q "SELECT count(*) FROM training_log WHERE undone_by IS NOT NULL")
trained=$(q "SELECT count(*) FROM groups WHERE state = 3")
[ "$trained" -gt "$before" ] || fail "no group trained during the restarts ($trained, $before before)"
# the ledger stays bounded: no body of a group trained before the oldest checkpoint kept (3)
latest=$(q "SELECT max(version) FROM versions")
old=$(q "SELECT count(*) FROM bodies b JOIN groups g ON g.id = b.grp WHERE g.state IN (3, 4) AND g.trained_at <= $latest - 3")
[ "$old" = 0 ] || fail "$old bodies of groups trained long ago are still in the ledger"
[ -s held.txt ] || fail "the killed worker held no lease"
ids=$(paste -sd, held.txt)
still=$(q "SELECT count(*) FROM groups WHERE id IN ($ids) AND state = 0")
[ "$still" = 0 ] || fail "$still of the killed worker's leased groups are still leased"
expired=$(q "SELECT count(*) FROM groups WHERE id IN ($ids) AND state = 5")
resent=$(q "SELECT count(*) FROM groups WHERE id IN ($ids) AND state IN (1, 3, 4)")
grep -q 'groups generated before a restart will be sent\|made a new key' wb.log ||
  fail "the restarted worker did not start"
echo "serve.sh: ok ($(cat nversions) versions before the restarts, $trained groups trained, $undone training events undone by 10 restarts, of the killed worker's $(wc -l <held.txt) leased groups $expired expired and $resent were sent after its restart)"
