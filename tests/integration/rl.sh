#!/usr/bin/env bash
# Integration test of `longhaul rl`: the RL smoke test (from a briefly sft-trained character
# model, reward on 1-digit arithmetic rises within a bounded number of steps), the run directory
# (metrics.jsonl fields, Hugging Face checkpoints, latest), exact --resume with staleness and
# minibatches, --keep (checkpoint rotation), resuming a run.json written before --max-prompt,
# refusals (different settings on resume, a prompt and completion longer than the context,
# bad flags, a missing checkpoint), paths that are not UTF-8 in run.json, and what a kill leaves
# (temporary checkpoint files, metrics past 1 GiB, a NaN Adam moment, null statistics), and
# --staleness-mix (reproducible, within the versions that exist, refused with --staleness).
# Usage: bash rl.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: rl.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: rl.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/rl.h" ] || { echo "rl.sh: $SRC is not the longhaul source tree"; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-rl.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}

# The base policy: a tiny character model taught 1-digit arithmetic for 150 steps (pass@1 at
# temperature 1 about 0.15: partly competent, so sampling finds rewarded answers).
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$TMP/base" \
  >/dev/null 2>"$TMP/init.err" || fail "init-model: $(cat "$TMP/init.err")"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 150 --batch 32 --log-every 150 \
  --threads 2 --out "$TMP/sft" 2>"$TMP/sft.err" || fail "sft: $(cat "$TMP/sft.err")"

# 1. Smoke test: reward rises. 200 steps of 16 prompts x 8 completions, lr 3e-4.
if "$BIN" rl --model "$TMP/sft" --env arith:digits=1 --out "$TMP/run" --steps 200 --lr 3e-4 \
  --max-new 8 --save-every 100 --log-every 50 --threads 2 2>"$TMP/run.err"; then
  $PY - "$TMP/run/metrics.jsonl" <<'PYEOF' || fail "smoke: $(cat "$TMP/run.err" | tail -n 3)"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 200, f"{len(rows)} metrics lines, expected 200"
want = ["step", "staleness", "reward_mean", "reward_std", "accuracy", "well_formed",
        "response_len", "entropy", "kl_mu_pi", "clip_frac", "masked_frac", "ratio_min",
        "ratio_mean", "ratio_max", "grad_norm", "lr", "updates", "nonfinite_updates",
        "skipped_groups", "failed_groups",
        "gen_tokens_per_s", "train_tokens_per_s", "gen_s", "train_s"]
missing = [k for k in want if k not in rows[0]]
assert not missing, f"metrics lack {missing}"
assert [r["step"] for r in rows] == list(range(1, 201)), "steps are not 1..200"
assert all(r["staleness"] == 0 for r in rows), "staleness is not 0"
assert all(r["nonfinite_updates"] == 0 for r in rows), "an update had a non-finite gradient"
first = sum(r["reward_mean"] for r in rows[:20]) / 20
last = sum(r["reward_mean"] for r in rows[-20:]) / 20
print(f"smoke: mean reward of steps 1-20 {first:.3f}, of steps 181-200 {last:.3f}")
assert last >= first + 0.05, f"reward did not rise: {first:.3f} -> {last:.3f}"
PYEOF
  for d in step-000100 step-000200; do
    for f in config.json model.safetensors tokenizer.json trainer_state.safetensors; do
      [ -f "$TMP/run/checkpoints/$d/$f" ] || fail "checkpoint $d lacks $f"
    done
  done
  [ "$(cat "$TMP/run/latest")" = step-000200 ] || fail "latest is '$(cat "$TMP/run/latest")'"
  # a checkpoint is a model directory the other commands load
  "$BIN" generate --model "$TMP/run/checkpoints/step-000200" --prompt "3+4=" --temperature 0 \
    --max-new 4 >/dev/null 2>"$TMP/gen.err" || fail "generate from a checkpoint: $(cat "$TMP/gen.err")"
else
  fail "rl smoke run: $(tail -n 3 "$TMP/run.err")"
fi

# 2. Exact resume: 6 steps at once equal 3 steps, then --resume to 6 (staleness 2, TIS over 2
# minibatches, so the queued batches carry recomputed log-probs): same metrics apart from
# timings, same weights and trainer state.
ARGS=(--model "$TMP/sft" --env arith:digits=1 --staleness 2 --minibatches 2 --loss tis
  --max-new 8 --save-every 3 --threads 2)
"$BIN" rl "${ARGS[@]}" --out "$TMP/a" --steps 6 2>"$TMP/a.err" || fail "run a: $(tail -n 2 "$TMP/a.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 3 2>"$TMP/b.err" || fail "run b: $(tail -n 2 "$TMP/b.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 6 --resume 2>"$TMP/b2.err" ||
  fail "resume b: $(tail -n 2 "$TMP/b2.err")"
for f in model.safetensors trainer_state.safetensors; do
  cmp -s "$TMP/a/checkpoints/step-000006/$f" "$TMP/b/checkpoints/step-000006/$f" ||
    fail "resume: $f differs from the uninterrupted run's"
done
$PY - "$TMP/a/metrics.jsonl" "$TMP/b/metrics.jsonl" <<'PYEOF' || fail "resume: metrics differ"
import json, sys
timing = {"gen_s", "train_s", "gen_tokens_per_s", "train_tokens_per_s", "time"}
a, b = ([{k: v for k, v in json.loads(l).items() if k not in timing} for l in open(p)]
        for p in sys.argv[1:])
assert len(a) == 6 and a == b, f"{len(a)} vs {len(b)} lines, or values differ"
assert [r["staleness"] for r in a] == [0, 1, 2, 2, 2, 2], [r["staleness"] for r in a]
PYEOF

# 3. KL penalty to the starting model: exactly 0 at the first update (the policy is the
# reference), positive once the policy has moved.
"$BIN" rl --model "$TMP/sft" --env arith:digits=1 --out "$TMP/kl" --steps 3 --kl-beta 0.1 \
  --max-new 8 --threads 2 2>"$TMP/kl.err" || fail "kl run: $(tail -n 2 "$TMP/kl.err")"
$PY - "$TMP/kl/metrics.jsonl" <<'PYEOF' || fail "kl: kl_loss not 0 then positive"
import json, sys
kl = [json.loads(l)["kl_loss"] for l in open(sys.argv[1])]
assert kl[0] == 0.0 and kl[2] > 0.0, kl
PYEOF

# 3b. --keep 2: only the two newest checkpoints remain, and a run resumes from them.
"$BIN" rl --model "$TMP/sft" --env arith:digits=1 --out "$TMP/keep" --steps 4 --save-every 1 \
  --keep 2 --max-new 8 --threads 2 2>"$TMP/keep.err" || fail "keep run: $(tail -n 2 "$TMP/keep.err")"
[ "$(ls "$TMP/keep/checkpoints")" = "$(printf 'step-000003\nstep-000004')" ] ||
  fail "--keep 2 left: $(ls "$TMP/keep/checkpoints" | tr '\n' ' ')"
"$BIN" rl --model "$TMP/sft" --env arith:digits=1 --out "$TMP/keep" --steps 6 --save-every 1 \
  --keep 2 --max-new 8 --threads 2 --resume 2>"$TMP/keep2.err" ||
  fail "keep resume: $(tail -n 2 "$TMP/keep2.err")"
[ "$(ls "$TMP/keep/checkpoints")" = "$(printf 'step-000005\nstep-000006')" ] ||
  fail "--keep 2 after resume left: $(ls "$TMP/keep/checkpoints" | tr '\n' ' ')"

# 3c. A run.json from before --max-prompt (no max_prompt key: the fixed 256 of that time)
# resumes; another --max-prompt does not.
$PY - "$TMP/b/run.json" <<'PYEOF' || fail "could not edit run.json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d.pop("max_prompt") == 256, "run.json lacks max_prompt 256"
json.dump(d, open(sys.argv[1], "w"))
PYEOF
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 7 --resume 2>"$TMP/b3.err" ||
  fail "resume of a run.json without max_prompt: $(tail -n 2 "$TMP/b3.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 8 --resume --max-prompt 100 >/dev/null 2>"$TMP/r4.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--max-prompt 100 (the run has 256)" "$TMP/r4.err" ||
  fail "resume with another --max-prompt: exit $rc, $(cat "$TMP/r4.err")"

# 4. Refusals.
"$BIN" rl --model "$TMP/sft" --env arith --out "$TMP/ctx" --max-prompt 2045 --max-new 8 \
  >/dev/null 2>"$TMP/ctx.err"
rc=$?
[ $rc -eq 1 ] && grep -q "exceed the model's context of 2048 tokens" "$TMP/ctx.err" ||
  fail "--max-prompt + --max-new beyond the context: exit $rc, $(cat "$TMP/ctx.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 8 --resume --lr 1e-2 >/dev/null 2>"$TMP/r1.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "other settings: --lr 1e-2 (the run has 0.0001)" "$TMP/r1.err" ||
  fail "resume with another lr: exit $rc, $(cat "$TMP/r1.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/b" --steps 8 >/dev/null 2>"$TMP/r3.err"
rc=$?
[ $rc -eq 1 ] && grep -q "already holds a run" "$TMP/r3.err" ||
  fail "a new run over an existing one: exit $rc, $(cat "$TMP/r3.err")"
"$BIN" rl "${ARGS[@]}" --out "$TMP/none" --steps 2 --resume >/dev/null 2>"$TMP/r2.err"
rc=$?
[ $rc -eq 1 ] && grep -q "cannot resume" "$TMP/r2.err" ||
  fail "resume without a run: exit $rc, $(cat "$TMP/r2.err")"
for bad in "--group 1" "--loss nope" "--staleness 65" "--steps 0" "--keep -1"; do
  # shellcheck disable=SC2086
  "$BIN" rl --model "$TMP/sft" --env arith --out "$TMP/x" $bad >/dev/null 2>"$TMP/bad.err"
  rc=$?
  [ $rc -eq 2 ] || fail "rl $bad: exit $rc, expected 2: $(cat "$TMP/bad.err")"
done
"$BIN" rl --model "$TMP/sft" --env nosuchenv --out "$TMP/x" >/dev/null 2>"$TMP/env.err"
rc=$?
[ $rc -eq 2 ] && grep -q "unknown environment" "$TMP/env.err" || fail "bad env: exit $rc"

# 5. Paths that are not UTF-8 (the model directory, a jsonl file) go into run.json with U+FFFD
# for the bad bytes, and the run resumes against them.
bad=$(printf '\xe9')
cp -r "$TMP/sft" "$TMP/s$bad"
for i in 1 2 3 4 5 6 7 8; do printf '{"prompt":"%d+1=","answer":"%d"}\n' $i $((i + 1)); done >"$TMP/d$bad.jsonl"
UTF8=(--model "$TMP/s$bad" --env "jsonl:path=$TMP/d$bad.jsonl" --out "$TMP/utf8" --prompts 2 --group 2
  --max-new 4 --threads 2)
if "$BIN" rl "${UTF8[@]}" --steps 1 >/dev/null 2>"$TMP/utf8.err" &&
  "$BIN" rl "${UTF8[@]}" --steps 2 --resume >/dev/null 2>>"$TMP/utf8.err"; then
  $PY - "$TMP/utf8/run.json" <<'PYEOF' || fail "run.json of non-UTF-8 paths"
import json, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
assert r["model"].endswith("/s\ufffd") and r["env"].endswith("/d\ufffd.jsonl"), r
PYEOF
else
  fail "rl with non-UTF-8 paths: $(cat "$TMP/utf8.err")"
fi

# 6. Checkpoints and metrics after a kill. SMALL runs are 2 prompts x 2 completions.
SMALL=(--model "$TMP/sft" --env arith:digits=1 --prompts 2 --group 2 --max-new 4 --threads 2)
# 6a. A run killed while writing step 2 left step-000002.tmp with a partial temporary file: the
# resumed run neither renames it into step 2 nor leaves it for --keep to trip on.
"$BIN" rl "${SMALL[@]}" --out "$TMP/kp" --steps 1 --save-every 1 --keep 1 2>"$TMP/kp.err" ||
  fail "kp run: $(tail -n 2 "$TMP/kp.err")"
mkdir -p "$TMP/kp/checkpoints/step-000002.tmp"
head -c 3000 /dev/urandom >"$TMP/kp/checkpoints/step-000002.tmp/model.safetensors.tmp.99999"
"$BIN" rl "${SMALL[@]}" --out "$TMP/kp" --steps 4 --save-every 1 --keep 1 --resume 2>"$TMP/kp2.err" ||
  fail "kp resume: $(tail -n 2 "$TMP/kp2.err")"
[ "$(ls "$TMP/kp/checkpoints")" = "step-000004" ] ||
  fail "--keep 1 after a killed write left: $(ls "$TMP/kp/checkpoints" | tr '\n' ' ')"
grep -q "cannot remove" "$TMP/kp2.err" && fail "--keep warned: $(grep "cannot remove" "$TMP/kp2.err")"
# 6b. A kill after step 2 was renamed into place but before `latest` named it, with a stray
# temporary file inside: the resumed run replaces step 2 (it used to stop at "Directory not
# empty" on every later --resume).
"$BIN" rl "${SMALL[@]}" --out "$TMP/st" --steps 2 --save-every 1 2>"$TMP/st.err" ||
  fail "st run: $(tail -n 2 "$TMP/st.err")"
cp "$TMP/st/checkpoints/step-000002/model.safetensors" \
  "$TMP/st/checkpoints/step-000002/model.safetensors.tmp.12345"
echo step-000001 >"$TMP/st/latest"
if "$BIN" rl "${SMALL[@]}" --out "$TMP/st" --steps 3 --save-every 1 --resume 2>"$TMP/st2.err"; then
  [ -e "$TMP/st/checkpoints/step-000002/model.safetensors.tmp.12345" ] &&
    fail "the stray temporary file survived the replacement of step 2"
else
  fail "resume over a step directory with a stray file: $(tail -n 2 "$TMP/st2.err")"
fi
# 6c. Without `latest` but with checkpoints the error says why, once (a run stopped before its
# first checkpoint has neither, and starts again from its model).
rm "$TMP/st/latest"
"$BIN" rl "${SMALL[@]}" --out "$TMP/st" --steps 4 --resume >/dev/null 2>"$TMP/st3.err"
rc=$?
[ $rc -eq 1 ] && grep -q "cannot resume: $TMP/st/latest is missing, but $TMP/st/checkpoints holds" "$TMP/st3.err" &&
  [ "$(grep -o "cannot resume" "$TMP/st3.err" | wc -l)" -eq 1 ] ||
  fail "resume without latest: exit $rc, $(cat "$TMP/st3.err")"
# 6d. metrics.jsonl past 1 GiB (a sparse hole stands in for a long run) is still cut back to the
# checkpoint's step on resume: no line is written twice.
"$BIN" rl "${SMALL[@]}" --out "$TMP/mt" --steps 3 --save-every 2 2>"$TMP/mt.err" ||
  fail "mt run: $(tail -n 2 "$TMP/mt.err")"
truncate -s +1100M "$TMP/mt/metrics.jsonl"
echo step-000002 >"$TMP/mt/latest"
"$BIN" rl "${SMALL[@]}" --out "$TMP/mt" --steps 4 --save-every 2 --resume 2>"$TMP/mt2.err" ||
  fail "mt resume: $(tail -n 2 "$TMP/mt2.err")"
$PY - "$TMP/mt/metrics.jsonl" <<'PYEOF' || fail "metrics after resume of a file past 1 GiB"
import json, os, sys
assert os.path.getsize(sys.argv[1]) < 1 << 20, os.path.getsize(sys.argv[1])
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == [1, 2, 3, 4], steps
PYEOF
# 6e. A NaN Adam moment in the trainer state is refused on resume (it turned every later step
# to NaN, and the run exited 0).
$PY - "$TMP/mt/checkpoints/step-000004/trainer_state.safetensors" <<'PYEOF' || fail "could not edit the state"
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
start = json.loads(b[8:8 + n])["adam.m"]["data_offsets"][0]
b[8 + n + start:8 + n + start + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(b)
PYEOF
echo step-000004 >"$TMP/mt/latest"
"$BIN" rl "${SMALL[@]}" --out "$TMP/mt" --steps 5 --save-every 2 --resume >/dev/null 2>"$TMP/mt3.err"
rc=$?
[ $rc -eq 1 ] && grep -q "adam.m\[0\] is nan" "$TMP/mt3.err" ||
  fail "resume from a NaN Adam moment: exit $rc, $(cat "$TMP/mt3.err")"
# A queued batch whose policy version cannot be (99 at step 1 with --staleness 1) is refused too.
"$BIN" rl "${SMALL[@]}" --staleness 1 --out "$TMP/qv" --steps 1 2>"$TMP/qv.err" ||
  fail "qv run: $(tail -n 2 "$TMP/qv.err")"
$PY - "$TMP/qv/checkpoints/step-000001/trainer_state.safetensors" <<'PYEOF' || fail "could not edit the state"
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
start = json.loads(b[8:8 + n])["queue.0"]["data_offsets"][0] + 24  # the batch's version field
b[8 + n + start:8 + n + start + 8] = struct.pack("<q", 99)
open(p, "wb").write(b)
PYEOF
"$BIN" rl "${SMALL[@]}" --staleness 1 --out "$TMP/qv" --steps 2 --resume >/dev/null 2>"$TMP/qv2.err"
rc=$?
[ $rc -eq 1 ] && grep -q "queue.0: version 99, expected 0..1" "$TMP/qv2.err" ||
  fail "resume with a queued version of 99: exit $rc, $(cat "$TMP/qv2.err")"
# 6f. An env without train tasks is refused before step 1.
: >"$TMP/empty.jsonl"
printf '{"prompt":"1+1=","answer":"2"}\n' >"$TMP/two.jsonl"
"$BIN" rl --model "$TMP/sft" --env "jsonl:path=$TMP/empty.jsonl,test=$TMP/two.jsonl" --out "$TMP/et" \
  >/dev/null 2>"$TMP/et.err"
rc=$?
[ $rc -eq 1 ] && grep -q "has no train tasks" "$TMP/et.err" ||
  fail "rl on an empty train split: exit $rc, $(cat "$TMP/et.err")"
# 6g. A step that trains on nothing (one-token completions: every sort answer is wrong, so every
# group is skipped) reports null losses and ratios, not 0.
"$BIN" rl --model "$TMP/sft" --env sort:count=4,digits=1 --prompts 2 --group 2 --max-new 1 \
  --threads 2 --steps 1 --out "$TMP/nt" 2>"$TMP/nt.err" || fail "nt run: $(tail -n 2 "$TMP/nt.err")"
$PY - "$TMP/nt/metrics.jsonl" <<'PYEOF' || fail "metrics of a step that trained on nothing"
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["skipped_groups"] == 2 and r["updates"] == 0, r
for k in ("loss", "kl_loss", "kl_mu_pi", "clip_frac", "masked_frac", "ratio_min", "ratio_mean",
          "ratio_max", "grad_norm"):
    assert r[k] is None, (k, r)
PYEOF

# 7. --staleness-mix K: each group from a version drawn from the last K + 1. The run is a pure
# function of its settings (two runs, the same metrics and weights); the draws stay within the
# versions that exist (at update s the mean staleness is at most min(s - 1, K)); some groups are
# stale and the metrics record it; the two modes of lag together are refused.
MIX=(--model "$TMP/sft" --env arith:digits=1 --prompts 4 --group 4 --max-new 8
  --staleness-mix 3 --seed 5 --save-every 0 --threads 2)
"$BIN" rl "${MIX[@]}" --steps 12 --out "$TMP/mix1" >/dev/null 2>"$TMP/mix1.err" &&
  "$BIN" rl "${MIX[@]}" --steps 12 --out "$TMP/mix2" >/dev/null 2>"$TMP/mix2.err" ||
  fail "staleness-mix runs: $(tail -n 2 "$TMP/mix1.err" "$TMP/mix2.err")"
$PY - "$TMP/mix1/metrics.jsonl" "$TMP/mix2/metrics.jsonl" <<'PYEOF' || fail "staleness-mix metrics"
import json, sys
drop = ("gen_s", "train_s", "gen_tokens_per_s", "train_tokens_per_s", "time")
a, b = ([{k: v for k, v in json.loads(l).items() if k not in drop} for l in open(p)]
        for p in sys.argv[1:])
assert a == b, "two runs with the same settings differ"
assert len(a) == 12
for r in a:
    s = r["step"]
    assert 0 <= r["staleness_mean"] <= min(s - 1, 3), r
    assert r["staleness"] <= min(s - 1, 3), r  # the oldest group's
assert any(r["staleness_mean"] > 0 for r in a), "no group was stale"
assert a[0]["staleness_mean"] == 0, a[0]
print("staleness-mix: mean staleness per update", [round(r["staleness_mean"], 2) for r in a])
PYEOF
cmp -s "$TMP/mix1/checkpoints/step-000012/model.safetensors" \
  "$TMP/mix2/checkpoints/step-000012/model.safetensors" || fail "staleness-mix: weights differ"
"$BIN" rl "${MIX[@]}" --staleness 2 --out "$TMP/mix3" >/dev/null 2>"$TMP/mix3.err"
rc=$?
[ $rc -eq 2 ] && grep -q "two modes of lag" "$TMP/mix3.err" ||
  fail "--staleness with --staleness-mix: exit $rc, $(cat "$TMP/mix3.err")"
# a resumed mixed run continues (it keeps only the versions since it resumed)
"$BIN" rl "${MIX[@]}" --steps 6 --out "$TMP/mix4" >/dev/null 2>"$TMP/mix4.err" &&
  "$BIN" rl --out "$TMP/mix4" --steps 12 --resume >/dev/null 2>>"$TMP/mix4.err" &&
  [ "$(wc -l <"$TMP/mix4/metrics.jsonl")" -eq 12 ] ||
  fail "staleness-mix resume: $(tail -n 2 "$TMP/mix4.err")"

if [ $FAILED -gt 0 ]; then
  echo "rl.sh: $FAILED check(s) failed"
  exit 1
fi
echo "rl.sh: all checks passed"
