#!/usr/bin/env bash
# The load test of `longhaul serve` (issue 19, "Hostile bytes and load"): a real serve on a
# random free port of 127.0.0.1 with verification stubbed out (--no-verify, testing only), and
# bench/serve_load's clients (64 by default, each its own key) leasing and submitting signed
# groups as fast as it answers, for SECONDS. The model is a micro one (hidden 16, one layer) so
# the training thread keeps up with the groups (it trains on 1024 groups per update, publishes
# and checkpoints each version, all durable) and what is measured is the HTTP, signature and
# ledger path. Prints accepted groups/s, the latency of POST /v1/rollouts (p50/p99/max, until
# the 202, which is sent once the group is durably in the ledger), answers by status, serve's
# RSS over the run, CPU per group, the same per INTERVAL seconds (default 10: they must stay
# flat over a long run), the ledger's group commits and the replay table's verdicts. Builds
# nothing (`make bench-serve-load` builds first); bounded in time (serve stops itself after
# SECONDS + 60).
# Two modes. By default the clients are a closed loop (each submits as soon as it is answered):
# that finds the saturation throughput, but its latency is set by the number of clients
# (Little's law). With RATE=R they are an open loop: R groups/s offered in all, each client on
# its own timetable (evenly spaced; POISSON=1 for Poisson arrivals), each latency measured from
# the time the submission was due, so a stall of the server shows in full ("coordinated
# omission"); it prints the rate offered and accepted, and the service time (from the sending)
# beside it. LONGHAUL=PATH runs another longhaul binary as the server (a "before" build) with
# this build's load generator; TRACE=FILE keeps every submission's latency (serve_load --trace).
# Usage: [INTERVAL=S] [RATE=R [POISSON=1]] [LONGHAUL=BIN] [TRACE=FILE]
#        bench/serve_load.sh BUILD_DIR [OUT_DIR] [SECONDS] [CLIENTS]
set -euo pipefail
BUILD=$(realpath "${1:?usage: bench/serve_load.sh BUILD_DIR [OUT_DIR] [SECONDS] [CLIENTS]}")
OUT=${2:-$BUILD/serve-load}
SECS=${3:-20}
CLIENTS=${4:-64}
BIN=$(realpath "${LONGHAUL:-$BUILD/longhaul}")
GEN=$BUILD/bench/serve_load
[ -x "$BIN" ] && [ -x "$GEN" ] || { echo "serve_load.sh: build $BIN and $GEN first (make bench-serve-load)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
cd "$OUT"
rm -rf run port serve.log
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
SERVE=""
stop() { [ -n "$SERVE" ] && kill -TERM "$SERVE" 2>/dev/null; wait 2>/dev/null || true; }
trap stop EXIT
if [ ! -d micro ]; then
  echo '{"hidden_size": 16, "num_hidden_layers": 1, "intermediate_size": 32,
         "num_attention_heads": 2, "num_key_value_heads": 1}' >micro.json
  "$BIN" init-model --arch qwen2 --preset micro.json --tokenizer chars --seed 1 --out micro >/dev/null
fi
[ -f trainer.key ] || "$BIN" keygen --out trainer.key >/dev/null 2>&1
"$BIN" serve --run run --model micro --env sort:count=3,digits=1 --key trainer.key --port-file port \
  --steps 1000000 --prompts 1024 --group 2 --max-new 4 --max-staleness 16 --keyframe-every 0 \
  --threads 1 --no-verify --max-wall $((SECS + 60)) --log-every 1000000 >serve.log 2>&1 &
SERVE=$!
for _ in $(seq 1 200); do [ -s port ] && break; sleep 0.05; done
[ -s port ] || { cat serve.log >&2; echo "serve_load.sh: serve did not start" >&2; exit 1; }
PORT=$(cat port)
OPEN=()
[ -n "${RATE:-}" ] && OPEN=(--rate "$RATE")
[ -n "${RATE:-}" ] && [ -n "${POISSON:-}" ] && OPEN+=(--poisson)
[ -n "${TRACE:-}" ] && OPEN+=(--trace "$TRACE")
MODE="closed loop"
[ -n "${RATE:-}" ] && MODE="open loop: $RATE groups/s offered${POISSON:+ (Poisson arrivals)}"
echo "serve $BIN on 127.0.0.1:$PORT (pid $SERVE); $CLIENTS clients for ${SECS}s, $MODE"
timeout $((SECS + 120)) "$GEN" --server "http://127.0.0.1:$PORT" --clients "$CLIENTS" --seconds "$SECS" --pid "$SERVE" \
  --interval "${INTERVAL:-10}" --json serve-load.json "${OPEN[@]}"
curl -sf "http://127.0.0.1:$PORT/metrics" >metrics.txt || true
commits=$(sed -n 's/^longhaul_ledger_accept_commits_total //p' metrics.txt)
accepts=$(sed -n 's/^longhaul_ledger_accepts_total //p' metrics.txt)
stop
SERVE=""
[ -n "$commits" ] && [ "$commits" -gt 0 ] &&
  echo "ledger: $accepts accepts in $commits group commits ($((accepts / commits)) per commit, one fsync each)"
verdicts=$(sed -n 's/^longhaul_signed_requests_total{nonce="\([a-z_]*\)"} \([0-9]*\)/\1 \2/p' metrics.txt | paste -sd, -)
forgot=$(sed -n 's/^longhaul_replay_forgotten_live_total //p' metrics.txt)
[ -n "$verdicts" ] &&
  echo "signed requests by the time and nonce check: $verdicts; entries forgotten within the window: $forgot"
/usr/bin/python3 - run <<'PY'
import json, sqlite3, sys
run = sys.argv[1]
db = sqlite3.connect(f"file:{run}/ledger.sqlite?mode=ro", uri=True)
names = ["leased", "accepted", "rejected", "trained", "dropped", "expired"]
st = dict(db.execute("SELECT state, count(*) FROM groups GROUP BY state").fetchall())
print("ledger groups: " + ", ".join(f"{names[k]} {v}" for k, v in sorted(st.items())))
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
if steps:
    print(f"training thread: {len(steps)} updates of {steps[0]['groups']} groups, "
          f"{sum(s['train_s'] for s in steps) / len(steps):.3f} s each")
PY
# The peer, in the same run and directory: SQLite (Python's sqlite3, the same library) in WAL mode
# with synchronous=FULL committing one small row per transaction for 3 s, the ceiling of a ledger
# that commits (and fsyncs) each submission on its own.
/usr/bin/python3 - serve-load.json <<'PY'
import json, os, sqlite3, sys, time
if os.path.exists("peer.sqlite"):
    os.remove("peer.sqlite")
db = sqlite3.connect("peer.sqlite", isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
n, t0 = 0, time.time()
while time.time() - t0 < 3:
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t (body) VALUES (?)", (os.urandom(200),))
    db.execute("COMMIT")
    n += 1
peer = n / (time.time() - t0)
load = json.load(open(sys.argv[1]))
print(f"peer, one commit per row (sqlite3, WAL, synchronous=FULL): {peer:.0f} commits/s; "
      f"serve accepted {load['accepted_per_s'] / peer:.1f}x that")
PY
echo "target (docs/PERFORMANCE.md): >= 2000 accepted groups/s with p99 < 50 ms on 2 cores" \
  "(the closed loop at 64 clients; RATE=2000 gives the stricter open-loop reading)"
