#!/usr/bin/env bash
# `make demo`: the end-to-end run of what longhaul can do today. Until the networked RL demo
# (serve + workers over emulated WAN links) exists, it creates a tiny model, scores token
# sequences with it, benchmarks training steps, samples text with the rollout engine, teaches a
# character model arithmetic with sft, improves it with rl and evaluates both on held-out tasks.
# Exits non-zero if any step fails.
# Usage: bash scripts/demo.sh LONGHAUL_BIN   (outputs go to $DEMO_DIR, default ./demo)
set -euo pipefail

BIN=${1:?usage: scripts/demo.sh LONGHAUL_BIN}
DIR=${DEMO_DIR:-demo}

echo "the networked RL demo is not built yet; this demo runs init-model, score, bench train, generate," \
  "sft, rl and eval on a tiny model in $DIR/"
[ -x "$BIN" ] || {
  echo "demo: $BIN is not an executable (run make build first)" >&2
  exit 1
}
rm -rf "$DIR"
mkdir -p "$DIR"

echo
echo "== 1. init-model: a tiny Qwen2-style model, seed 1"
"$BIN" init-model --arch qwen2 --preset tiny --seed 1 --out "$DIR/tiny-qwen2"
ls -l "$DIR/tiny-qwen2"
VOCAB=$(sed -n 's/.*"vocab_size": *\([0-9][0-9]*\).*/\1/p' "$DIR/tiny-qwen2/config.json")
[ -n "$VOCAB" ] || {
  echo "demo: no vocab_size in $DIR/tiny-qwen2/config.json" >&2
  exit 1
}

echo
echo "== 2. score: log-probabilities of each token after the first (untrained: about" \
  "-ln($VOCAB) each)"
cat >"$DIR/sequences.jsonl" <<EOF
[1, 2, 3, 4, 5, 6, 7, 8]
[$((VOCAB - 1)), 0, $((VOCAB - 1)), 0]
[42, 42, 42, 42, 42, 42]
EOF
"$BIN" score --model "$DIR/tiny-qwen2" --input "$DIR/sequences.jsonl" | tee "$DIR/scores.jsonl"
LINES=$(wc -l <"$DIR/scores.jsonl")
[ "$LINES" -eq 3 ] || {
  echo "demo: score printed $LINES lines for 3 sequences" >&2
  exit 1
}

echo
echo "== 3. bench train: forward + backward + AdamW on 4 sequences of 64 tokens"
"$BIN" bench train --model "$DIR/tiny-qwen2" --batch 4 --seq 64 --steps 5

echo
echo
echo "== 4. generate: 3 samples from an untrained model with the character tokenizer (random text)"
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$DIR/tiny-chars"
"$BIN" generate --model "$DIR/tiny-chars" --prompt "12+34=" --max-new 24 --n 3 --seed 7 \
  --json | tee "$DIR/samples.jsonl"
SAMPLES=$(wc -l <"$DIR/samples.jsonl")
if [ "$SAMPLES" -ne 3 ]; then
  echo "demo: generate printed $SAMPLES samples, expected 3" >&2
  exit 1
fi

echo
echo "== 5. sft: teach the character model 1-digit arithmetic from reference solutions, then ask it"
"$BIN" sft --model "$DIR/tiny-chars" --env arith:digits=1 --steps 300 --batch 32 --log-every 100 \
  --out "$DIR/tiny-chars-sft"
for p in "3+4=" "8-5=" "6+2="; do
  printf '%s ' "$p"
  "$BIN" generate --model "$DIR/tiny-chars-sft" --prompt "$p" --temperature 0 --max-new 4
done

echo
echo "== 6. rl: GRPO (TIS loss) teaches a briefly sft-trained model to sort 4 digits (reward only)"
"$BIN" sft --model "$DIR/tiny-chars" --env sort:count=4,digits=1 --steps 110 --batch 32 \
  --log-every 110 --out "$DIR/sort-base"
"$BIN" rl --model "$DIR/sort-base" --env sort:count=4,digits=1 --steps 300 --lr 2e-4 \
  --max-new 16 --log-every 50 --save-every 150 --out "$DIR/sort-rl"

echo
echo "== 7. eval: held-out pass@1 of the rl policy against its starting point (paired)"
"$BIN" eval --model "$DIR/sort-rl" --env sort:count=4,digits=1 --n 500 \
  --compare "$DIR/sort-base"

echo
echo "== 8. the networked loop: serve + 3 workers behind emulated WAN links (50, 150, 300 ms round"
echo "     trip, the last with 1% drops), from the same base; at most ${DEMO_NET_SECONDS:-240} s"
"$BIN" keygen --out "$DIR/trainer.key" >/dev/null
# five processes share the cores: OpenMP threads must sleep, not spin, at their barriers
export OMP_WAIT_POLICY=PASSIVE
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_all EXIT
"$BIN" serve --run "$DIR/net-run" --model "$DIR/sort-base" --env sort:count=4,digits=1 \
  --key "$DIR/trainer.key" --port-file "$DIR/port" --steps 300 --lr 2e-4 --max-new 16 \
  --max-staleness 4 --max-wall "${DEMO_NET_SECONDS:-240}" --log-every 25 &
SERVE=$!
for _ in $(seq 1 200); do [ -s "$DIR/port" ] && break; sleep 0.1; done
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
curl -s "http://127.0.0.1:$PORT/v1/status" >/dev/null 2>&1 || true
stop_all
trap - EXIT
echo
echo "== 9. eval: held-out pass@1 of the networked policy against the same base (paired)"
"$BIN" eval --model "$DIR/net-run" --env sort:count=4,digits=1 --n 500 --compare "$DIR/sort-base"
python3 - "$DIR/net-run" <<'PY'
import json, sqlite3, sys
run = sys.argv[1]
db = sqlite3.connect(f"file:{run}/ledger.sqlite?mode=ro", uri=True)
names = ["leased", "accepted", "rejected", "trained", "dropped", "expired"]
states = dict(db.execute("SELECT state, count(*) FROM groups GROUP BY state").fetchall())
print("groups: " + ", ".join(f"{names[k]} {v}" for k, v in sorted(states.items())))
nv, blob = db.execute("SELECT count(*), 0 FROM versions").fetchone()
rows = db.execute("SELECT kind, count(*), sum(size) FROM blobs GROUP BY kind").fetchall()
for kind, n, size in rows:
    print(f"{'snapshots' if kind == 0 else 'patches'}: {n}, {size / 1e6:.2f} MB")
snap = db.execute("SELECT avg(size) FROM blobs WHERE kind = 0").fetchone()[0] or 0
pat = db.execute("SELECT avg(size) FROM blobs WHERE kind = 1").fetchone()[0] or 0
if pat:
    print(f"versions published: {nv}; a patch is {pat / 1e3:.1f} kB against a {snap / 1e3:.1f} kB snapshot ({snap / pat:.0f}x smaller)")
hist = {}
for line in open(f"{run}/metrics.jsonl"):
    m = json.loads(line)
    s = round(m.get("staleness") or 0)
    hist[s] = hist.get(s, 0) + 1
print("mean staleness of updates: " + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())))
for key, name, n in db.execute("SELECT hex(w.key), w.name, count(g.id) FROM workers w LEFT JOIN leases l ON l.worker = w.id LEFT JOIN groups g ON g.lease = l.id AND g.state = 3 GROUP BY w.id"):
    print(f"worker {name}: {n} groups trained")
PY
echo "the networked run is in $DIR/net-run (ledger.sqlite, blobs/, checkpoints/, metrics.jsonl)"
echo "demo finished: models, inputs, scores, samples, the rl run and the networked run are in $DIR/"
