#!/usr/bin/env bash
# Integration test of the commands of policy sync, run against the built binary and checked
# against tests/ref/sync_ref.py (an implementation of docs/PROTOCOL.md in Python, with its own
# Ed25519): keygen (files, modes, formats, never replacing a key without --force), manifest sign
# and verify (the same bytes as the Python signer; every kind of bad manifest refused with one
# line), and snapshot make/show (decoded by Python to the same slab hash, and the reverse).
# Usage: bash sync.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: sync.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: sync.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/sync.h" ] || { echo "sync.sh: $SRC is not the longhaul source tree"; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
REF="$SRC/tests/ref/sync_ref.py"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-sync.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

FAILED=0
CHECKS=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}
pass() {
  CHECKS=$((CHECKS + 1))
}

# run NAME CMD...: runs CMD, keeps stdout/stderr in $TMP/NAME.{out,err} and the status in $RC.
run() {
  local name=$1
  shift
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
}

expect_rc() { # NAME WANT
  if [ "$RC" -ne "$2" ]; then
    fail "$1: exit code $RC, expected $2; stderr: $(head -c 400 "$TMP/$1.err")"
    return 1
  fi
  pass
}

# expect_refused NAME PATTERN: exit code 1 and exactly one line on stderr matching PATTERN.
expect_refused() {
  expect_rc "$1" 1 || return 1
  local lines
  lines=$(wc -l <"$TMP/$1.err")
  if [ "$lines" -ne 1 ]; then
    fail "$1: expected a one-line error, got $lines lines: $(head -c 400 "$TMP/$1.err")"
    return 1
  fi
  if ! grep -Eq -- "$2" "$TMP/$1.err"; then
    fail "$1: error does not match /$2/: $(cat "$TMP/$1.err")"
    return 1
  fi
  pass
}

expect_out() { # NAME PATTERN: stdout matches PATTERN
  if ! grep -Eq -- "$2" "$TMP/$1.out"; then
    fail "$1: stdout does not match /$2/: $(head -c 400 "$TMP/$1.out")"
    return 1
  fi
  pass
}

same_file() { # NAME A B
  if ! cmp -s "$2" "$3"; then
    fail "$1: $2 and $3 differ"
    return 1
  fi
  pass
}

mode_of() { stat -c %a "$1"; }

# ------------------------------------------------------------------ keygen
K=$TMP/trainer.key
run keygen "$BIN" keygen --out "$K"
expect_rc keygen 0
[ "$(mode_of "$K")" = 600 ] && pass || fail "keygen: secret key mode $(mode_of "$K"), expected 600"
[ "$(mode_of "$K.pub")" = 644 ] && pass || fail "keygen: public key mode $(mode_of "$K.pub"), expected 644"
grep -Eqx 'longhaul-ed25519-secret-v1 [0-9a-f]{64}' "$K" && [ "$(wc -c <"$K")" = 92 ] && pass ||
  fail "keygen: the secret key file is not one line 'longhaul-ed25519-secret-v1 <64 hex>': $(head -c 100 "$K")"
grep -Eqx 'longhaul-ed25519-public-v1 [0-9a-f]{64}' "$K.pub" && [ "$(wc -c <"$K.pub")" = 92 ] && pass ||
  fail "keygen: the public key file is not one line 'longhaul-ed25519-public-v1 <64 hex>'"
grep -qxF -- "$(cat "$K.pub")" "$TMP/keygen.out" && pass || fail "keygen: stdout does not show the public key"
# the public key is the secret key's, derived independently (RFC 8032 in Python)
python3 "$REF" public "$K" >"$TMP/derived.pub" 2>"$TMP/derived.err" && same_file keygen-derived "$TMP/derived.pub" "$K.pub" ||
  fail "keygen: sync_ref.py public failed: $(cat "$TMP/derived.err")"
cp "$K" "$TMP/before.key"
run keygen-again "$BIN" keygen --out "$K"
expect_refused keygen-again "trainer.key exists; not replacing a key .*--force"
same_file keygen-again-unchanged "$K" "$TMP/before.key"
run keygen-force "$BIN" keygen --out "$K" --force
expect_rc keygen-force 0
cmp -s "$K" "$TMP/before.key" && fail "keygen --force: the key was not replaced" || pass
run keygen-noout "$BIN" keygen
expect_rc keygen-noout 2
run keygen-help "$BIN" keygen --help
expect_rc keygen-help 0 && expect_out keygen-help "--out FILE"
run keygen-dir "$BIN" keygen --out "$TMP/no/such/dir/k"
expect_refused keygen-dir "no/such/dir"
run top-help "$BIN" --help
for c in keygen manifest snapshot; do
  grep -q -- "$c" "$TMP/top-help.out" && pass || fail "longhaul --help does not list $c"
done
run keygen-other "$BIN" keygen --out "$TMP/other.key"
expect_rc keygen-other 0

# ------------------------------------------------------------------ manifests
h() { printf '%s' "$1" | python3 -c 'import hashlib,sys; print(hashlib.blake2b(sys.stdin.buffer.read(),digest_size=32).hexdigest())'; }
cat >"$TMP/unsigned.json" <<EOF
{
  "format": 1, "version": 3, "parent": 2, "elements": 1000,
  "slab": "$(h slab3)", "config": "$(h config)", "tokenizer": "$(h tokenizer)",
  "generation": null,
  "blobs": [
    {"kind": "patch", "from": 2, "hash": "$(h patch23)", "size": 120},
    {"kind": "snapshot", "hash": "$(h snap3)", "size": 1900},
    {"kind": "patch", "from": 0, "hash": "$(h patch03)", "size": 400}
  ]
}
EOF
M=$TMP/m3.json
run sign "$BIN" manifest sign --key "$K" --in "$TMP/unsigned.json" --out "$M"
expect_rc sign 0 && expect_out sign "signed version 3 \(3 blobs\)"
# the Python signer, written from docs/PROTOCOL.md, makes the same bytes; and verifies ours
if python3 "$REF" sign "$K" "$TMP/unsigned.json" "$TMP/m3.py.json" 2>"$TMP/pysign.err"; then
  same_file sign-same-as-python "$M" "$TMP/m3.py.json"
else
  fail "sync_ref.py sign: $(cat "$TMP/pysign.err")"
fi
run py-verify python3 "$REF" verify "$K.pub" "$M"
expect_rc py-verify 0 && expect_out py-verify "^version 3 slab $(h slab3)"
run verify "$BIN" manifest verify --key "$K.pub" --manifest "$M"
expect_rc verify 0 && expect_out verify "^version +3$" && expect_out verify "^parent +2$" &&
  expect_out verify "patch from 0 $(h patch03) 400 bytes" && expect_out verify "snapshot $(h snap3) 1900 bytes" &&
  expect_out verify "verified with the pinned key"
[ "$(tail -c 1 "$M" | od -An -c | tr -d ' ')" = "}" ] && pass || fail "sign: the manifest does not end with '}' (no newline)"

# tampering of every kind is refused, with its own words
sed 's/"version":3/"version":4/' "$M" >"$TMP/tampered.json"
run tampered "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/tampered.json"
expect_refused tampered "tampered.json: the signature does not verify .*changed after signing"
run py-tampered python3 "$REF" verify "$K.pub" "$TMP/tampered.json"
expect_refused py-tampered "signature does not verify"
sed 's/"size":120/"size":12/' "$M" >"$TMP/size.json"
run tampered-size "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/size.json"
expect_refused tampered-size "signature does not verify"
python3 - "$M" "$TMP/badsig.json" <<'EOF'
import sys
s = open(sys.argv[1]).read()
i = s.index('"signature":"') + 13
open(sys.argv[2], "w").write(s[:i] + ("1" if s[i] == "0" else "0") + s[i + 1:])
EOF
run badsig "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/badsig.json"
expect_refused badsig "signature does not verify"
run wrongkey "$BIN" manifest verify --key "$TMP/other.key.pub" --manifest "$M"
expect_refused wrongkey "m3.json: signed by key [0-9a-f]{64}, not by the pinned trainer key [0-9a-f]{64}"
python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=1))" "$M" >"$TMP/pretty.json"
run pretty "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/pretty.json"
expect_refused pretty "pretty.json: not in canonical form .*at byte 1"
run py-pretty python3 "$REF" verify "$K.pub" "$TMP/pretty.json"
expect_refused py-pretty "not in canonical form"
sed 's/"format":1/"format":2/' "$M" >"$TMP/format2.json"
run format2 "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/format2.json"
expect_refused format2 "manifest format 2; this longhaul reads format 1"
{ cat "$M"; head -c 70000 /dev/zero | tr '\0' ' '; } >"$TMP/big.json"
run big "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/big.json"
expect_refused big "big.json: [0-9]+ bytes, more than the limit of 65536"
run secret-as-public "$BIN" manifest verify --key "$K" --manifest "$M"
expect_refused secret-as-public "this is a secret key .*expected a public key"
printf 'not json' >"$TMP/junk.json"
run junk "$BIN" manifest verify --key "$K.pub" --manifest "$TMP/junk.json"
expect_refused junk "junk.json: not JSON"
# signing: a secret key others can read, a public key, an invalid manifest
cp "$K" "$TMP/open.key" && chmod 644 "$TMP/open.key"
run sign-open "$BIN" manifest sign --key "$TMP/open.key" --in "$TMP/unsigned.json" --out "$TMP/x.json"
expect_refused sign-open "open.key: mode 0644 lets other users read"
[ -e "$TMP/x.json" ] && fail "sign-open: wrote a manifest" || pass
run sign-pub "$BIN" manifest sign --key "$K.pub" --in "$TMP/unsigned.json" --out "$TMP/x.json"
expect_refused sign-pub "this is a public key"
sed 's/"from": 0/"from": 3/' "$TMP/unsigned.json" >"$TMP/bad-from.json"
run sign-bad "$BIN" manifest sign --key "$K" --in "$TMP/bad-from.json" --out "$TMP/x.json"
expect_refused sign-bad "a patch from version 3 to 3"
run sign-signed "$BIN" manifest sign --key "$K" --in "$M" --out "$TMP/x.json"
expect_refused sign-signed "an unsigned manifest has none"
run manifest-nosub "$BIN" manifest
expect_rc manifest-nosub 2
run manifest-badsub "$BIN" manifest frobnicate
expect_rc manifest-badsub 2

# ------------------------------------------------------------------ snapshots
run init "$BIN" init-model --arch qwen2 --preset tiny --seed 7 --out "$TMP/model" --dtype bf16
expect_rc init 0
S=$TMP/model.lhsn
run snap "$BIN" snapshot make --model "$TMP/model" --out "$S"
expect_rc snap 0 && expect_out snap "^slab +[0-9a-f]{64}$"
SLAB=$(awk '$1 == "slab" {print $2}' "$TMP/snap.out")
N=$(awk '$1 == "elements" {print $2}' "$TMP/snap.out")
BLOB=$(awk '$1 == "blob" {print $2}' "$TMP/snap.out")
[ "$BLOB" = "$(python3 -c 'import hashlib,sys; print(hashlib.blake2b(open(sys.argv[1],"rb").read(),digest_size=32).hexdigest())' "$S")" ] &&
  pass || fail "snapshot make: the blob hash printed is not the file's BLAKE2b-256"
run py-snap python3 "$REF" snapshot-decode "$S"
expect_rc py-snap 0 && expect_out py-snap "^elements $N slab $SLAB$"
run show "$BIN" snapshot show --snapshot "$S"
expect_rc show 0 && expect_out show "^slab +$SLAB$" && expect_out show "^elements +$N$"
# a second make of the same model gives the same bytes
run snap2 "$BIN" snapshot make --model "$TMP/model" --out "$TMP/again.lhsn"
same_file snapshot-deterministic "$S" "$TMP/again.lhsn"
# a damaged snapshot is refused: a payload byte, the header's hash, a truncation
python3 - "$S" "$TMP" <<'EOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
c = bytearray(b); c[len(c) // 2] ^= 0x40; open(sys.argv[2] + "/flip.lhsn", "wb").write(c)
c = bytearray(b); c[30] ^= 1; open(sys.argv[2] + "/hash.lhsn", "wb").write(c)
open(sys.argv[2] + "/short.lhsn", "wb").write(b[:-10])
EOF
run flip "$BIN" snapshot show --snapshot "$TMP/flip.lhsn"
expect_refused flip "flip.lhsn: "
run badhash "$BIN" snapshot show --snapshot "$TMP/hash.lhsn"
expect_refused badhash "hash.lhsn: the slab decodes to hash [0-9a-f]{64}, the header says"
run short "$BIN" snapshot show --snapshot "$TMP/short.lhsn"
expect_refused short "short.lhsn: the header declares a [0-9]+-byte zstd frame"
# and the reverse: a snapshot written by the Python encoder reads in longhaul
python3 "$REF" snapshot-encode 5000 "$TMP/py.lhsn"
run py-show "$BIN" snapshot show --snapshot "$TMP/py.lhsn"
run py-decode python3 "$REF" snapshot-decode "$TMP/py.lhsn"
PYSLAB=$(awk '{print $4}' "$TMP/py-decode.out")
expect_rc py-show 0 && expect_out py-show "^slab +$PYSLAB$" && expect_out py-show "^elements +5000$"
run snap-level "$BIN" snapshot make --model "$TMP/model" --out "$TMP/x.lhsn" --level 20
expect_rc snap-level 2

echo "sync.sh: $CHECKS checks passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
