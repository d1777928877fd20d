#!/usr/bin/env bash
# Latency hiding (issue 17): `longhaul serve` with two workers, each behind its own `longhaul
# netem` link, at round trips of 0, 150 and 300 ms, asynchronous (the default: workers lease
# ahead and generate with the newest version they hold, groups up to --max-staleness versions
# old are trained) against `serve --sync` (workers wait for every new version before
# generating), all in one run of this script on one machine. For each run: updates, groups
# trained per second, and the training thread's busy fraction (its time in verification and
# updates over the wall time), per mode the throughput at each round trip over its own 0 ms
# throughput, the staleness of the trained groups, the groups dropped as too stale, the lease
# window, and from the ledger where a trained group's time went (publication of its version
# to arrival, lease to arrival, arrival to training), and from the workers' debug logs how long
# a version took from its publication to each worker (its policy sync). BENCH_K sets --max-staleness (default
# 16, serve's), BENCH_MODES (async sync) and BENCH_RTTS (0 150 300) choose the runs.
# The trainer runs on CPU 0 and the workers and links on the others (taskset), as if they were
# other machines: on a shared 2-core machine, workers generating ahead would otherwise take
# the trainer's core and the comparison would measure contention, not latency.
# Writes OUT/serve-bench.jsonl (resumable: finished runs are kept) and prints the table.
# Usage: bench/serve.sh LONGHAUL_BIN OUT_DIR [SECONDS]   (default 60 s per run)
set -euo pipefail
BIN=$(realpath "${1:?usage: bench/serve.sh LONGHAUL_BIN OUT_DIR [SECONDS]}")
OUT=${2:?usage: bench/serve.sh LONGHAUL_BIN OUT_DIR [SECONDS]}
SECONDS_PER_RUN=${3:-60}
K=${BENCH_K:-16} # the staleness bound (--max-staleness, serve's default); BENCH_MODES, BENCH_RTTS choose the runs
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
cd "$OUT"
export OMP_WAIT_POLICY=PASSIVE
ENV=sort:count=4,digits=1
[ -d base ] || {
  "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init >/dev/null
  "$BIN" sft --model init --env $ENV --steps 110 --batch 32 --log-every 110 --out base >/dev/null 2>&1
}
[ -f trainer.key ] || "$BIN" keygen --out trainer.key >/dev/null
touch serve-bench.jsonl
PIN_SERVE="" PIN_WORKERS=""
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  PIN_SERVE="taskset -c 0" PIN_WORKERS="taskset -c 1-$(($(nproc) - 1))"
fi

PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
trap stop_all EXIT

one_run() { # mode rtt_ms
  local mode=$1 rtt=$2 name="run-$1-$2"
  [ "$K" = 16 ] || name="$name-k$K"
  grep -q "\"name\": \"$name\"" serve-bench.jsonl && return 0
  rm -rf "$name" "$name".port "$name"-w*
  local flags=""
  [ "$mode" = sync ] && flags="--sync"
  $PIN_SERVE "$BIN" serve --run "$name" --threads 1 --model base --env $ENV --key trainer.key --port-file "$name.port" \
    --steps 100000 --lr 2e-4 --max-new 16 --max-staleness "$K" --max-wall "$SECONDS_PER_RUN" \
    $flags --log-every 1000 >"$name.serve.log" 2>&1 &
  local serve=$!
  for _ in $(seq 1 200); do [ -s "$name.port" ] && break; sleep 0.05; done
  local port
  port=$(cat "$name.port")
  for i in 0 1; do
    $PIN_WORKERS "$BIN" netem --listen 127.0.0.1:0 --upstream "127.0.0.1:$port" --delay $((rtt / 2)) \
      >"$name-n$i.out" 2>"$name-n$i.log" &
    PIDS+=("$!")
    for _ in $(seq 1 100); do grep -qs listening "$name-n$i.out" && break; sleep 0.05; done
    local np
    np=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\) ->.*/\1/p' "$name-n$i.out")
    LONGHAUL_LOG=debug $PIN_WORKERS "$BIN" worker --server "http://127.0.0.1:$np" --key "$name-w$i.key" \
      --trust-key trainer.key.pub --dir "$name-w$i" --threads 1 --slots 32 >"$name-w$i.log" 2>&1 &
    PIDS+=("$!")
  done
  wait "$serve"
  stop_all
  /usr/bin/python3 - "$name" "$mode" "$rtt" "$SECONDS_PER_RUN" "$K" >>serve-bench.jsonl <<'PY'
import json, sqlite3, sys
name, mode, rtt, wall, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
db = sqlite3.connect(f"file:{name}/ledger.sqlite?mode=ro", uri=True)
dropped = db.execute("SELECT count(*) FROM groups WHERE state = 4").fetchone()[0]
lines = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
groups = sum(l["groups"] for l in lines)
# the training thread's time: verification (its forwards and the check) and the update
busy = sum(l["train_s"] + (l.get("recompute_s") or 0) + (l.get("verify_s") or 0) for l in lines)
window = [l["lease_window"] for l in lines if "lease_window" in l]
stale = [l["staleness"] for l in lines if l.get("staleness") is not None]
# where a trained group's time goes (ms, means over trained groups): from the publication of
# the version it was generated with to its arrival (the worker's side: sync, generation,
# submission), its lease's age at arrival, and from its arrival to the publication of the
# version trained on it (the server's queue and the update)
pipe = db.execute(
    "SELECT avg(g.received_ms - vu.published_ms), avg(g.received_ms - l.leased_ms),"
    " avg(vt.published_ms - g.received_ms), max(g.trained_at - 1 - g.version_used)"
    " FROM groups g JOIN leases l ON l.id = g.lease"
    " JOIN versions vu ON vu.version = g.version_used"
    " JOIN versions vt ON vt.version = g.trained_at WHERE g.state = 3").fetchone()
# the workers' policy sync: from a version's publication to the worker holding it (its debug
# log's "sync A -> B: ... at MS" lines, the server's clock; none from builds without them)
import re
pub = dict(db.execute("SELECT version, published_ms FROM versions").fetchall())
lags = []
for w in (0, 1):
    try:
        for line in open(f"{name}-w{w}.log"):
            m = re.search(r"sync (-?\d+) -> (\d+):.* at (\d+)$", line)
            if m and int(m.group(1)) >= 0 and int(m.group(2)) in pub:
                lags.append(int(m.group(3)) - pub[int(m.group(2))])
    except OSError:
        pass
lags.sort()
print(json.dumps({"name": name, "mode": mode, "rtt_ms": rtt, "k": k, "wall_s": wall,
                  "updates": len(lines), "groups": groups, "groups_per_s": groups / wall,
                  "busy": busy / wall,
                  "staleness_mean": sum(stale) / len(stale) if stale else None,
                  "dropped": dropped,
                  "version_to_arrival_ms": pipe[0], "lease_to_arrival_ms": pipe[1],
                  "arrival_to_trained_ms": pipe[2], "staleness_max": pipe[3],
                  "s_per_version": wall / max(len(lines), 1),
                  "lease_window_mean": sum(window) / len(window) if window else None,
                  "sync_ms_median": lags[len(lags) // 2] if lags else None,
                  "sync_ms_p90": lags[int(len(lags) * 0.9)] if lags else None}))
PY
}

for mode in ${BENCH_MODES:-async sync}; do
  for rtt in ${BENCH_RTTS:-0 150 300}; do
    one_run "$mode" "$rtt"
  done
done
/usr/bin/python3 - serve-bench.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    r.setdefault("k", 16)
base = {(r["mode"], r["k"]): r["groups_per_s"] for r in rows if r["rtt_ms"] == 0}
print(f"{'mode':<6} {'K':>3} {'rtt ms':>6} {'updates':>7} {'groups/s':>8} {'vs 0 ms':>7} {'busy':>5} "
      f"{'stale':>5} {'max':>3} {'dropped':>7} {'v->arr':>6} {'lease':>6} {'arr->tr':>7} {'sync':>5} {'p90':>5}")
num = lambda x, f: format(x, f) if x is not None else "-"
for r in sorted(rows, key=lambda r: (r["mode"], r["k"], r["rtt_ms"])):
    b = base.get((r["mode"], r["k"]))
    ratio = r["groups_per_s"] / b if b else float("nan")
    print(f"{r['mode']:<6} {r['k']:>3} {r['rtt_ms']:>6} {r['updates']:>7} {r['groups_per_s']:>8.2f} "
          f"{ratio:>7.2f} {r['busy']:>5.2f} {num(r['staleness_mean'], '.2f'):>5} "
          f"{num(r.get('staleness_max'), 'd'):>3} {r['dropped']:>7} "
          f"{num(r.get('version_to_arrival_ms'), '.0f'):>6} {num(r.get('lease_to_arrival_ms'), '.0f'):>6} "
          f"{num(r.get('arrival_to_trained_ms'), '.0f'):>7} {num(r.get('sync_ms_median'), 'd'):>5} "
          f"{num(r.get('sync_ms_p90'), 'd'):>5}")
print("groups/s: groups trained per second of wall time; vs 0 ms: over the same mode at 0 ms; "
      "busy: the training thread's time in updates over the wall time; stale, max: mean and "
      "largest staleness of the trained groups (versions); dropped: groups the ledger recorded "
      "as too stale; v->arr, lease, arr->tr: mean ms of a trained group from the publication of "
      "the version it was generated with to its arrival, from its lease to its arrival, and from "
      "its arrival to the publication of the version trained on it; sync, p90: median and 90th "
      "percentile ms from a version's publication to a worker holding it (from the workers' "
      "debug log; - for builds that do not log it)")
PY
