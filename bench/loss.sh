#!/usr/bin/env bash
# Wall time per update of the RL losses (issue 16: the new default must stay within 10% of the
# old one's): `longhaul rl` from the sort base of docs/RESULTS.md, one thread, the same seed, each
# loss of BENCH_LOSSES (default: tis, the old default, and vespo, the new one) run ROUNDS times
# in turn (ABAB..., so drift on this shared machine hits both alike), at staleness 0 and at
# --staleness 16 (where TIS also computes the behaviour log-probs of every batch at submission,
# a forward VESPO does not need). Seconds per update = the run's wall time over its updates;
# the table gives each loss's median and its ratio to the first loss's.
# Usage: bench/loss.sh LONGHAUL_BIN OUT_DIR [STEPS] [ROUNDS]   (default 100 updates, 3 rounds)
set -euo pipefail
BIN=$(realpath "${1:?usage: bench/loss.sh LONGHAUL_BIN OUT_DIR [STEPS] [ROUNDS]}")
OUT=${2:?usage: bench/loss.sh LONGHAUL_BIN OUT_DIR [STEPS] [ROUNDS]}
STEPS=${3:-100}
ROUNDS=${4:-3}
LOSSES=${BENCH_LOSSES:-tis vespo}
mkdir -p "$OUT"
cd "$OUT"
export OMP_WAIT_POLICY=PASSIVE
ENV=sort:count=4,digits=1
[ -d base ] || {
  "$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out init >/dev/null
  "$BIN" sft --model init --env $ENV --steps 110 --batch 32 --threads 1 --log-every 110 \
    --out base >/dev/null 2>&1
}
: >times.tsv
for k in 0 16; do
  for r in $(seq "$ROUNDS"); do
    for loss in $LOSSES; do
      rm -rf run
      t0=$(date +%s.%N)
      "$BIN" rl --model base --env $ENV --steps "$STEPS" --lr 2e-4 --max-new 16 --staleness "$k" \
        --loss "$loss" --seed 1 --threads 1 --save-every 0 --log-every 1000 --out run >/dev/null 2>&1
      t1=$(date +%s.%N)
      echo -e "$k\t$loss\t$r\t$(awk -v a="$t1" -v b="$t0" -v n="$STEPS" 'BEGIN { print (a - b) / n }')" >>times.tsv
    done
  done
done
rm -rf run
/usr/bin/python3 - "$LOSSES" <<'EOF'
import statistics, sys
losses = sys.argv[1].split()
rows = [l.split("\t") for l in open("times.tsv").read().splitlines()]
print("| staleness | " + " | ".join(f"{l} s/update" for l in losses) + " | " +
      " | ".join(f"{l} / {losses[0]}" for l in losses[1:]) + " |")
print("|---|" + "---|" * (2 * len(losses) - 1))
for k in sorted({r[0] for r in rows}, key=int):
    med = {l: statistics.median(float(r[3]) for r in rows if r[0] == k and r[1] == l)
           for l in losses}
    print(f"| {k} | " + " | ".join(f"{med[l]:.4f}" for l in losses) + " | " +
          " | ".join(f"{med[l] / med[losses[0]]:.3f}" for l in losses[1:]) + " |")
EOF
