#!/usr/bin/env bash
# Training-step benchmark (docs/PERFORMANCE.md, "Training step"): the machine's cblas_sgemm
# ceiling, `longhaul bench train` and its PyTorch peer (bench/peer_train.py) on the same `small`
# model, batch, thread count and step; prints a table and the ratios.
# Usage: bench/train.sh BUILD_DIR   (`make bench-train` runs it with build/)
# Overrides: THREADS (2), BATCH (8), SEQ (256), STEPS (3), PYTHON (/usr/bin/python3).
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

echo "bench-train: batch $BATCH x seq $SEQ, $STEPS steps after 1 warmup, $THREADS threads" >&2
echo "  sgemm_peak ..." >&2
"$SGEMM" --threads "$THREADS" >"$OUT/sgemm.json"
echo "  longhaul bench train ..." >&2
"$LH" bench train --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
  --threads "$THREADS" --json >"$OUT/longhaul.json"
echo "  peer_train.py (torch) ..." >&2
"$PYTHON" "$ROOT/bench/peer_train.py" --model "$MODEL" --batch "$BATCH" --seq "$SEQ" \
  --steps "$STEPS" --threads "$THREADS" >"$OUT/peer.json"

"$PYTHON" - "$OUT" "$MODEL" <<'PY'
import json, os, sys
out, model = sys.argv[1], sys.argv[2]
def last_json(name):
    with open(os.path.join(out, name)) as f:
        lines = [l for l in f.read().splitlines() if l.strip().startswith("{")]
    if not lines:
        sys.exit(f"bench-train: {name}: no JSON line in the output")
    return json.loads(lines[-1])
sg, lh, pe = last_json("sgemm.json"), last_json("longhaul.json"), last_json("peer.json")
# The peer runs the same FLOPs as longhaul (same model, batch and step).
flops_per_step = lh["gflops"] * lh["step_s"]
pe_gflops = flops_per_step / pe["step_s"]
peak = sg["peak_gflops"]
print(f"model {model}: {lh.get('params', 0) / 1e6:.2f}M params, batch {lh.get('batch')} x seq "
      f"{lh.get('seq')}, {lh.get('steps')} steps, {lh.get('threads')} threads, "
      f"{flops_per_step:.1f} GFLOP per step")
print(f"{'':24}{'tokens/s':>12}{'s/step':>10}{'GFLOP/s':>10}{'of peak':>9}{'loss':>10}")
for name, r, g in (("longhaul", lh, lh["gflops"]), ("pytorch peer", pe, pe_gflops)):
    loss = r.get("loss")
    print(f"{name:24}{r['tokens_per_s']:12.1f}{r['step_s']:10.3f}{g:10.1f}"
          f"{g / peak:9.1%}{loss if loss is None else format(loss, '.5f'):>10}")
print(f"{'cblas_sgemm peak':24}{'':12}{'':10}{peak:10.1f}{1:9.0%}")
for s in sg["shapes"]:
    print(f"  sgemm {s['name']:18} {s['op']} {s['m']}x{s['n']}x{s['k']}: {s['gflops']:.1f} GFLOP/s")
print(f"longhaul / peer tokens/s: {lh['tokens_per_s'] / pe['tokens_per_s']:.2f}x")
print(f"longhaul GFLOP/s / sgemm peak: {lh['gflops'] / peak:.1%}")
print("json " + json.dumps({"longhaul": lh, "peer": pe, "sgemm": sg,
                            "ratio_tokens_per_s": lh["tokens_per_s"] / pe["tokens_per_s"],
                            "fraction_of_peak": lh["gflops"] / peak}))
PY
