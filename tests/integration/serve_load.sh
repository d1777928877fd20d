#!/usr/bin/env bash
# The load generator (bench/serve_load) against a real `longhaul serve --no-verify` on loopback:
# first its probe of the replay defence over HTTP (a signed request sent twice is 409 the second
# time; one signed a window too early or too late is 401 stale_time), then 64 signed clients for
# a few seconds, each one's first group and every 8th after it submitted twice at once on two
# connections. Then, from the ledger and the server's counters: every group answered 202 is in
# the ledger once (accepted, trained or dropped), none is there that was not answered 202,
# none was trained twice, the ledger committed each accepted group once (group commits hold
# the concurrent repeats once), the repeats were answered as repeats, the replay table refused
# nothing but the probe's requests (no honest request under load is refused, none answered
# 503), and serve still answers. Before that, the open loop (--rate) for 2 s, 16 clients at 400
# groups/s offered in all on evenly spaced timetables: exactly 800 submissions fall due, each is
# sent or counted as unsent, every one sent is answered 202, and no latency from the due time is
# below its service time. Speed is not asserted (that is `make bench-serve-load`).
# Usage: serve_load.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
GEN=$(dirname "$BIN")/bench/serve_load
[ -x "$GEN" ] || { echo "FAIL: $GEN is not built" >&2; exit 1; }
. "$(dirname "$0")/lib.bash"
lh_setup serve-load
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$TMP"
echo '{"hidden_size": 16, "num_hidden_layers": 1, "intermediate_size": 32,
       "num_attention_heads": 2, "num_key_value_heads": 1}' >micro.json
"$BIN" init-model --arch qwen2 --preset micro.json --tokenizer chars --seed 1 --out micro >/dev/null 2>&1
"$BIN" keygen --out trainer.key >/dev/null 2>&1
lh_serve serve.log port --run run --model micro --env sort:count=3,digits=1 --key trainer.key \
  --steps 1000000 --prompts 256 --group 2 --max-new 4 --max-staleness 8 --threads 1 \
  --no-verify --max-wall 120

# The open loop first, on a fresh server: after the closed loop its 64 clients' unsent leases
# count against the lease window until they expire (--lease-s), and on a loaded machine the
# window is then full for the open loop's 2 s.
timeout 60 "$GEN" --server "$URL" --clients 16 --seconds 2 --rate 400 --json open.json \
  --ids ids-open.txt >open.txt 2>open.err || fail "serve_load --rate: $(cat open.txt open.err)"
cat open.txt
timeout 120 "$GEN" --server "$URL" --clients 64 --seconds "${LOAD_SECONDS:-4}" --dup-every 8 --pid "$SERVE" \
  --json load.json --ids ids.txt --probe >load.txt 2>load.err ||
  fail "serve_load: $(cat load.txt load.err)"
cat load.txt

# serve still answers, and its counters
curl -sf -m 10 "$URL/v1/status" >status.json || fail "/v1/status did not answer after the load"
curl -sf -m 10 "$URL/metrics" >metrics.txt || fail "/metrics did not answer after the load"
kill -TERM "$SERVE"
rc=0
wait "$SERVE" || rc=$?
# stopped by the signal after its current step (143), with nothing a sanitizer reported
[ "$rc" = 143 ] || [ "$rc" = 0 ] || fail "serve exited with $rc"
! grep -qE "Sanitizer|runtime error" serve.log load.err || fail "a sanitizer reported (serve.log, load.err)"

/usr/bin/python3 - <<'PY' || fail "the ledger does not match the answers"
import json, sqlite3, sys
load = json.load(open("load.json"))
ids = [int(l) for l in open("ids.txt")] + [int(l) for l in open("ids-open.txt")]
answered = set(ids)
opened = json.load(open("open.json"))
metrics = {}
for line in open("metrics.txt"):
    if line and not line.startswith("#"):
        k, v = line.rsplit(" ", 1)
        metrics[k] = float(v)
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)
n202 = load["rollouts"].get("202", 0)
check(n202 > 0 and set(load["rollouts"]) == {"202"},
      f"every submission is answered 202 (valid groups of their leases): {load['rollouts']}")
check(len(ids) == len(answered), "the generator lists each accepted group once")
sent = sum(opened["rollouts"].values())
check(opened["offered"] == 800 and sent + opened["unsent"] == 800,
      f"open loop: 800 due in 2 s at 400/s, {opened['offered']} due, {sent} sent, "
      f"{opened['unsent']} unsent")
check(set(opened["rollouts"]) == {"202"}, f"open loop answers: {opened['rollouts']}")
check(opened["p99_ms"] >= opened["service_p99_ms"] and opened["p50_ms"] >= opened["service_p50_ms"],
      f"open loop: latency from the due time {opened['p50_ms']:.2f}/{opened['p99_ms']:.2f} ms "
      f"below the service time {opened['service_p50_ms']:.2f}/{opened['service_p99_ms']:.2f}")
db = sqlite3.connect("file:run/ledger.sqlite?mode=ro", uri=True)
settled = {r[0] for r in db.execute("SELECT id FROM groups WHERE state IN (1, 3, 4)")}
check(not (answered - settled),
      f"{len(answered - settled)} groups answered 202 are not accepted, trained or dropped "
      f"(first {sorted(answered - settled)[:5]})")
check(not (settled - answered),
      f"{len(settled - answered)} groups are in the ledger that were not answered 202 "
      f"(first {sorted(settled - answered)[:5]})")
rejected = db.execute("SELECT count(*) FROM groups WHERE state = 2").fetchone()[0]
check(rejected == 0, f"{rejected} groups rejected")
twice = db.execute("SELECT count(*) FROM (SELECT grp FROM training_log WHERE undone_by IS NULL"
                   " GROUP BY grp HAVING count(*) > 1)").fetchone()[0]
check(twice == 0, f"{twice} groups trained more than once")
unlogged = db.execute("SELECT count(*) FROM groups g WHERE g.state IN (3, 4) AND (SELECT count(*)"
                      " FROM training_log t WHERE t.grp = g.id AND t.undone_by IS NULL) <> 1"
                      ).fetchone()[0]
check(unlogged == 0, f"{unlogged} trained or dropped groups without exactly one training event")
nobody = db.execute("SELECT count(*) FROM groups g WHERE g.state = 1 AND NOT EXISTS"
                    " (SELECT 1 FROM bodies b WHERE b.grp = g.id)").fetchone()[0]
check(nobody == 0, f"{nobody} accepted groups without their body")
accepts = metrics.get("longhaul_ledger_accepts_total", -1)
commits = metrics.get("longhaul_ledger_accept_commits_total", -1)
check(accepts == len(answered),
      f"the ledger committed {accepts:.0f} accepts for {len(answered)} accepted groups")
check(0 < commits <= accepts, f"{commits:.0f} group commits for {accepts:.0f} accepts")
repeats = metrics.get("longhaul_repeats_total", -1)
check(repeats == n202 + opened["rollouts"].get("202", 0) - len(answered) and repeats > 0,
      f"{repeats:.0f} repeats answered, {n202 + opened['rollouts'].get('202', 0) - len(answered)} "
      f"duplicate submissions answered 202")
nonce = {v: metrics.get(f'longhaul_signed_requests_total{{nonce="{v}"}}', -1)
         for v in ("fresh", "replayed", "stale_time", "forgotten")}
check(nonce["replayed"] == 1 and nonce["stale_time"] == 2 and nonce["forgotten"] == 0
      and nonce["fresh"] >= n202, f"the replay table's verdicts: {nonce} (only the probe's refused)")
status = json.load(open("status.json"))
check(status["groups"]["rejected"] == 0, "status shows rejected groups")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"ok: {len(answered)} groups accepted once each in {commits:.0f} group commits, "
      f"{repeats:.0f} concurrent repeats answered as repeats")
PY
echo "PASS"
