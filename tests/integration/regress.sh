#!/usr/bin/env bash
# Regression: a fixed sft -> rl (tiny model, 40 updates, staleness 2, a checkpoint every 10) ->
# eval --json pipeline gives exactly the numbers it gave before the trainer was reshaped into
# library pieces (issue 13). The digests below were recorded with the code before the reshape
# (e53a884); they cover tensor data, not file bytes, so metadata may change but no value may.
# The tiny model's numbers are the same with -march=native and -march=haswell builds (checked
# on an AVX-512 machine); threads are fixed at 2.
# usage: regress.sh BIN SOURCE_DIR
set -euo pipefail
L=$1
SRC=$2
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
cd "$D"
export OMP_WAIT_POLICY=PASSIVE
T=(--threads 2)
DIGEST=(/usr/bin/python3 "$SRC/tests/ref/st_digest.py")
fail=0
check() { # name expected actual
  if [ "$2" != "$3" ]; then
    echo "regress: $1 changed: expected $2, got $3"
    fail=1
  fi
}

"$L" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 1 --out m0 >/dev/null 2>&1
"$L" sft --model m0 --env arith:digits=1 --steps 150 --batch 16 --out msft "${T[@]}" 2>/dev/null
"$L" rl --model msft --env arith:digits=1 --out run --steps 40 --staleness 2 --save-every 10 \
  --prompts 8 --group 4 --max-new 8 --seed 3 --log-every 20 "${T[@]}" 2>/dev/null
"$L" eval --model run/checkpoints/step-000040 --env arith:digits=1 --n 50 --samples 2 \
  --compare msft --json ev.json "${T[@]}" >/dev/null 2>&1

check "sft weights" d966a371e2674d9e9cc91041adc213ed680794f5da84a337ce412e34fbbeef4d \
  "$("${DIGEST[@]}" msft/model.safetensors)"
check "rl weights at step 10" 026f6dfb0ca3fa9a79ad3ef8b4c7dc2385c06f220f9c793b1c56d53491b72a36 \
  "$("${DIGEST[@]}" run/checkpoints/step-000010/model.safetensors)"
check "rl weights at step 20" 7a65e3c99bbb37d73b2dda2b486bb4a503225f8b42b719baa78a06d17e41b0ac \
  "$("${DIGEST[@]}" run/checkpoints/step-000020/model.safetensors)"
check "rl weights at step 30" 23259ab8901bd05883f67f2f458316a9eefe9b9390c407bb1c2a2b3db880e9d9 \
  "$("${DIGEST[@]}" run/checkpoints/step-000030/model.safetensors)"
check "rl weights at step 40" 2a6bc6342872c626a2137237ad6269cf9ca80b02229f01950da31b2a99d0719e \
  "$("${DIGEST[@]}" run/checkpoints/step-000040/model.safetensors)"
check "AdamW moments and counters at step 40" \
  bf5c8b1e9dfe909f6b141e3ca9c82c97975236ab9d75bc0b0ab8aac183229e65 \
  "$("${DIGEST[@]}" --only adam.,rl.counters run/checkpoints/step-000040/trainer_state.safetensors)"

# the metrics that do not measure time, and eval's per-task results and paired figures
metrics=$(/usr/bin/python3 - run/metrics.jsonl <<'PY'
import hashlib, json, sys
keys = ["step", "staleness", "reward_mean", "reward_std", "accuracy", "well_formed",
        "response_len", "entropy", "loss", "kl_loss", "kl_mu_pi", "clip_frac", "masked_frac",
        "ratio_min", "ratio_mean", "ratio_max", "grad_norm", "lr", "updates",
        "nonfinite_updates", "groups_used", "skipped_groups", "failed_groups"]
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 40, len(rows)
print(hashlib.sha256(json.dumps([[r[k] for k in keys] for r in rows]).encode()).hexdigest())
PY
)
check "rl metrics" 3977debe2a5a08f68810d849b10eb8d99406a090d313e35281a318507c3180cc "$metrics"
evald=$(/usr/bin/python3 - ev.json <<'PY'
import hashlib, json, sys
d = json.load(open(sys.argv[1]))
per = lambda m: [[t["index"], t["ok"], t["correct"], t["reward"]] for t in m["per_task"]]
out = [per(d["model"]), per(d["compare"]), d["paired"]["pass_at_1"], d["paired"]["pass_at_k"],
       d["paired"]["mean_reward"], d["model"]["pass_at_1"], d["compare"]["pass_at_1"]]
print(hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest())
PY
)
check "eval --json" 6d1545e8dd7a45b3b604f2ec010a07b34cf33fcfa690706cba80387e462c2390 "$evald"
[ $fail -eq 0 ] || exit 1
echo "regress: sft, rl (40 updates, staleness 2) and eval give the recorded numbers"
