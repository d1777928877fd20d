#!/usr/bin/env bash
# Serve's restart (issue 17): the seconds from `longhaul serve --run RUN` of an existing run to
# its "listening" line, for two binaries alternating on the same run (a copy each time). The run
# has 41 versions of the tiny model published with --max-staleness 16 and --keyframe-every 20,
# so a restart rebuilds the weights of versions 24 .. 40 from a keyframe at 20 (the restart
# also loads the checkpoint and rewinds the ledger, which both binaries do alike). The run is
# made once with NEW_BIN (a worker trains it to 40 versions, ~30 s) and kept in OUT_DIR/run.
# Prints each time, then the median of each binary and their ratio.
# Usage: bench/serve_restart.sh NEW_BIN OLD_BIN OUT_DIR [ROUNDS]   (default 5 rounds)
set -euo pipefail
usage="usage: bench/serve_restart.sh NEW_BIN OLD_BIN OUT_DIR [ROUNDS]"
NEW=$(realpath "${1:?$usage}")
OLD=$(realpath "${2:?$usage}")
OUT=${3:?$usage}
ROUNDS=${4:-5}
mkdir -p "$OUT"
cd "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
ENV=sort:count=3,digits=1
FLAGS=(--env $ENV --key trainer.key --steps 40 --prompts 3 --group 4 --max-new 8
  --max-staleness 16 --keyframe-every 20)
if [ ! -d run ]; then
  rm -rf m0 base w1 port
  "$NEW" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1
  "$NEW" sft --model m0 --env $ENV --steps 40 --batch 16 --log-every 40 --out base >/dev/null 2>&1
  "$NEW" keygen --out trainer.key --force >/dev/null 2>&1
  "$NEW" serve --run run.tmp --model base "${FLAGS[@]}" --port-file port >serve.log 2>&1 &
  serve=$!
  for _ in $(seq 1 200); do [ -s port ] && break; sleep 0.05; done
  "$NEW" worker --server "http://127.0.0.1:$(cat port)" --key w1.key --trust-key trainer.key.pub \
    --dir w1 --slots 8 --name w1 >w1.log 2>&1 &
  worker=$!
  wait "$serve"
  kill "$worker" 2>/dev/null || true
  wait "$worker" 2>/dev/null || true
  mv run.tmp run
fi
latest=$(sqlite3 run/ledger.sqlite 'SELECT max(version) FROM versions')
echo "run: versions 0 .. $latest, --max-staleness 16, --keyframe-every 20"

restart() { # binary: seconds to "listening", on a fresh copy of the run
  rm -rf r && cp -r run r
  local s l
  s=$(date +%s.%N)
  "$1" serve --run r --model base "${FLAGS[@]}" 2>&1 | while read -r l; do
    case $l in *listening*) echo "$(date +%s.%N) - $s" | bc ;; esac
  done
}
: >times.txt
for i in $(seq 1 "$ROUNDS"); do
  t_old=$(restart "$OLD")
  t_new=$(restart "$NEW")
  echo "round $i: old $t_old s, new $t_new s"
  echo "$t_old $t_new" >>times.txt
done
python3 - times.txt <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
old = statistics.median(r[0] for r in rows)
new = statistics.median(r[1] for r in rows)
print(f"median: old {old:.2f} s, new {new:.2f} s, old/new {old / new:.1f}x")
PY
