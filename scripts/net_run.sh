#!/usr/bin/env bash
# One networked RL run for `make results` (scripts/results.sh, stage "network"): `longhaul
# serve` from BASE for STEPS updates with two workers, each behind its own `longhaul netem`
# link of 150 ms round trip, on loopback; stops the workers and links when serve is done.
# Usage: scripts/net_run.sh LONGHAUL_BIN BASE ENV STEPS LR SEED RUN
set -euo pipefail
BIN=$1 BASE=$2 ENV=$3 STEPS=$4 LR=$5 SEED=$6 RUN=$7
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_all EXIT
rm -rf "$RUN" "$RUN".port "$RUN"-w* "$RUN"-n*
[ -f "$RUN.key" ] || "$BIN" keygen --out "$RUN.key" --force >/dev/null
"$BIN" serve --run "$RUN" --model "$BASE" --env "$ENV" --key "$RUN.key" --port-file "$RUN.port" \
  --steps "$STEPS" --lr "$LR" --max-new 16 --seed "$SEED" --keep 1 --log-every 100 &
SERVE=$!
for _ in $(seq 1 200); do [ -s "$RUN.port" ] && break; sleep 0.05; done
PORT=$(cat "$RUN.port")
for i in 0 1; do
  "$BIN" netem --listen 127.0.0.1:0 --upstream "127.0.0.1:$PORT" --delay 75 \
    >"$RUN-n$i.out" 2>"$RUN-n$i.log" &
  PIDS+=("$!")
  for _ in $(seq 1 100); do grep -qs listening "$RUN-n$i.out" && break; sleep 0.05; done
  NP=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\) ->.*/\1/p' "$RUN-n$i.out")
  "$BIN" worker --server "http://127.0.0.1:$NP" --key "$RUN-w$i.key" --trust-key "$RUN.key.pub" \
    --dir "$RUN-w$i" --threads 1 --slots 32 >"$RUN-w$i.log" 2>&1 &
  PIDS+=("$!")
done
wait "$SERVE"
