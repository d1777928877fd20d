#!/usr/bin/env bash
# A random model with the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 kv heads,
# intermediate 4864, vocab 151936, tied; 494M parameters) must load and generate within its bf16
# weights plus 10% of resident memory (the KV cache of 13 tokens is 0.3 MB; there was an fp32
# copy of the weights, 3x the bf16 size). Under AddressSanitizer (LH_BUILD_KIND names the build)
# the process also holds ASan's shadow memory (1/8 of what it touches) and its allocator's
# redzones and quarantine: the bound there is the bf16 weights + 30% (1165 MB measured, 18% over);
# an fp32 copy would still be caught. `make tsan` leaves the test out (TSan's shadow is 4-8x).
# Usage: qwen05_rss.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-q05.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/preset.json" <<'JSON'
{"vocab_size":151936,"hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,
 "num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
 "tie_word_embeddings":true,"rope_theta":1000000.0,"rms_norm_eps":1e-6}
JSON
"$BIN" init-model --arch qwen2 --preset "$TMP/preset.json" --seed 1 --out "$TMP/model" --dtype bf16
# peak RSS of the generate process, from the kernel's accounting of the finished child
SLACK=0.10
case "${LH_BUILD_KIND:-}" in *address*) SLACK=0.30 ;; esac
/usr/bin/python3 - "$BIN" "$TMP/model" "$SLACK" <<'PY'
import json, resource, subprocess, sys
binary, model, slack = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = subprocess.run([binary, "generate", "--model", model, "--prompt-tokens", "9,8,7,6,5",
                      "--max-new", "8", "--seed", "3", "--json"],
                     check=True, capture_output=True, text=True).stdout
rec = json.loads(out.splitlines()[0])
assert len(rec["tokens"]) == 8, rec
assert all(0 <= t < 151936 for t in rec["tokens"]), rec
assert len(rec["logprobs"]) == len(rec["logprobs_model"]) == 8, rec
assert all(lp is not None and lp <= 0 for lp in rec["logprobs"] + rec["logprobs_model"]), rec
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
weights = 2 * 494032768  # bf16
bound = (1 + slack) * weights
pct = f"{slack * 100:.0f}%"
print(f"qwen2.5-0.5B shape: generated {len(rec['tokens'])} tokens, peak RSS {rss / 1e6:.0f} MB, "
      f"bound (bf16 weights + {pct}) {bound / 1e6:.0f} MB")
if rss > bound:
    sys.exit(f"peak RSS {rss / 1e6:.0f} MB exceeds the bf16 weights ({weights / 1e6:.0f} MB) + {pct}")
PY
