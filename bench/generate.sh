#!/usr/bin/env bash
# Generation benchmark (docs/PERFORMANCE.md, "Generation (rollout decode)"): the machine's read
# bandwidth (bench/membw), `longhaul bench generate` and its peers on the same weights: PyTorch
# (bench/peer_generate.py, fp32) and llama.cpp's llama-batched-bench built from source
# (bench/peer_llama.py, f16 GGUF). Two models: the bf16 `small` preset (26M parameters) and a
# random bf16 model of the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 kv heads,
# intermediate 4864, vocab 151936, tied; 494M parameters). Prints a table per model and batch
# size with the ratios, each program's peak resident memory, the machine's load average, and at
# batch 1 the fraction of the bandwidth limit longhaul's decode reaches.
# Usage: bench/generate.sh BUILD_DIR   (`make bench-generate` runs it with build/)
# Overrides: MODELS ("small q05"), THREADS (2), ROUNDS (3), PYTHON (/usr/bin/python3),
#   per model: small: BATCHES "1 32", PROMPT 64, NEW 64; q05: BATCHES "1 8 32", PROMPT 32, NEW 32
#   (BATCHES, PROMPT, NEW set in the environment apply to every model),
#   PEERS ("torch llama"), LLAMA_BATCHED_BENCH (path of llama.cpp's llama-batched-bench; unset:
#   the llama.cpp peer is skipped with a note), GGUF_small / GGUF_q05 (an f16 GGUF of the same
#   weights; unset: bench/gguf_write.py writes one next to the model), LH_WAIT (default: unset),
#   PEER_WAIT (PASSIVE), LLAMA_WAIT (PASSIVE).
# Each program runs with the OpenMP wait policy that suits it best: the torch peer with PASSIVE
# (torch's OpenMP pool otherwise spins against its BLAS pool: batch-1 decode 21 vs 63 tokens/s),
# longhaul with libgomp's default (spin briefly, then sleep). On a busy machine spinning hurts
# (batch-1 decode 32 vs 154 tokens/s with one other busy process; llama.cpp's decode 0.5 vs 7.6
# tokens/s with 4 other busy processes): set LH_WAIT=PASSIVE there. membw runs with longhaul's
# setting. The machine is shared and its speed drifts, so the programs run alternately ROUNDS
# times per batch; ratios are medians of the per-round ratios.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODELS=${MODELS:-small q05}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
PEERS=${PEERS:-torch llama}
LLAMA_BATCHED_BENCH=${LLAMA_BATCHED_BENCH:-}
LH_WAIT=${LH_WAIT:-}
PEER_WAIT=${PEER_WAIT:-PASSIVE}
LLAMA_WAIT=${LLAMA_WAIT:-PASSIVE}
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
USE_LLAMA=0
case " $PEERS " in
*" llama "*)
  if [ -z "$LLAMA_BATCHED_BENCH" ]; then
    echo "bench-generate: LLAMA_BATCHED_BENCH is not set: the llama.cpp peer is skipped" \
      "(docs/PERFORMANCE.md says how to build it)" >&2
  elif [ ! -x "$LLAMA_BATCHED_BENCH" ]; then
    echo "$0: LLAMA_BATCHED_BENCH=$LLAMA_BATCHED_BENCH is not an executable" >&2
    exit 1
  else
    USE_LLAMA=1
  fi
  ;;
esac
USE_TORCH=0
case " $PEERS " in *" torch "*) USE_TORCH=1 ;; esac

OUT=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-bench.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

# The bf16 models (what workers run) are made once per build and remade when longhaul is newer;
# so are their GGUFs.
model_dir() {
  local name=$1 dir=$BUILD/bench-cache/$1-qwen2-seed1-bf16
  if [ ! -f "$dir/model.safetensors" ] || [ "$LH" -nt "$dir/model.safetensors" ]; then
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    local preset=$name
    if [ "$name" = q05 ]; then
      preset=$OUT/q05.json
      cat >"$preset" <<'JSON'
{"vocab_size":151936,"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
 "num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
 "tie_word_embeddings":true,"rope_theta":1000000.0,"rms_norm_eps":1e-6}
JSON
    fi
    "$LH" init-model --arch qwen2 --preset "$preset" --seed 1 --dtype bf16 --out "$dir" >&2
  fi
  echo "$dir"
}

for M in $MODELS; do
  case $M in
  small) dB="1 32" dP=64 dN=64 ;;
  q05) dB="1 8 32" dP=32 dN=32 ;;
  *)
    echo "$0: MODELS: unknown model $M (small or q05)" >&2
    exit 2
    ;;
  esac
  B_LIST=${BATCHES:-$dB}
  P=${PROMPT:-$dP}
  N=${NEW:-$dN}
  MODEL=$(model_dir "$M")
  echo "$MODEL $P $N $B_LIST" >"$OUT/$M.model"
  if [ "$USE_LLAMA" = 1 ]; then
    var=GGUF_$M
    GGUF=${!var:-}
    if [ -z "$GGUF" ]; then
      GGUF=$MODEL/model-f16.gguf
      if [ ! -f "$GGUF" ] || [ "$MODEL/model.safetensors" -nt "$GGUF" ]; then
        echo "bench-generate: writing $GGUF (bench/gguf_write.py)" >&2
        "$PYTHON" "$ROOT/bench/gguf_write.py" "$MODEL" "$GGUF"
      fi
    fi
  fi
  for B in $B_LIST; do
    echo "bench-generate: $M, batch $B, prompt $P, $N new tokens, $THREADS threads, $ROUNDS" \
      "rounds, OMP_WAIT_POLICY longhaul=${LH_WAIT:-default} torch=${PEER_WAIT:-default}" \
      "llama.cpp=${LLAMA_WAIT:-default}" >&2
    for r in $(seq "$ROUNDS"); do
      echo "  round $r: membw, longhaul bench generate, peers ($PEERS) ..." >&2
      cut -d' ' -f1-3 /proc/loadavg >>"$OUT/load-$M-$B.txt"
      with_wait "$LH_WAIT" "$MEMBW" --threads "$THREADS" >>"$OUT/membw-$M-$B.json"
      with_wait "$LH_WAIT" "$PYTHON" "$ROOT/bench/peak_rss.py" "$LH" bench generate \
        --model "$MODEL" --batch "$B" --prompt-len "$P" --new "$N" --threads "$THREADS" \
        --json >>"$OUT/longhaul-$M-$B.json"
      if [ "$USE_LLAMA" = 1 ]; then
        with_wait "$LLAMA_WAIT" "$PYTHON" "$ROOT/bench/peer_llama.py" --bin "$LLAMA_BATCHED_BENCH" \
          --gguf "$GGUF" --batch "$B" --prompt-len "$P" --new "$N" --threads "$THREADS" \
          >>"$OUT/llama-$M-$B.json"
      fi
      if [ "$USE_TORCH" = 1 ]; then
        with_wait "$PEER_WAIT" "$PYTHON" "$ROOT/bench/peak_rss.py" "$PYTHON" \
          "$ROOT/bench/peer_generate.py" --model "$MODEL" --batch "$B" --prompt-len "$P" \
          --new "$N" --threads "$THREADS" >>"$OUT/peer-$M-$B.json"
      fi
    done
  done
done

"$PYTHON" - "$ROOT" "$OUT" "$MODELS" <<'PY'
import json, os, sys
root, out, models = sys.argv[1], sys.argv[2], sys.argv[3].split()
sys.path.insert(0, os.path.join(root, "bench"))
from benchlib import median, runs as read_runs  # noqa: E402
def runs(name):
    return read_runs(out, name, "bench-generate")
def maybe(name):
    return runs(name) if os.path.exists(os.path.join(out, name)) else None
report = {}
for M in models:
    model, P, N, *batches = open(os.path.join(out, f"{M}.model")).read().split()
    cfg = json.load(open(os.path.join(model, "config.json")))
    L, KV = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for B in map(int, batches):
        tag = f"{M}-{B}"
        bws, lhs = runs(f"membw-{tag}.json"), runs(f"longhaul-{tag}.json")
        peers = [(n, r) for n, r in (("pytorch peer", maybe(f"peer-{tag}.json")),
                                     ("llama.cpp", maybe(f"llama-{tag}.json"))) if r]
        if any(len(r) != len(lhs) for _, r in peers) or len(bws) != len(lhs):
            sys.exit(f"bench-generate: {tag}: the programs ran a different number of rounds")
        loads = [l.split() for l in open(os.path.join(out, f"load-{tag}.txt")).read().splitlines()]
        lh = lhs[0]
        # the KV cache the B sequences fill (fp32 keys and values), for the memory target
        kv = 2 * 4 * L * KV * hd * B * (int(P) + int(N))
        print(f"\n{M}, batch {B}: model {model} ({lh['params'] / 1e6:.2f}M params, longhaul reads "
              f"{lh['weight_bytes'] / 1e6:.1f} MB of bf16 weights per decode forward, "
              f"{lh.get('kernel', '?')} kernels), prompt {lh['prompt_len']}, {lh['new']} new, "
              f"{lh['threads']} threads, {len(lhs)} rounds; load average (1 min) per round: "
              + " ".join(l[0] for l in loads))
        print(f"{'(medians over rounds)':24}{'prefill tok/s':>15}{'decode tok/s':>14}"
              f"{'s/step':>10}{'peak RSS MB':>13}")
        for name, rows in [("longhaul", lhs)] + peers:
            print(f"{name:24}{median([r['prefill_tokens_per_s'] for r in rows]):15.1f}"
                  f"{median([r['decode_tokens_per_s'] for r in rows]):14.1f}"
                  f"{median([r['decode_step_s'] for r in rows]):10.4f}"
                  f"{max(r['peak_rss_bytes'] for r in rows) / 1e6:13.0f}")
        rep = {"longhaul": lhs, "membw": bws, "load": loads, "kv_cache_bytes": kv}
        for name, rows in peers:
            key = "llama" if name == "llama.cpp" else "peer"
            pre = [l["prefill_tokens_per_s"] / p["prefill_tokens_per_s"] for l, p in zip(lhs, rows)]
            dec = [l["decode_tokens_per_s"] / p["decode_tokens_per_s"] for l, p in zip(lhs, rows)]
            print(f"longhaul / {name}, per round: prefill " + " ".join(f"{x:.2f}x" for x in pre)
                  + "; decode " + " ".join(f"{x:.2f}x" for x in dec)
                  + f"; median: prefill {median(pre):.2f}x, decode {median(dec):.2f}x")
            rep[key] = rows
            rep[f"ratio_prefill_{key}"], rep[f"ratio_decode_{key}"] = median(pre), median(dec)
        rss = max(r["peak_rss_bytes"] for r in lhs)
        bound = 1.1 * (lh["weight_bytes"] + kv)
        print(f"longhaul peak RSS {rss / 1e6:.0f} MB; bf16 weights + KV cache + 10% = "
              f"{bound / 1e6:.0f} MB: {'within' if rss <= bound else 'OVER'}")
        bw = median([b["read_gbps"] for b in bws])
        print(f"read bandwidth (membw, median): {bw:.2f} GB/s as fp32, "
              f"{median([b['bf16_read_gbps'] for b in bws]):.2f} GB/s as bf16")
        if B == 1:
            # Every decode forward at batch 1 reads all the weights once: weight traffic per
            # second is weight_bytes / decode_step_s (one decode forward and its sampling).
            def frac(r, b, key="read_gbps"):
                return r["weight_bytes"] / r["decode_step_s"] / (b[key] * 1e9)
            f = [frac(l, b) for l, b in zip(lhs, bws)]
            f16 = [frac(l, b, "bf16_read_gbps") for l, b in zip(lhs, bws)]
            line = (f"batch-1 decode, fraction of the bandwidth limit (weight_bytes x decode "
                    f"forwards/s / read bandwidth, median of rounds): longhaul {median(f):.1%} "
                    f"({median(f16):.1%} of the bf16 read rate)")
            rep.update(fraction_of_bandwidth=median(f), fraction_of_bf16_bandwidth=median(f16))
            for name, rows in peers:
                # the peers read what longhaul reads: f16 (llama.cpp) is as many bytes as bf16;
                # the torch peer reads fp32 (its own weight_bytes)
                pf = [(r.get("weight_bytes") or lh["weight_bytes"]) / r["decode_step_s"] /
                      (b["read_gbps"] * 1e9) for r, b in zip(rows, bws)]
                line += f"; {name} {median(pf):.1%}"
            print(line)
        report[f"{M}-{B}"] = rep
print("json " + json.dumps(report))
PY
