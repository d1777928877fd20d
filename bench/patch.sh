#!/usr/bin/env bash
# The patch benchmark (issue 14): for every trajectory that bench/patch_trajectories.sh wrote
# (consecutive bf16 policies of real rl runs), each consecutive pair and the pair (v0, v8) (a
# worker 8 versions behind) go through bench/patch_bench: longhaul's patch and the published
# systems' coding (gap varints + new bf16 values, zstd) of the same pair in one run, bytes per
# change, the static entropy of longhaul's symbols, and make/apply throughput on one thread.
# Prints a table per case; writes OUT/patch-bench.jsonl. Resumable: pairs measured already are
# kept. Usage: bench/patch.sh BUILD_DIR TRAJ_DIR
set -euo pipefail
BUILD=${1:?usage: patch.sh BUILD_DIR TRAJ_DIR}
TRAJ=${2:?usage: patch.sh BUILD_DIR TRAJ_DIR}
BENCH=$BUILD/bench/patch_bench
OUT=$TRAJ/patch-bench.jsonl
touch "$OUT"
export OMP_NUM_THREADS=1
for dir in "$TRAJ"/*/; do
  case=$(basename "$dir")
  [ -f "$dir/tensors.json" ] && [ -f "$dir/v00.bf16" ] || continue
  /usr/bin/python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['config']))" \
    "$dir/tensors.json" >"$dir/config.json"
  last=$(ls "$dir" | sed -n 's/^v\([0-9][0-9]*\)\.bf16$/\1/p' | sort -n | tail -n 1)
  pairs=""
  for ((v = 1; v <= 10#$last; v++)); do pairs+="$((v - 1)):$v "; done
  [ $((10#$last)) -ge 8 ] && pairs+="0:8"
  for pair in $pairs; do
    a=${pair%:*} b=${pair#*:}
    grep -q "\"case\":\"$case\",\"from\":$a,\"to\":$b," "$OUT" && continue
    r=$("$BENCH" "$dir/config.json" "$(printf '%s/v%02d.bf16' "$dir" "$a")" \
      "$(printf '%s/v%02d.bf16' "$dir" "$b")")
    echo "{\"case\":\"$case\",\"from\":$a,\"to\":$b,${r#\{}" >>"$OUT"
  done
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = sorted({r["case"] for r in rows})
print(f"{'case':<14} {'pairs':>5} {'changed':>8} {'bits/chg':>8} {'entropy':>8} {'vs zstd3':>8} "
      f"{'vs zstd19':>9} {'vs bf16':>8} {'make GB/s':>9} {'apply GB/s':>10} {'apply*':>7} {'decode':>7} {'blake2b':>7}")
for c in cases:
    for lag in ("consecutive", "v0->v8"):
        rs = [r for r in rows if r["case"] == c and ((r["to"] - r["from"] == 1) == (lag == "consecutive"))]
        if not rs:
            continue
        tot = lambda k: sum(r[k] for r in rs)
        med = lambda k: statistics.median(r[k] for r in rs)
        ch = tot("changed")
        print(f"{c + (' (8)' if lag != 'consecutive' else ''):<14} {len(rs):>5} {tot('changed') / tot('values'):>8.4f} "
              f"{8 * tot('longhaul_bytes') / ch:>8.3f} {tot('entropy_bits_per_change') / len(rs):>8.3f} "
              f"{tot('baseline_zstd3_bytes') / tot('longhaul_bytes'):>8.2f} "
              f"{tot('baseline_zstd19_bytes') / tot('longhaul_bytes'):>9.2f} "
              f"{tot('bf16_bytes') / tot('longhaul_bytes'):>8.1f} {med('make_gbps'):>9.3f} "
              f"{med('apply_gbps'):>10.3f} {med('apply_known_parent_gbps'):>7.3f} "
              f"{med('decode_gbps') if all('decode_gbps' in r for r in rs) else float('nan'):>7.3f} "
              f"{med('blake2b_gbps'):>7.3f}")
print("bits/chg: longhaul's bytes x 8 / changed values; entropy: the static entropy of its symbols "
      "(mean over pairs); vs zstd3/19: the published systems' coding of the same pairs / longhaul's "
      "bytes; apply*: with the parent's hash known; decode: neither hash; GB/s of bf16 weights, one "
      "thread, medians")
PY
