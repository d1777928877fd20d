#!/usr/bin/env bash
# Run directories as a user meets them (issue 13): --model accepts RUN and RUN/latest; `rl --out
# RUN --resume` alone is enough and differing flags are listed together; SIGINT/SIGTERM stop
# after the step with a checkpoint (130/143); a failed start leaves no run directory; a run is
# locked while a process writes it; a trainer state copied into another checkpoint is refused;
# run.json and metrics carry the command, version and times; the end-of-run summary; the
# no-signal warning; an environment that fails every task fails the run; sft --out refuses a
# non-empty directory without --force, removes a stale generation_config.json, and stops on a
# signal with the model written.
# Usage: bash rundir.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: rundir.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: rundir.sh LONGHAUL_BIN SOURCE_DIR}
. "$(dirname "$0")/lib.bash"
lh_setup rundir
PY=/usr/bin/python3
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}
# wait_lines FILE N: until FILE has N lines (at most 60 s)
wait_lines() {
  for _ in $(seq 600); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out "$TMP/base" \
  >/dev/null 2>&1 || fail "init-model"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 60 --batch 16 --threads 2 \
  --out "$TMP/sft" 2>"$TMP/sft.err" || fail "sft: $(cat "$TMP/sft.err")"
SMALL=(--env arith:digits=1 --prompts 2 --group 2 --max-new 4 --threads 2)

# 1. A finished run: summary, run.json's provenance, metrics times, --model RUN and RUN/latest.
"$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/r" --steps 4 --save-every 2 \
  >/dev/null 2>"$TMP/r.err" || fail "rl: $(tail -n 3 "$TMP/r.err")"
grep -q "^rl: 4 steps in " "$TMP/r.err" || fail "no summary line: $(tail -n 6 "$TMP/r.err")"
grep -q "reward .* -> .*, accuracy .* -> " "$TMP/r.err" || fail "summary lacks reward first -> last"
grep -q "policy: $TMP/r/checkpoints/step-000004" "$TMP/r.err" || fail "summary lacks the policy"
grep -q "next: longhaul eval --model $TMP/r --env arith:digits=1 --compare $TMP/sft" "$TMP/r.err" ||
  fail "summary lacks the eval command: $(tail -n 4 "$TMP/r.err")"
$PY - "$TMP/r" <<'PYEOF' || fail "run.json or metrics.jsonl provenance"
import json, sys, re
r = json.load(open(sys.argv[1] + "/run.json"))
assert r["command"].split()[:3] == ["longhaul", "rl", "--model"], r["command"]
assert re.match(r"^\d+\.\d+\.\d+$", r["longhaul_version"]), r
assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", r["started"]), r
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert len(rows) == 4
assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", x["time"]) for x in rows), rows
PYEOF
for m in "$TMP/r" "$TMP/r/latest"; do
  "$BIN" eval --model "$m" --env arith:digits=1 --n 4 --threads 2 >"$TMP/e.out" 2>"$TMP/e.err" ||
    fail "eval --model $m: $(cat "$TMP/e.err")"
  grep -q "model $TMP/r/checkpoints/step-000004: " "$TMP/e.out" ||
    fail "eval --model $m did not use the latest checkpoint: $(head -n 2 "$TMP/e.out")"
  "$BIN" generate --model "$m" --prompt "1+1=" --max-new 2 >/dev/null 2>"$TMP/g.err" ||
    fail "generate --model $m: $(cat "$TMP/g.err")"
done

# 2. --resume alone takes the settings from run.json; flags that differ are listed together.
"$BIN" rl --out "$TMP/r" --resume --steps 6 >/dev/null 2>"$TMP/res.err" ||
  fail "rl --out RUN --resume: $(tail -n 3 "$TMP/res.err")"
grep -q "^rl: resuming $TMP/r from step 4$" "$TMP/res.err" || fail "no 'resuming' line: $(head -n 2 "$TMP/res.err")"
[ "$(cat "$TMP/r/latest")" = step-000006 ] || fail "resume did not reach step 6"
"$BIN" rl --out "$TMP/r" --resume --steps 8 --group 4 --lr 3e-4 --env arith:digits=2 \
  --model "$TMP/sft/" >/dev/null 2>"$TMP/diff.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--env arith:digits=2 (the run has arith:digits=1), --group 4 (the run has 2), --lr 3e-4 (the run has 0.0001)" "$TMP/diff.err" &&
  ! grep -q -- "--model" "$TMP/diff.err" && [ "$(wc -l <"$TMP/diff.err")" -eq 1 ] ||
  fail "differing flags on resume: exit $rc, $(cat "$TMP/diff.err")"

# 3. SIGINT and SIGTERM: the step ends, a checkpoint is written, exit 130 / 143.
for sig in INT TERM; do
  "$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/s$sig" --steps 100000 --save-every 0 \
    >/dev/null 2>"$TMP/s$sig.err" &
  pid=$!
  PIDS+=("$pid")
  wait_lines "$TMP/s$sig/metrics.jsonl" 3 || fail "SIG$sig: the run made no progress"
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  want=$([ $sig = INT ] && echo 130 || echo 143)
  n=$(wc -l <"$TMP/s$sig/metrics.jsonl")
  [ $rc -eq "$want" ] || fail "SIG$sig: exit $rc, expected $want: $(tail -n 3 "$TMP/s$sig.err")"
  [ "$(cat "$TMP/s$sig/latest" 2>/dev/null)" = "$(printf 'step-%06d' "$n")" ] ||
    fail "SIG$sig: latest is '$(cat "$TMP/s$sig/latest" 2>/dev/null)' after $n steps"
  grep -q "stopped by SIG$sig after step $n" "$TMP/s$sig.err" &&
    grep -q "continue with: longhaul rl --out $TMP/s$sig --resume" "$TMP/s$sig.err" ||
    fail "SIG$sig: no stop message: $(tail -n 4 "$TMP/s$sig.err")"
done
# the stopped run resumes to a later step, and a temporary file a killed write left (of a process
# that no longer runs) is removed when it starts; one of a live process is not
: >"$TMP/sINT/metrics.jsonl.tmp.999999999.0"
: >"$TMP/sINT/checkpoints/latest.tmp.999999999.3"
: >"$TMP/sINT/run.json.tmp.1.0"
"$BIN" rl --out "$TMP/sINT" --resume --steps $(($(wc -l <"$TMP/sINT/metrics.jsonl") + 2)) \
  >/dev/null 2>"$TMP/sr.err" || fail "resume after SIGINT: $(tail -n 3 "$TMP/sr.err")"
[ -e "$TMP/sINT/metrics.jsonl.tmp.999999999.0" ] || [ -e "$TMP/sINT/checkpoints/latest.tmp.999999999.3" ] &&
  fail "stale temporary files survived the start"
[ -e "$TMP/sINT/run.json.tmp.1.0" ] || fail "the temporary file of a live pid (1) was removed"

# 4. Two processes on one run: the second is refused while the first holds it.
"$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/lock" --steps 100000 --save-every 0 \
  >/dev/null 2>"$TMP/lock1.err" &
pid=$!
PIDS+=("$pid")
wait_lines "$TMP/lock/metrics.jsonl" 1 || fail "lock: the first run made no progress"
"$BIN" rl --out "$TMP/lock" --resume --steps 100000 >/dev/null 2>"$TMP/lock2.err"
rc=$?
[ $rc -eq 1 ] && grep -q "$TMP/lock is in use by another longhaul process (pid $pid)" "$TMP/lock2.err" ||
  fail "a second process on a locked run: exit $rc, $(cat "$TMP/lock2.err")"
kill -9 "$pid"
wait "$pid" 2>/dev/null

# 5. A failed start leaves no run directory (missing model, bad env, a model without tokenizer).
"$BIN" rl --model "$TMP/nonexistent" "${SMALL[@]}" --out "$TMP/f1" --steps 2 >/dev/null 2>&1
[ -e "$TMP/f1" ] && fail "rl with a missing model left $TMP/f1: $(ls -A "$TMP/f1")"
"$BIN" rl --model "$TMP/sft" --env "jsonl:path=$TMP/none.jsonl" --out "$TMP/f2" --steps 2 >/dev/null 2>&1
[ -e "$TMP/f2" ] && fail "rl with a bad env left $TMP/f2"
mkdir "$TMP/f3"
echo keep >"$TMP/f3/notes.txt"
"$BIN" rl --model "$TMP/base" --env sort --out "$TMP/f3" --max-prompt 2045 --max-new 8 --steps 2 \
  >/dev/null 2>&1 && fail "rl beyond the context succeeded"
[ "$(ls -A "$TMP/f3")" = notes.txt ] || fail "a failed start in an existing directory left: $(ls -A "$TMP/f3")"

# 6. A trainer state copied into another checkpoint is refused on resume.
"$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/cp" --steps 2 --save-every 1 \
  >/dev/null 2>&1 || fail "cp run"
cp "$TMP/cp/checkpoints/step-000001/trainer_state.safetensors" "$TMP/cp/checkpoints/step-000002/"
"$BIN" rl --out "$TMP/cp" --resume --steps 3 >/dev/null 2>"$TMP/cp.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the trainer state is of step 1, but it is in the checkpoint of step 2" "$TMP/cp.err" ||
  fail "a state of another step: exit $rc, $(cat "$TMP/cp.err")"
# same step, other weights: the hash says so
"$BIN" rl --model "$TMP/base" "${SMALL[@]}" --out "$TMP/cp2" --steps 2 --save-every 1 \
  >/dev/null 2>&1 || fail "cp2 run"
cp "$TMP/cp2/checkpoints/step-000002/trainer_state.safetensors" "$TMP/cp/checkpoints/step-000002/"
"$BIN" rl --out "$TMP/cp" --resume --steps 3 >/dev/null 2>"$TMP/cp2.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the trainer state belongs to weights with BLAKE2b" "$TMP/cp2.err" ||
  fail "a state of other weights: exit $rc, $(cat "$TMP/cp2.err")"

# 7. An environment that fails every task fails the run (exit 1, no checkpoint).
printf '#!/bin/sh\nexit 3\n' >"$TMP/dead.sh"
"$BIN" rl --model "$TMP/sft" --env "exec:path=sh $TMP/dead.sh" --prompts 2 --group 2 --max-new 4 \
  --threads 2 --out "$TMP/dead" --steps 2 >/dev/null 2>"$TMP/dead.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the environment failed on all 2 tasks of batch 0" "$TMP/dead.err" ||
  fail "rl on an env that fails every task: exit $rc, $(tail -n 2 "$TMP/dead.err")"

# 8. Most groups without signal for 20 steps: one warning (one-token sort answers are all wrong).
"$BIN" rl --model "$TMP/sft" --env sort:count=4,digits=1 --prompts 2 --group 2 --max-new 1 \
  --threads 2 --steps 41 --out "$TMP/quiet" >/dev/null 2>"$TMP/quiet.err" || fail "quiet run"
[ "$(grep -c "so they taught nothing" "$TMP/quiet.err")" -eq 1 ] ||
  fail "no-signal warning: $(grep -c "taught nothing" "$TMP/quiet.err") times"

# 9. sft: a non-empty --out needs --force; a stale generation_config.json there is removed; a
# signal stops it after the step with the model written (exit 130).
mkdir -p "$TMP/so"
printf '{"eos_token_id": 5}\n' >"$TMP/so/generation_config.json"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 2 --batch 4 --out "$TMP/so" \
  >/dev/null 2>"$TMP/so.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--out $TMP/so is not empty" "$TMP/so.err" ||
  fail "sft into a non-empty --out: exit $rc, $(cat "$TMP/so.err")"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 2 --batch 4 --out "$TMP/so" --force \
  >/dev/null 2>"$TMP/so2.err" || fail "sft --force: $(cat "$TMP/so2.err")"
[ -e "$TMP/so/generation_config.json" ] && fail "sft left a stale generation_config.json"
"$BIN" generate --model "$TMP/so" --prompt "1+1=" --max-new 2 >/dev/null 2>&1 ||
  fail "the sft output does not load"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 1000000 --batch 4 --out "$TMP/sint" \
  >/dev/null 2>"$TMP/sint.err" &
pid=$!
PIDS+=("$pid")
# once it trains (its first progress line): a background job of this script starts with SIGINT
# ignored until sft installs its handler, so an earlier SIGINT (a slow start: TSan, load) is lost
for _ in $(seq 600); do grep -q "^sft: step" "$TMP/sint.err" 2>/dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
rc=$?
[ $rc -eq 130 ] && grep -q "stopped by SIGINT after step [0-9]* of 1000000; wrote the model trained so far to $TMP/sint" "$TMP/sint.err" &&
  [ -f "$TMP/sint/model.safetensors" ] ||
  fail "sft after SIGINT: exit $rc, $(tail -n 2 "$TMP/sint.err")"

# 10. A bad environment spec is a usage error (exit 2) listing the valid keys, for rl, sft and eval,
# and rl leaves no run directory.
for cmd in "rl --model $TMP/sft --out $TMP/spec" "sft --model $TMP/sft --out $TMP/spec" \
  "eval --model $TMP/sft"; do
  # shellcheck disable=SC2086
  "$BIN" $cmd --env arith:digits=0 >/dev/null 2>"$TMP/spec.err"
  rc=$?
  [ $rc -eq 2 ] && grep -q "valid keys: digits (1..9" "$TMP/spec.err" ||
    fail "${cmd%% *} --env arith:digits=0: exit $rc, $(cat "$TMP/spec.err")"
done
[ -e "$TMP/spec" ] && fail "rl with a bad spec left $TMP/spec"

# 11. Review findings. A failed start keeps a metrics.jsonl it did not write, and removes the
# parent directories it made; --keep keeps a file of the user's in an old checkpoint (with a
# warning); sft --out naming a file is refused before training; an equivalent env spec resumes.
mkdir "$TMP/ud"
echo precious >"$TMP/ud/metrics.jsonl"
"$BIN" rl --model "$TMP/nope" "${SMALL[@]}" --out "$TMP/ud" >/dev/null 2>&1
[ "$(cat "$TMP/ud/metrics.jsonl" 2>/dev/null)" = precious ] || fail "a failed start removed metrics.jsonl"
"$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/ud" --steps 1 >/dev/null 2>"$TMP/ud.err"
[ $? -eq 1 ] && grep -q "already holds a run (see $TMP/ud/metrics.jsonl)" "$TMP/ud.err" ||
  fail "a new run over a metrics.jsonl: $(cat "$TMP/ud.err")"
"$BIN" rl --model "$TMP/nope" "${SMALL[@]}" --out "$TMP/p1/p2/run" >/dev/null 2>&1
[ -e "$TMP/p1" ] && fail "a failed start left the parents it made: $(find "$TMP/p1")"
"$BIN" rl --model "$TMP/sft" "${SMALL[@]}" --out "$TMP/kp" --steps 2 --save-every 1 \
  >/dev/null 2>&1 || fail "kp run"
echo mine >"$TMP/kp/checkpoints/step-000001/notes.txt"
"$BIN" rl --out "$TMP/kp" --resume --steps 3 --save-every 1 --keep 1 >/dev/null 2>"$TMP/kp.err" ||
  fail "kp resume: $(tail -n 2 "$TMP/kp.err")"
[ "$(ls "$TMP/kp/checkpoints/step-000001")" = notes.txt ] &&
  grep -q -- "--keep: cannot remove $TMP/kp/checkpoints/step-000001" "$TMP/kp.err" ||
  fail "--keep and a user's file: $(ls "$TMP/kp/checkpoints/step-000001"), $(cat "$TMP/kp.err")"
: >"$TMP/afile"
"$BIN" sft --model "$TMP/base" --env arith:digits=1 --steps 100000 --out "$TMP/afile" \
  >/dev/null 2>"$TMP/afile.err"
[ $? -eq 2 ] && grep -q "exists and is not a directory" "$TMP/afile.err" ||
  fail "sft --out FILE: $(cat "$TMP/afile.err")"
"$BIN" rl --out "$TMP/kp" --resume --steps 4 --env "arith:digits=1,ops=+-" >/dev/null 2>"$TMP/eq.err" ||
  fail "resume with an equivalent --env: $(cat "$TMP/eq.err")"

# 12. A model path that is not UTF-8: --resume alone still finds it (for the KL reference and
# for a run without a checkpoint yet).
M="$TMP/mod$(printf '\xfe')"
cp -r "$TMP/sft" "$M"
"$BIN" rl --model "$M" "${SMALL[@]}" --out "$TMP/u8" --steps 1 --save-every 5 --kl-beta 0.1 \
  >/dev/null 2>"$TMP/u8.err" || fail "u8 run: $(tail -n 2 "$TMP/u8.err")"
rm -rf "$TMP/u8/checkpoints" "$TMP/u8/latest" # as if stopped before its first checkpoint
"$BIN" rl --out "$TMP/u8" --resume --steps 2 >/dev/null 2>"$TMP/u8b.err" ||
  fail "resume of a non-UTF-8 model path: $(tail -n 2 "$TMP/u8b.err")"

if [ $FAILED -gt 0 ]; then
  echo "rundir.sh: $FAILED check(s) failed"
  exit 1
fi
echo "rundir.sh: all checks passed"
