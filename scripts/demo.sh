#!/usr/bin/env bash
# `make demo`: the main job end to end. A tiny character-level model is taught the task format
# with sft (the base), then `longhaul serve` trains it with RL from three `longhaul worker`s,
# each behind its own emulated WAN link (`longhaul netem`: 50, 150 and 300 ms round trip, the
# last with 1% drops), for a bounded time; then base and trained are evaluated on held-out
# tasks with the paired comparison, a summary is printed from the run's ledger, and the trained
# policy is exported (Hugging Face directory, q8_0 GGUF, model card) into DIR/release, and the
# run is reported in one HTML page, DIR/report.html.
# Everything runs on loopback. Exits non-zero if any step fails.
# Usage: bash scripts/demo.sh LONGHAUL_BIN
#   DEMO_DIR (default ./demo): where everything goes
#   DEMO_SECONDS (default 240): the training time bound
set -euo pipefail

BIN=${1:?usage: scripts/demo.sh LONGHAUL_BIN}
DIR=${DEMO_DIR:-demo}
SECONDS_MAX=${DEMO_SECONDS:-240}
ENV=sort:count=4,digits=1
[ -x "$BIN" ] || {
  echo "demo: $BIN is not an executable (run make build first)" >&2
  exit 1
}
rm -rf "$DIR"
mkdir -p "$DIR"
# five processes share the cores: OpenMP threads must sleep, not spin, at their barriers
export OMP_WAIT_POLICY=PASSIVE

echo "== 1. a tiny Qwen2-style model (0.8M parameters) with the character tokenizer"
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$DIR/init"

echo
echo "== 2. sft: teach it the format of '$ENV' (sort 4 digits) from reference solutions, briefly"
"$BIN" sft --model "$DIR/init" --env $ENV --steps 110 --batch 32 --log-every 110 \
  --out "$DIR/base"

echo
echo "== 3. the networked loop: longhaul serve + 3 workers behind emulated WAN links"
echo "     (50, 150 and 300 ms round trip, the last with 1% drops), at most ${SECONDS_MAX} s"
"$BIN" keygen --out "$DIR/trainer.key" >/dev/null
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
"$BIN" serve --run "$DIR/run" --model "$DIR/base" --env $ENV --key "$DIR/trainer.key" \
  --port-file "$DIR/port" --steps 1000 --lr 2e-4 --max-new 16 \
  --max-wall "$SECONDS_MAX" --log-every 25 --eval-every 50 &
SERVE=$!
PIDS+=("$SERVE")
for _ in $(seq 1 200); do [ -s "$DIR/port" ] && break; sleep 0.1; done
[ -s "$DIR/port" ] || {
  echo "demo: serve did not start" >&2
  exit 1
}
PORT=$(cat "$DIR/port")
i=0
for link in "25 0" "75 0" "150 0.01"; do
  set -- $link
  "$BIN" netem --listen 127.0.0.1:0 --upstream "127.0.0.1:$PORT" --delay "$1" --drop "$2" \
    >"$DIR/netem$i.out" 2>"$DIR/netem$i.log" &
  PIDS+=("$!")
  for _ in $(seq 1 100); do grep -qs listening "$DIR/netem$i.out" && break; sleep 0.05; done
  NPORT=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\) ->.*/\1/p' "$DIR/netem$i.out")
  "$BIN" worker --server "http://127.0.0.1:$NPORT" --key "$DIR/worker$i.key" \
    --trust-key "$DIR/trainer.key.pub" --dir "$DIR/worker$i" --name "worker$i-rtt$((2 * $1))ms" \
    --slots 16 --threads 1 >"$DIR/worker$i.log" 2>&1 &
  PIDS+=("$!")
  i=$((i + 1))
done
wait "$SERVE"
stop_all
trap - EXIT

echo
echo "== 4. eval: held-out pass@1 of the trained policy against its base (paired, same tasks)"
"$BIN" eval --model "$DIR/run" --env $ENV --n 500 --compare "$DIR/base" --json "$DIR/eval.json" |
  tee "$DIR/eval.txt"

echo
echo "== summary"
python3 - "$DIR" <<'PY'
import json, re, sqlite3, sys
d = sys.argv[1]
run = f"{d}/run"
db = sqlite3.connect(f"file:{run}/ledger.sqlite?mode=ro", uri=True)
ev = open(f"{d}/eval.txt").read()
m = re.search(r"paired difference.*?\n\s*pass@1\s+(\S+)\s+(\[[^\]]*\])", ev, re.S)
b = re.search(r"compare .*?\n\s*pass@1\s+(\S+)\s+(\[[^\]]*\])", ev, re.S)
t = re.search(r"^\S.*?\n\s*pass@1\s+(\S+)\s+(\[[^\]]*\])", ev, re.S)
if t and b and m:
    print(f"held-out pass@1 (500 tasks): base {b.group(1)} {b.group(2)} -> trained {t.group(1)} "
          f"{t.group(2)}; paired difference {m.group(1)} {m.group(2)}")
names = ["leased", "accepted", "rejected", "trained", "dropped", "expired"]
states = dict(db.execute("SELECT state, count(*) FROM groups GROUP BY state").fetchall())
print("groups: " + ", ".join(f"{names[k]} {v}" for k, v in sorted(states.items())))
nv = db.execute("SELECT count(*) FROM versions").fetchone()[0]
snap_n, snap_b = db.execute("SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE kind = 0").fetchone()
pat_n, pat_b = db.execute("SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE kind = 1").fetchone()
one = db.execute("SELECT avg(size) FROM blobs WHERE kind = 0").fetchone()[0] or 0
print(f"versions published: {nv}; {pat_n} patches ({pat_b / 1e6:.1f} MB, {pat_b / max(pat_n, 1) / 1e3:.0f} kB each) "
      f"and {snap_n} keyframes; one full snapshot is {one / 1e3:.0f} kB, so every version as a "
      f"snapshot would be {nv * one / 1e6:.1f} MB")
hist = {}
for line in open(f"{run}/metrics.jsonl"):
    s = json.loads(line).get("staleness")
    if s is not None:
        hist[round(s)] = hist.get(round(s), 0) + 1
print("mean staleness of the groups of each update (versions: updates): "
      + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())))
rows = db.execute(
    "SELECT w.name, sum(g.state = 3), sum(g.state = 4), sum(g.state = 2) FROM workers w "
    "JOIN leases l ON l.worker = w.id JOIN groups g ON g.lease = l.id GROUP BY w.id ORDER BY w.id")
for name, tr, dr, rj in rows:
    print(f"  {name}: {tr} groups trained, {dr} dropped as too stale, {rj} rejected")
print(f"the run directory: {run} (ledger.sqlite, blobs/, checkpoints/, metrics.jsonl); "
      f"workers: {d}/worker0..2")
PY

echo
echo "== 5. export: the release of the trained policy (Hugging Face directory, GGUF for llama.cpp,"
echo "     model card with the recipe, the ledger's provenance and the evaluation above)"
"$BIN" export --model "$DIR/run" --out "$DIR/release" --gguf q8_0 --eval-json "$DIR/eval.json"
echo "Hugging Face directory: $DIR/release (bf16 model.safetensors, config.json, tokenizer files)"
echo "GGUF for llama.cpp:     $DIR/release/model-q8_0.gguf"
echo "  run it: llama-cli -m $DIR/release/model-q8_0.gguf -p \"sort 9 6 3 5=\" -n 8 --temp 0"
echo "      or: npx -y node-llama-cpp@3.21.1 chat --model $DIR/release/model-q8_0.gguf"
echo "model card:             $DIR/release/README.md"
"$BIN" report --run "$DIR/run" --out "$DIR/report.html" --eval-json "$DIR/eval.json" >/dev/null
echo "report (open in a browser): $DIR/report.html"
