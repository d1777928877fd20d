#!/usr/bin/env bash
# Policy patches from the command line and by an independent decoder: tests/ref/patch_decode.py
# (written from docs/PROTOCOL.md alone) applies the committed fixture and a fresh patch of a real
# RL update and checks both hashes; `patch apply` reproduces the child bit for bit; a patch of
# another parent, a truncated or corrupted patch, models of two shapes and a --model of another
# shape are refused with clear errors, and a refused apply writes nothing.
# Usage: bash patch.sh LONGHAUL_BIN SOURCE_DIR
set -uo pipefail
BIN=${1:?usage: patch.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: patch.sh LONGHAUL_BIN SOURCE_DIR}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-patch.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}
refused() { # NAME NEEDLE CMD...: exit 1 and the needle in stderr
  local name=$1 needle=$2
  shift 2
  "$@" >/dev/null 2>"$TMP/$name.err"
  local rc=$?
  [ $rc -eq 1 ] && grep -q -- "$needle" "$TMP/$name.err" ||
    fail "$name: exit $rc, expected 1 with '$needle': $(cat "$TMP/$name.err")"
}

# 1. The independent decoder applies the committed fixture.
$PY "$SRC/tests/ref/patch_decode.py" "$SRC/tests/fixtures/patch/parent" \
  "$SRC/tests/fixtures/patch/v1-v2.lhp" >"$TMP/fx.out" 2>&1 || fail "patch_decode.py on the fixture: $(cat "$TMP/fx.out")"
grep -q "both hashes ok" "$TMP/fx.out" || fail "fixture: $(cat "$TMP/fx.out")"

# 2. A real RL update: make, apply (bit for bit), stats, and the independent decoder.
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 3 --out "$TMP/m" >/dev/null 2>&1
"$BIN" sft --model "$TMP/m" --env arith:digits=1 --steps 150 --batch 16 --threads 2 --out "$TMP/s" 2>/dev/null
"$BIN" rl --model "$TMP/s" --env arith:digits=1 --out "$TMP/r" --steps 2 --save-every 1 \
  --prompts 8 --group 8 --max-new 4 --threads 2 >/dev/null 2>&1 || fail "rl"
C1=$TMP/r/checkpoints/step-000001
C2=$TMP/r/checkpoints/step-000002
"$BIN" patch make --from "$C1" --to "$C2" --out "$TMP/p.lhp" --from-version 1 2>"$TMP/make.err" ||
  fail "patch make: $(cat "$TMP/make.err")"
grep -Eq "^patch make: [1-9][0-9]* of [0-9]+ values changed" "$TMP/make.err" ||
  fail "patch make (an update that changed nothing?): $(cat "$TMP/make.err")"
"$BIN" patch apply --model "$C1" --patch "$TMP/p.lhp" --out "$TMP/child" 2>"$TMP/apply.err" ||
  fail "patch apply: $(cat "$TMP/apply.err")"
[ -f "$TMP/child/tokenizer.json" ] || fail "patch apply did not copy tokenizer.json"
"$BIN" patch make --from "$C2" --to "$TMP/child" --out "$TMP/same.lhp" 2>"$TMP/same.err"
grep -q "^patch make: 0 of " "$TMP/same.err" || fail "the applied child differs from step 2: $(cat "$TMP/same.err")"
"$BIN" patch stats "$TMP/p.lhp" --model "$C1" >"$TMP/stats.out" || fail "patch stats"
grep -q "version 1 -> 2" "$TMP/stats.out" && grep -q "model.layers.3.mlp.down_proj.weight" "$TMP/stats.out" ||
  fail "patch stats: $(head -n 8 "$TMP/stats.out")"
"$BIN" generate --model "$TMP/child" --prompt "1+2=" --max-new 2 >/dev/null 2>&1 || fail "the child does not load"
# the decoder needs a bf16 parent: the child of an empty patch of step 1 is one
"$BIN" patch make --from "$C1" --to "$C1" --out "$TMP/none.lhp" 2>/dev/null
"$BIN" patch apply --model "$C1" --patch "$TMP/none.lhp" --out "$TMP/p1" 2>/dev/null || fail "apply none"
$PY "$SRC/tests/ref/patch_decode.py" "$TMP/p1" "$TMP/p.lhp" "$TMP/child.bf16" >"$TMP/py.out" 2>&1 ||
  fail "patch_decode.py on a fresh patch: $(cat "$TMP/py.out")"

# 3. Refusals, and nothing written.
refused wrong-parent "made from version 1" "$BIN" patch apply --model "$C2" --patch "$TMP/p.lhp" --out "$TMP/x1"
[ -e "$TMP/x1" ] && fail "a refused apply wrote $TMP/x1"
head -c 5000 "$TMP/p.lhp" >"$TMP/short.lhp"
refused truncated "patch" "$BIN" patch apply --model "$C1" --patch "$TMP/short.lhp" --out "$TMP/x2"
cp "$TMP/p.lhp" "$TMP/bad.lhp"
printf '\x55' | dd of="$TMP/bad.lhp" bs=1 seek=3000 conv=notrunc 2>/dev/null
refused corrupted "patch" "$BIN" patch apply --model "$C1" --patch "$TMP/bad.lhp" --out "$TMP/x3"
[ -e "$TMP/x3" ] && fail "a refused apply wrote $TMP/x3"
$PY "$SRC/tests/ref/patch_decode.py" "$TMP/p1" "$TMP/bad.lhp" >/dev/null 2>&1 &&
  fail "patch_decode.py accepted a corrupted patch"
"$BIN" init-model --arch qwen2 --preset small --seed 1 --out "$TMP/big" >/dev/null 2>&1
refused shapes "other shapes" "$BIN" patch make --from "$C1" --to "$TMP/big" --out "$TMP/x4"
refused stats-shape "the patch" "$BIN" patch stats "$TMP/p.lhp" --model "$TMP/big"
refused not-a-patch "not a policy patch" "$BIN" patch stats "$C1/config.json"

if [ $FAILED -gt 0 ]; then
  echo "patch.sh: $FAILED check(s) failed"
  exit 1
fi
echo "patch.sh: all checks passed"
