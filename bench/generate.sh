#!/usr/bin/env bash
# Generation benchmark (docs/PERFORMANCE.md, "Generation (rollout decode)"): the machine's read
# bandwidth (bench/membw), `longhaul bench generate` and its PyTorch peer
# (bench/peer_generate.py) on the same bf16 `small` model, batch, prompt length, new tokens and
# thread count; prints a table per batch size with the ratios and, at batch 1, the fraction of
# the bandwidth limit longhaul's decode reaches.
# Usage: bench/generate.sh BUILD_DIR   (`make bench-generate` runs it with build/)
# Overrides: THREADS (2), BATCHES ("1 32"), PROMPT (64), NEW (64), ROUNDS (3),
#            PYTHON (/usr/bin/python3), LH_WAIT (default: unset), PEER_WAIT (PASSIVE).
# Each program runs with the OpenMP wait policy that suits it best: the peer with PASSIVE
# (torch's OpenMP pool otherwise spins against its BLAS pool: batch-1 decode 21 vs 63 tokens/s),
# longhaul with libgomp's default (spin briefly, then sleep). On a busy machine spinning hurts
# longhaul too (batch-1 decode 32 vs 154 tokens/s with one other busy process): set
# LH_WAIT=PASSIVE there. membw runs with longhaul's setting.
# The machine is shared and its speed drifts, so the three programs run alternately ROUNDS
# times per batch; ratios are medians of the per-round ratios.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREADS=${THREADS:-2}
BATCHES=${BATCHES:-1 32}
PROMPT=${PROMPT:-64}
NEW=${NEW:-64}
ROUNDS=${ROUNDS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
LH_WAIT=${LH_WAIT:-}
PEER_WAIT=${PEER_WAIT:-PASSIVE}
unset OMP_WAIT_POLICY
# runs a command with the given OMP_WAIT_POLICY, or with none when it is empty
with_wait() {
  local w=$1
  shift
  if [ -n "$w" ]; then OMP_WAIT_POLICY=$w "$@"; else "$@"; fi
}
LH=$BUILD/longhaul
MEMBW=$BUILD/bench/membw
for exe in "$LH" "$MEMBW"; do
  if [ ! -x "$exe" ]; then
    echo "$0: $exe not found (build first: make build)" >&2
    exit 1
  fi
done

# The bf16 model (what workers run) is made once per build and remade when longhaul is newer.
MODEL=$BUILD/bench-cache/small-qwen2-seed1-bf16
if [ ! -f "$MODEL/model.safetensors" ] || [ "$LH" -nt "$MODEL/model.safetensors" ]; then
  rm -rf "$MODEL"
  mkdir -p "$(dirname "$MODEL")"
  "$LH" init-model --arch qwen2 --preset small --seed 1 --dtype bf16 --out "$MODEL"
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-bench.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

for B in $BATCHES; do
  echo "bench-generate: batch $B, prompt $PROMPT, $NEW new tokens, $THREADS threads," \
    "$ROUNDS rounds, OMP_WAIT_POLICY longhaul=${LH_WAIT:-default} peer=${PEER_WAIT:-default}" >&2
  for r in $(seq "$ROUNDS"); do
    echo "  round $r: membw, longhaul bench generate, peer_generate.py (torch) ..." >&2
    with_wait "$LH_WAIT" "$MEMBW" --threads "$THREADS" >>"$OUT/membw-$B.json"
    with_wait "$LH_WAIT" "$LH" bench generate --model "$MODEL" --batch "$B" --prompt-len "$PROMPT" --new "$NEW" \
      --threads "$THREADS" --json >>"$OUT/longhaul-$B.json"
    with_wait "$PEER_WAIT" "$PYTHON" "$ROOT/bench/peer_generate.py" --model "$MODEL" --batch "$B" \
      --prompt-len "$PROMPT" --new "$NEW" --threads "$THREADS" >>"$OUT/peer-$B.json"
  done
done

"$PYTHON" - "$ROOT" "$OUT" "$MODEL" "$BATCHES" <<'PY'
import json, os, sys
root, out, model, batches = sys.argv[1:4] + [[int(b) for b in sys.argv[4].split()]]
sys.path.insert(0, os.path.join(root, "bench"))
from benchlib import median, runs as read_runs  # noqa: E402
def runs(name):
    return read_runs(out, name, "bench-generate")
report = {}
for B in batches:
    bws, lhs, pes = runs(f"membw-{B}.json"), runs(f"longhaul-{B}.json"), runs(f"peer-{B}.json")
    if not len(bws) == len(lhs) == len(pes):
        sys.exit(f"bench-generate: batch {B}: the programs ran a different number of rounds")
    lh, pe = lhs[0], pes[0]
    # weight_bytes: what one decode forward reads (longhaul: bf16, or above 8 sequences the
    # fp32 copy; the peer: fp32)
    lh_dtype = "bf16" if lh["weight_bytes"] == 2 * lh["params"] else "fp32"
    print(f"\nbatch {B}: model {model} ({lh['params'] / 1e6:.2f}M params, longhaul reads "
          f"{lh['weight_bytes'] / 1e6:.1f} MB of {lh_dtype} weights per decode forward, the peer "
          f"{pe['weight_bytes'] / 1e6:.1f} MB of fp32), prompt {lh['prompt_len']}, "
          f"{lh['new']} new, {lh['threads']} threads, {len(lhs)} rounds")
    print(f"{'(medians over rounds)':24}{'prefill tok/s':>15}{'decode tok/s':>14}{'s/step':>10}")
    for name, rows in (("longhaul", lhs), ("pytorch peer", pes)):
        print(f"{name:24}{median([r['prefill_tokens_per_s'] for r in rows]):15.1f}"
              f"{median([r['decode_tokens_per_s'] for r in rows]):14.1f}"
              f"{median([r['decode_step_s'] for r in rows]):10.4f}")
    pre = [l["prefill_tokens_per_s"] / p["prefill_tokens_per_s"] for l, p in zip(lhs, pes)]
    dec = [l["decode_tokens_per_s"] / p["decode_tokens_per_s"] for l, p in zip(lhs, pes)]
    print("per-round longhaul / peer, prefill: " + " ".join(f"{x:.2f}x" for x in pre) +
          "; decode: " + " ".join(f"{x:.2f}x" for x in dec))
    print(f"longhaul / peer (median of rounds): prefill {median(pre):.2f}x, decode "
          f"{median(dec):.2f}x")
    bw, bw16 = median([b["read_gbps"] for b in bws]), median([b["bf16_read_gbps"] for b in bws])
    print(f"read bandwidth (membw, median): {bw:.2f} GB/s as fp32, {bw16:.2f} GB/s as bf16")
    rep = {"longhaul": lhs, "peer": pes, "membw": bws, "ratio_prefill": median(pre),
           "ratio_decode": median(dec)}
    if B == 1:
        # Every decode forward at batch 1 reads all the weights once: weight traffic per second
        # is weight_bytes * forwards/s, and decode_step_s is the time of one decode forward
        # (decode_s over its N - 1 forwards), so forwards/s = 1 / decode_step_s.
        def traffic(r):
            return r["weight_bytes"] / r["decode_step_s"]
        frac = [traffic(l) / (b["read_gbps"] * 1e9) for l, b in zip(lhs, bws)]
        frac16 = [traffic(l) / (b["bf16_read_gbps"] * 1e9) for l, b in zip(lhs, bws)]
        pfrac = [traffic(p) / (b["read_gbps"] * 1e9) for p, b in zip(pes, bws)]
        print(f"batch-1 decode, fraction of the bandwidth limit (weight_bytes x decode forwards/s "
              f"/ read bandwidth, median of rounds): longhaul {median(frac):.1%} "
              f"({median(frac16):.1%} of the bf16 read rate); peer {median(pfrac):.1%}")
        rep.update(fraction_of_bandwidth=median(frac), fraction_of_bf16_bandwidth=median(frac16),
                   peer_fraction_of_bandwidth=median(pfrac))
    report[str(B)] = rep
print("json " + json.dumps(report))
PY
