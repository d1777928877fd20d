#!/usr/bin/env bash
# Training-step benchmark (docs/PERFORMANCE.md, "Training step"): the machine's cblas_sgemm
# ceiling, `longhaul bench train` and its PyTorch peer (bench/peer_train.py) on the same `small`
# model, batch, thread count and step; prints a table and the ratios.
# Usage: bench/train.sh BUILD_DIR   (`make bench-train` runs it with build/)
# Overrides: THREADS (2), BATCH (8), SEQ (256), STEPS (3), ROUNDS (3), PYTHON (/usr/bin/python3).
# The machine is shared and its speed drifts by 10-20% within minutes, so longhaul and the peer
# run alternately ROUNDS times; the ratio reported is the median of the per-round ratios.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREADS=${THREADS:-2}
BATCH=${BATCH:-8}
SEQ=${SEQ:-256}
STEPS=${STEPS:-3}
ROUNDS=${ROUNDS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
LH=$BUILD/longhaul
SGEMM=$BUILD/bench/sgemm_peak
for exe in "$LH" "$SGEMM"; do
  if [ ! -x "$exe" ]; then
    echo "$0: $exe not found (build first: make build)" >&2
    exit 1
  fi
done

# The model is made once per build and remade when longhaul is newer than it.
MODEL=$BUILD/bench-cache/small-qwen2-seed1
if [ ! -f "$MODEL/model.safetensors" ] || [ "$LH" -nt "$MODEL/model.safetensors" ]; then
  rm -rf "$MODEL"
  mkdir -p "$(dirname "$MODEL")"
  "$LH" init-model --arch qwen2 --preset small --seed 1 --out "$MODEL"
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-bench.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

echo "bench-train: batch $BATCH x seq $SEQ, $STEPS steps after 1 warmup, $THREADS threads," \
  "$ROUNDS rounds" >&2
for r in $(seq "$ROUNDS"); do
  echo "  round $r: sgemm_peak, longhaul bench train, peer_train.py (torch) ..." >&2
  "$SGEMM" --threads "$THREADS" >>"$OUT/sgemm.json"
  "$LH" bench train --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
    --threads "$THREADS" --json >>"$OUT/longhaul.json"
  "$PYTHON" "$ROOT/bench/peer_train.py" --model "$MODEL" --batch "$BATCH" --seq "$SEQ" \
    --steps "$STEPS" --threads "$THREADS" >>"$OUT/peer.json"
done

"$PYTHON" - "$ROOT" "$OUT" "$MODEL" <<'PY'
import json, os, sys
root, out, model = sys.argv[1:4]
sys.path.insert(0, os.path.join(root, "bench"))
from benchlib import median, runs as read_runs  # noqa: E402
def runs(name):
    return read_runs(out, name, "bench-train")
sgs, lhs, pes = runs("sgemm.json"), runs("longhaul.json"), runs("peer.json")
if not len(lhs) == len(pes):
    sys.exit("bench-train: longhaul and peer ran a different number of rounds")
# The peer runs the same FLOPs as longhaul (same model, batch and step).
flops_per_step = lhs[0]["gflops"] * lhs[0]["step_s"]
peak = max(s["peak_gflops"] for s in sgs)
ratios = [l["tokens_per_s"] / p["tokens_per_s"] for l, p in zip(lhs, pes)]
lh_step, pe_step = median([l["step_s"] for l in lhs]), median([p["step_s"] for p in pes])
lh_gf, pe_gf = flops_per_step / lh_step, flops_per_step / pe_step
lh, pe = lhs[0], pes[0]
print(f"model {model}: {lh.get('params', 0) / 1e6:.2f}M params, batch {lh.get('batch')} x seq "
      f"{lh.get('seq')}, {lh.get('steps')} steps x {len(lhs)} rounds, {lh.get('threads')} threads, "
      f"{flops_per_step:.1f} GFLOP per step")
print(f"{'(medians over rounds)':24}{'tokens/s':>12}{'s/step':>10}{'GFLOP/s':>10}{'of peak':>9}{'loss':>10}")
tokens = lh["batch"] * lh["seq"]
for name, step, g, r in (("longhaul", lh_step, lh_gf, lh), ("pytorch peer", pe_step, pe_gf, pe)):
    loss = r.get("loss")
    print(f"{name:24}{tokens / step:12.1f}{step:10.3f}{g:10.1f}"
          f"{g / peak:9.1%}{loss if loss is None else format(loss, '.5f'):>10}")
print(f"{'cblas_sgemm peak (max)':24}{'':12}{'':10}{peak:10.1f}{1:9.0%}")
for s in max(sgs, key=lambda s: s["peak_gflops"])["shapes"]:
    print(f"  sgemm {s['name']:18} {s['op']} {s['m']}x{s['n']}x{s['k']}: {s['gflops']:.1f} GFLOP/s")
print("per-round longhaul / peer: " + " ".join(f"{x:.2f}x" for x in ratios))
print(f"longhaul / peer tokens/s (median of rounds): {median(ratios):.2f}x")
print(f"longhaul GFLOP/s / sgemm peak: {lh_gf / peak:.1%}")
print("json " + json.dumps({"longhaul": lhs, "peer": pes, "sgemm": sgs,
                            "ratio_tokens_per_s": median(ratios),
                            "fraction_of_peak": lh_gf / peak}))
PY
