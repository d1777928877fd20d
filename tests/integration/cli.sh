#!/usr/bin/env bash
# Integration test of the `longhaul` command line: usage errors and --help of every command,
# init-model output and determinism, score output and its input errors, damaged model files,
# generate, sft, eval (with an exec program whose helpers die with a killed eval) and env show.
# Usage: bash cli.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: cli.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: cli.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/model.h" ] || { echo "cli.sh: $SRC is not the longhaul source tree"; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-cli.XXXXXX")
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

# run_full NAME CMD...: as run, with stdout on /dev/full (every write to it fails: ENOSPC).
run_full() {
  local name=$1
  shift
  "$@" >/dev/full 2>"$TMP/$name.err"
  RC=$?
}

# expect_rc NAME WANT: the last `run` exited with WANT (and did not crash).
expect_rc() {
  if [ "$RC" -ne "$2" ]; then
    fail "$1: exit code $RC, expected $2; stderr: $(head -c 400 "$TMP/$1.err")"
    return 1
  fi
  pass
}

# expect_one_line_error NAME PATTERN: stderr is exactly one line, starting "longhaul" and
# matching PATTERN (grep -E; a PATTERN starting with ^ must match the whole line's start).
expect_one_line_error() {
  local lines
  lines=$(wc -l <"$TMP/$1.err")
  if [ "$lines" -ne 1 ]; then
    fail "$1: expected a one-line error, got $lines lines: $(head -c 400 "$TMP/$1.err")"
    return 1
  fi
  local re="^longhaul.*$2"
  [ "${2:0:1}" = "^" ] && re=$2
  if ! grep -Eq -- "$re" "$TMP/$1.err"; then
    fail "$1: error does not match /$2/: $(cat "$TMP/$1.err")"
    return 1
  fi
  pass
}

# py NAME CODE ARGS...: a python3 check; CODE raises (assert) on failure.
py() {
  local name=$1
  shift
  local out
  if ! out=$(python3 -c "$@" 2>&1); then
    fail "$name: $out"
    return 1
  fi
  pass
}

# ------------------------------------------------------------------ top level
run top-help "$BIN" --help
expect_rc top-help 0
for c in init-model score bench; do
  grep -q -- "$c" "$TMP/top-help.out" || fail "longhaul --help does not list $c"
done
run top-none "$BIN"
expect_rc top-none 2
grep -q init-model "$TMP/top-none.err" || fail "longhaul with no arguments does not list commands"
run top-version "$BIN" --version
expect_rc top-version 0
grep -Eq '^longhaul [0-9]+\.[0-9]+' "$TMP/top-version.out" || fail "--version: $(cat "$TMP/top-version.out")"
run top-unknown "$BIN" frobnicate
expect_rc top-unknown 2 && expect_one_line_error top-unknown 'unknown command "frobnicate"'

# ------------------------------------------------------------------ --help of every command
check_help() { # NAME FLAGS... -- CMD...
  local name=$1
  shift
  local flags=()
  while [ "$1" != "--" ]; do
    flags+=("$1")
    shift
  done
  shift
  run "$name" "$BIN" "$@" --help
  expect_rc "$name" 0 || return
  [ -s "$TMP/$name.err" ] && fail "$name: --help wrote to stderr: $(cat "$TMP/$name.err")"
  for f in "${flags[@]}"; do
    grep -q -- "--$f\b" "$TMP/$name.out" || fail "$name: --help does not mention --$f"
  done
  # Every flag the usage text names must be one of the flags above (usage matches the flags).
  local f g ok
  while read -r f; do
    [ "$f" = "--help" ] && continue
    ok=0
    for g in "${flags[@]}"; do [ "$f" = "--$g" ] && ok=1; done
    [ $ok = 1 ] || fail "$name: --help mentions $f, which is not a flag of the command"
  done < <(grep -oE -- '--[a-z][a-z-]*' "$TMP/$name.out" | sort -u)
}
check_help help-init arch preset seed out dtype tokenizer -- init-model
check_help help-score model input threads -- score
check_help help-bench-train model batch seq steps threads json -- bench train
run help-init-h "$BIN" init-model -h
expect_rc help-init-h 0
run help-bench "$BIN" bench --help
expect_rc help-bench 0 && { grep -q train "$TMP/help-bench.out" || fail "bench --help does not list train"; }

# ------------------------------------------------------------------ usage errors (exit 2)
run unknown-flag "$BIN" init-model --arch qwen2 --preset tiny --seed 1 --out "$TMP/x" --bogus 3
expect_rc unknown-flag 2 && expect_one_line_error unknown-flag 'unknown flag --bogus'
run missing-required "$BIN" init-model --arch qwen2 --preset tiny --out "$TMP/x"
expect_rc missing-required 2 && expect_one_line_error missing-required 'missing required flag --seed'
run missing-value "$BIN" init-model --arch qwen2 --preset tiny --out "$TMP/x" --seed
expect_rc missing-value 2 && expect_one_line_error missing-value '--seed: missing value'
run empty-value "$BIN" init-model --arch qwen2 --preset tiny --out "$TMP/x" --seed ""
expect_rc empty-value 2 && expect_one_line_error empty-value '--seed: empty value'
run empty-eq-value "$BIN" init-model --arch qwen2 --preset tiny --out "$TMP/x" --seed=
expect_rc empty-eq-value 2 && expect_one_line_error empty-eq-value '--seed: empty value'
run bad-seed "$BIN" init-model --arch qwen2 --preset tiny --seed x --out "$TMP/x"
expect_rc bad-seed 2 &&
  expect_one_line_error bad-seed '^longhaul init-model: --seed: expected a non-negative integer, got "x"$'
run neg-seed "$BIN" init-model --arch qwen2 --preset tiny --seed=-4 --out "$TMP/x"
expect_rc neg-seed 2 && expect_one_line_error neg-seed '--seed: expected a non-negative integer'
run bad-arch "$BIN" init-model --arch gpt2 --preset tiny --seed 1 --out "$TMP/x"
expect_rc bad-arch 2 && expect_one_line_error bad-arch '--arch: expected one of qwen2\|qwen3\|llama, got "gpt2"'
run bad-preset "$BIN" init-model --arch qwen2 --preset huge --seed 1 --out "$TMP/x"
expect_rc bad-preset 2 && expect_one_line_error bad-preset '--preset'
run twice "$BIN" init-model --arch qwen2 --arch llama --preset tiny --seed 1 --out "$TMP/x"
expect_rc twice 2 && expect_one_line_error twice '--arch: given more than once'
run positional "$BIN" score --model "$TMP/x" --input f extra
expect_rc positional 2 && expect_one_line_error positional 'unexpected argument "extra"'
run bad-threads "$BIN" score --model "$TMP/x" --input f --threads -2
expect_rc bad-threads 2 && expect_one_line_error bad-threads '--threads: expected an integer in'
run bench-none "$BIN" bench
expect_rc bench-none 2 && expect_one_line_error bench-none 'missing subcommand'
run bench-other "$BIN" bench generate-everything --model "$TMP/x"
expect_rc bench-other 2 && expect_one_line_error bench-other 'unknown subcommand'
run bench-missing "$BIN" bench train --model "$TMP/x" --batch 1 --seq 4
expect_rc bench-missing 2 && expect_one_line_error bench-missing 'missing required flag --steps'
run bench-badnum "$BIN" bench train --model "$TMP/x" --batch 0 --seq 4 --steps 1
expect_rc bench-badnum 2 && expect_one_line_error bench-badnum '--batch: expected'
[ -e "$TMP/x" ] && fail "a command that failed on its flags created $TMP/x"

# ------------------------------------------------------------------ init-model
for arch in qwen2 llama; do
  run "init-$arch" "$BIN" init-model --arch "$arch" --preset tiny --seed 7 --out "$TMP/$arch"
  expect_rc "init-$arch" 0 || continue
  grep -q "$arch" "$TMP/init-$arch.err" || fail "init-model $arch: summary does not name the arch"
  [ -s "$TMP/$arch/config.json" ] || fail "init-model $arch: no config.json"
  [ -s "$TMP/$arch/model.safetensors" ] || fail "init-model $arch: no model.safetensors"
  py "config-$arch" '
import json, sys
arch, path = sys.argv[1], sys.argv[2]
c = json.load(open(path + "/config.json"))
want_model = {"qwen2": "qwen2", "llama": "llama"}[arch]
want_cls = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
assert c.get("model_type") == want_model, "model_type %r" % c.get("model_type")
assert c.get("architectures") == [want_cls], "architectures %r" % c.get("architectures")
for k in ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "max_position_embeddings"]:
    assert isinstance(c.get(k), int) and c[k] > 0, "%s = %r" % (k, c.get(k))
for k in ["rope_theta", "rms_norm_eps"]:
    assert isinstance(c.get(k), (int, float)) and c[k] > 0, "%s = %r" % (k, c.get(k))
assert isinstance(c.get("tie_word_embeddings"), bool), "tie_word_embeddings"
assert c["num_attention_heads"] % c["num_key_value_heads"] == 0, "heads vs kv heads"
# The safetensors header lists the tensors the config implies.
raw = open(path + "/model.safetensors", "rb").read()
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n])
C, V = c["hidden_size"], c["vocab_size"]
assert h["model.embed_tokens.weight"]["shape"] == [V, C], h["model.embed_tokens.weight"]
assert h["model.embed_tokens.weight"]["dtype"] == "F32"
L = c["num_hidden_layers"]
assert "model.layers.%d.mlp.down_proj.weight" % (L - 1) in h, "last layer missing"
has_bias = "model.layers.0.self_attn.q_proj.bias" in h
assert has_bias == (arch == "qwen2"), "q_proj.bias present=%s for %s" % (has_bias, arch)
' "$arch" "$TMP/$arch"
done

run init-again "$BIN" init-model --arch qwen2 --preset tiny --seed 7 --out "$TMP/qwen2-again"
expect_rc init-again 0 &&
  { cmp -s "$TMP/qwen2/model.safetensors" "$TMP/qwen2-again/model.safetensors" ||
    fail "init-model: same seed gave different model.safetensors"; } &&
  { cmp -s "$TMP/qwen2/config.json" "$TMP/qwen2-again/config.json" ||
    fail "init-model: same seed gave different config.json"; }
run init-seed8 "$BIN" init-model --arch qwen2 --preset tiny --seed 8 --out "$TMP/qwen2-seed8"
expect_rc init-seed8 0 &&
  { cmp -s "$TMP/qwen2/model.safetensors" "$TMP/qwen2-seed8/model.safetensors" &&
    fail "init-model: seeds 7 and 8 gave identical model.safetensors"; }

# A killed writer that had this PID (containers repeat PIDs and the order of writes) left the
# temporary name this run would try first: it takes the next name and leaves that file alone
# (it failed "cannot create: File exists" and removed the leftover).
mkdir -p "$TMP/leftover"
run init-leftover bash -c 'echo old >"$1/model.safetensors.tmp.$$.0"
exec "$2" init-model --arch qwen2 --preset tiny --seed 7 --out "$1"' _ "$TMP/leftover" "$BIN"
expect_rc init-leftover 0 &&
  { cmp -s "$TMP/qwen2/model.safetensors" "$TMP/leftover/model.safetensors" ||
    fail "init-model beside a leftover temporary file: different model.safetensors"; }
[ "$(cat "$TMP"/leftover/model.safetensors.tmp.*.0 2>/dev/null)" = old ] ||
  fail "init-model changed or removed another process's temporary file"

# every size within its own limit, 3.4e14 parameters in all: an error naming the bound (it
# aborted allocating 1.3 PB)
cat >"$TMP/huge.json" <<'JSON'
{"vocab_size":4194304,"hidden_size":65536,"intermediate_size":524288,"num_hidden_layers":512,
 "num_attention_heads":1024,"head_dim":4096,"max_position_embeddings":1048576}
JSON
run init-huge "$BIN" init-model --arch llama --preset "$TMP/huge.json" --seed 1 --out "$TMP/huge"
expect_rc init-huge 1 &&
  expect_one_line_error init-huge '335076235739136 parameters .*more than the limit of 1000000000000'
[ -e "$TMP/huge" ] && fail "init-model with a refused config created $TMP/huge"

run init-bf16 "$BIN" init-model --arch llama --preset tiny --seed 7 --out "$TMP/llama-bf16" --dtype=bf16
expect_rc init-bf16 0 && py init-bf16-dtype '
import json, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
d = {v["dtype"] for k, v in h.items() if k != "__metadata__"}
assert d == {"BF16"}, d
' "$TMP/llama-bf16/model.safetensors"

# A config.json-style file overrides the tiny preset; unknown keys are named.
printf '{"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5000.0}\n' >"$TMP/over.json"
run init-file "$BIN" init-model --arch llama --preset "$TMP/over.json" --seed 1 --out "$TMP/llama-file"
expect_rc init-file 0 && py init-file-config '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["num_hidden_layers"] == 1 and c["hidden_size"] == 64, c
assert c["num_attention_heads"] == 4 and c["num_key_value_heads"] == 2, c
assert c.get("head_dim", 16) == 16, c
assert abs(c["rope_theta"] - 5000.0) < 1e-3, c
' "$TMP/llama-file/config.json"
# A config.json that init-model wrote is itself a valid override file, and gives the same model.
run init-roundtrip "$BIN" init-model --arch llama --preset "$TMP/llama-file/config.json" --seed 1 --out "$TMP/llama-rt"
expect_rc init-roundtrip 0 &&
  { cmp -s "$TMP/llama-file/model.safetensors" "$TMP/llama-rt/model.safetensors" ||
    fail "init-model: --preset DIR/config.json did not reproduce the model written from it"; }
run init-wrongarch "$BIN" init-model --arch qwen2 --preset "$TMP/llama-file/config.json" --seed 1 --out "$TMP/qwen2-wrong"
expect_rc init-wrongarch 1 &&
  expect_one_line_error init-wrongarch 'architectures/model_type name LlamaForCausalLM, not Qwen2ForCausalLM'
printf '{"num_layers": 2}\n' >"$TMP/typo.json"
run init-typo "$BIN" init-model --arch llama --preset "$TMP/typo.json" --seed 1 --out "$TMP/llama-typo"
expect_rc init-typo 1 && expect_one_line_error init-typo 'unknown key "num_layers"'
# An override file takes what config.json takes: an eos list (Llama 3 Instruct, and what sft
# writes) and the keys of current transformers that do not change the model.
cat >"$TMP/eoslist.json" <<'JSON'
{"eos_token_id": [2, 5], "dtype": "float32", "pad_token_id": null,
 "layer_types": ["full_attention", "full_attention"], "model_type": "qwen3"}
JSON
run init-eoslist "$BIN" init-model --arch qwen3 --preset "$TMP/eoslist.json" --seed 1 --out "$TMP/eoslist"
expect_rc init-eoslist 0 && py init-eoslist-check '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["eos_token_id"] == [2, 5] and c["model_type"] == "qwen3", c
' "$TMP/eoslist/config.json"
# A generation_config.json left in --out would replace the eos ids init-model writes.
printf '{"eos_token_id": [200, 201]}\n' >"$TMP/eoslist/generation_config.json"
run init-stale-gen "$BIN" init-model --arch qwen3 --preset tiny --seed 1 --out "$TMP/eoslist"
expect_rc init-stale-gen 0 && { [ -e "$TMP/eoslist/generation_config.json" ] &&
  fail "init-model left a generation_config.json from an earlier run"; }
grep -q 'removed .*generation_config.json' "$TMP/init-stale-gen.err" ||
  fail "init-stale-gen: init-model did not say it removed generation_config.json"

# ------------------------------------------------------------------ score
MODEL=$TMP/qwen2
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$MODEL/config.json")
cat >"$TMP/in.jsonl" <<EOF
[1, 2, 3, 4, 5]
[7]
[0, $((VOCAB - 1)), 0, $((VOCAB - 1))]
[3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3]
[1, 2, 3, 4, 5]
EOF
run score "$BIN" score --model "$MODEL" --input "$TMP/in.jsonl" --threads 2
expect_rc score 0 && py score-output '
import json, math, sys
ins = [json.loads(l) for l in open(sys.argv[1])]
outs = open(sys.argv[2]).read().splitlines()
assert len(outs) == len(ins), "%d output lines for %d input lines" % (len(outs), len(ins))
for i, (a, o) in enumerate(zip(ins, outs)):
    lp = json.loads(o)["logprobs"]
    assert len(lp) == len(a) - 1, "line %d: %d logprobs for %d tokens" % (i + 1, len(lp), len(a))
    for x in lp:
        assert isinstance(x, (int, float)) and math.isfinite(x) and x <= 0, "line %d: %r" % (i + 1, x)
# The same sequence gives the same numbers wherever it sits in the batch (up to the low bits
# that BLAS blocking changes).
a, b = json.loads(outs[0])["logprobs"], json.loads(outs[4])["logprobs"]
assert all(abs(x - y) <= 1e-4 * max(1.0, abs(x)) for x, y in zip(a, b)), (a, b)
' "$TMP/in.jsonl" "$TMP/score.out"
run score-stdin "$BIN" score --model "$MODEL" --input - <"$TMP/in.jsonl"
expect_rc score-stdin 0 && { cmp -s "$TMP/score.out" "$TMP/score-stdin.out" || fail "score: --input - differs from the file"; }

bad_score_line() { # NAME LINE-CONTENT PATTERN: line 3 of an input is bad
  printf '[1, 2]\n[3, 4, 5]\n%s\n[1]\n' "$2" >"$TMP/$1.jsonl"
  run "$1" "$BIN" score --model "$MODEL" --input "$TMP/$1.jsonl"
  expect_rc "$1" 1 && expect_one_line_error "$1" "$1.jsonl:3: .*$3"
  [ -s "$TMP/$1.out" ] && fail "$1: score printed output before rejecting its input"
}
bad_score_line bad-json '[1, 2,' 'JSON'
bad_score_line bad-object '{"tokens": [1]}' 'array'
bad_score_line bad-empty '[]' 'at least 1'
bad_score_line bad-vocab "[1, $VOCAB]" "$VOCAB"
bad_score_line bad-negative '[1, -1]' '-1'
bad_score_line bad-float '[1, 2.5]' 'integer'
bad_score_line bad-blank '' 'empty line'
MAXPOS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_position_embeddings"])' "$MODEL/config.json")
bad_score_line bad-long "$(python3 -c 'import sys; print([1] * (int(sys.argv[1]) + 1))' "$MAXPOS")" 'max_position'

# Every input line has a length limit, 12 bytes per position plus 4 KiB (score --help says so):
# an endless line (/dev/zero on stdin) is refused once it passes the limit, in bounded memory
# (it grew without bound, 21.5 GB in 60 s, and under a memory limit exited 0 printing nothing).
LINE_MAX=$((MAXPOS * 12 + 4096))
grep -q "12 bytes per position" <("$BIN" score --help) || fail "score --help does not give the line limit"
ulimit_v=""
# the sanitizers reserve more address space than any limit allows (the library list is read whole:
# `ldd | grep -q` under pipefail fails when grep's early exit kills ldd with SIGPIPE)
libs=$(ldd "$BIN" 2>/dev/null || true)
case "$libs" in
*libasan* | *libtsan*) ;;
*) ulimit_v="ulimit -v 4000000;" ;;
esac
run score-zero timeout 120 bash -c "$ulimit_v"' exec "$0" score --model "$1" --input - </dev/zero' "$BIN" "$MODEL"
expect_rc score-zero 1 && expect_one_line_error score-zero "^longhaul score: <stdin>:1: line longer than $LINE_MAX bytes$"
# one byte over the limit on line 2 of a file (its newline counted) is refused; at the limit is
# read (and then refused by the JSON parser, which is another message)
python3 -c 'import sys; n = int(sys.argv[1]); open(sys.argv[2], "w").write("[1]\n" + " " * (n - 3) + "[1]\n")' "$LINE_MAX" "$TMP/over.jsonl"
run score-over "$BIN" score --model "$MODEL" --input "$TMP/over.jsonl"
expect_rc score-over 1 && expect_one_line_error score-over "over.jsonl:2: line longer than $LINE_MAX bytes$"
python3 -c 'import sys; n = int(sys.argv[1]); open(sys.argv[2], "w").write("[1]\n" + " " * (n - 4) + "[1]\n")' "$LINE_MAX" "$TMP/at.jsonl"
run score-at "$BIN" score --model "$MODEL" --input "$TMP/at.jsonl"
expect_rc score-at 0 && { [ "$(wc -l <"$TMP/score-at.out")" -eq 2 ] || fail "score-at: a line of exactly the limit was not scored"; }

# Input files that are not regular files are refused at once (a FIFO with no writer hung in
# open, /dev/zero read forever); standard input may still be a pipe.
mkfifo "$TMP/fifo"
run score-fifo timeout 20 "$BIN" score --model "$MODEL" --input "$TMP/fifo"
expect_rc score-fifo 1 && expect_one_line_error score-fifo "fifo: not a regular file \\(a FIFO\\)$"
run score-dev timeout 20 "$BIN" score --model "$MODEL" --input /dev/zero
expect_rc score-dev 1 && expect_one_line_error score-dev "^longhaul score: /dev/zero: not a regular file \\(a character device\\)$"
run score-pipe bash -c 'cat "$2" | "$0" score --model "$1" --input -' "$BIN" "$MODEL" "$TMP/in.jsonl"
expect_rc score-pipe 0 && { cmp -s "$TMP/score.out" "$TMP/score-pipe.out" || fail "score: a pipe on stdin differs from the file"; }

run score-nomodel "$BIN" score --model "$TMP/nowhere" --input "$TMP/in.jsonl"
expect_rc score-nomodel 1 && expect_one_line_error score-nomodel 'nowhere'

# A truncated model.safetensors is reported by name, without a crash.
mkdir -p "$TMP/trunc"
cp "$MODEL/config.json" "$TMP/trunc/"
head -c $(($(stat -c %s "$MODEL/model.safetensors") / 2)) "$MODEL/model.safetensors" >"$TMP/trunc/model.safetensors"
run trunc "$BIN" score --model "$TMP/trunc" --input "$TMP/in.jsonl"
expect_rc trunc 1 && expect_one_line_error trunc 'model\.safetensors'
head -c 5 "$MODEL/model.safetensors" >"$TMP/trunc/model.safetensors"
run trunc5 "$BIN" score --model "$TMP/trunc" --input "$TMP/in.jsonl"
expect_rc trunc5 1 && expect_one_line_error trunc5 'model\.safetensors'

# A NaN weight is refused by tensor and element, by the fp32 loader (score) and the bf16 one
# (generate); they loaded silently and generate sampled uniformly.
mkdir -p "$TMP/nan"
cp "$MODEL/config.json" "$TMP/nan/"
python3 - "$MODEL/model.safetensors" "$TMP/nan/model.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
t = json.loads(raw[8:8 + n])["model.layers.1.mlp.up_proj.weight"]
assert t["dtype"] == "F32", t
at = 8 + n + t["data_offsets"][0] + 4 * 17
raw[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(raw)
PY
run nan-score "$BIN" score --model "$TMP/nan" --input "$TMP/in.jsonl"
expect_rc nan-score 1 && expect_one_line_error nan-score 'nan/model\.safetensors: tensor model\.layers\.1\.mlp\.up_proj\.weight: element 17 is nan$'
run nan-gen "$BIN" generate --model "$TMP/nan" --prompt-tokens 1,2 --max-new 2
expect_rc nan-gen 1 && expect_one_line_error nan-gen 'element 17 is nan$'

# ------------------------------------------------------------------ bench train
run bench "$BIN" bench train --model "$MODEL" --batch 2 --seq 16 --steps 2 --threads 2 --json
expect_rc bench 0 && py bench-json '
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r["command"] == "bench train", r
for k in ["tokens_per_s", "step_s", "gflops"]:
    assert isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] > 0, (k, r)
assert r["batch"] == 2 and r["seq"] == 16 and r["threads"] >= 1 and r["params"] > 0, r
' "$TMP/bench.out"
run bench-human "$BIN" bench train --model "$MODEL" --batch 1 --seq 8 --steps 1
expect_rc bench-human 0 && { grep -q 'tokens/s' "$TMP/bench-human.out" || fail "bench train: no tokens/s in $(cat "$TMP/bench-human.out")"; }
# a result that cannot be written is a failure (exit 1), as in score, tokenize and generate
run_full bench-full "$BIN" bench train --model "$MODEL" --batch 1 --seq 8 --steps 1 --json
expect_rc bench-full 1 && expect_one_line_error bench-full '^longhaul bench train: cannot write the output: '
run bench-longseq "$BIN" bench train --model "$MODEL" --batch 1 --seq $((MAXPOS + 1)) --steps 1
expect_rc bench-longseq 2 && expect_one_line_error bench-longseq 'max_position'

# ------------------------------------------------------------------ tokenize, init-model --tokenizer
check_help help-tokenize tokenizer text file decode jsonl no-special -- tokenize
grep -q -- tokenize "$TMP/top-help.out" || fail "longhaul --help does not list tokenize"
check_help help-export model out gguf eval-json eval eval-n shard-bytes force -- export
grep -q -- "export " "$TMP/top-help.out" || fail "longhaul --help does not list export"

# --jsonl: one id array per line of JSON strings, each as --text gives it; a line that is not a
# JSON string names the file and line
printf '"12+34=46"\n"a\\nb<|eos|>"\n' >"$TMP/lines.jsonl"
run tok-jsonl "$BIN" tokenize --tokenizer chars --file "$TMP/lines.jsonl" --jsonl
expect_rc tok-jsonl 0 && { [ "$(cat "$TMP/tok-jsonl.out")" = "$(printf '[20,21,14,22,23,32,23,25]\n[68,98,69,2]')" ] ||
  fail "tokenize --jsonl: $(cat "$TMP/tok-jsonl.out")"; }
printf '"ok"\n42\n' >"$TMP/lines-bad.jsonl"
run tok-jsonl-bad "$BIN" tokenize --tokenizer chars --file "$TMP/lines-bad.jsonl" --jsonl
expect_rc tok-jsonl-bad 1 && expect_one_line_error tok-jsonl-bad 'lines-bad.jsonl:2: expected a JSON string, found integer'
run tok-jsonl-text "$BIN" tokenize --tokenizer chars --text x --jsonl
expect_rc tok-jsonl-text 2

# The character tokenizer: ids are 3 + (c - ' ') for printable ASCII, 98 for \n.
run tok-chars "$BIN" tokenize --tokenizer chars --text "12+34=46"
expect_rc tok-chars 0 && { [ "$(cat "$TMP/tok-chars.out")" = "[20,21,14,22,23,32,23,25]" ] ||
  fail "tokenize chars: $(cat "$TMP/tok-chars.out")"; }
run tok-chars-special "$BIN" tokenize --tokenizer chars --text "<|bos|>ab<|eos|>"
expect_rc tok-chars-special 0 && { [ "$(cat "$TMP/tok-chars-special.out")" = "[1,68,69,2]" ] ||
  fail "tokenize special: $(cat "$TMP/tok-chars-special.out")"; }
run tok-chars-plain "$BIN" tokenize --tokenizer chars --text "<|bos|>" --no-special
expect_rc tok-chars-plain 0 && { [ "$(cat "$TMP/tok-chars-plain.out")" = "[31,95,69,82,86,95,33]" ] ||
  fail "tokenize --no-special: $(cat "$TMP/tok-chars-plain.out")"; }
run tok-chars-decode "$BIN" tokenize --tokenizer chars --decode "1,20,21,98,2"
expect_rc tok-chars-decode 0 && { [ "$(cat "$TMP/tok-chars-decode.out")" = "<|bos|>12
<|eos|>" ] || fail "tokenize --decode: $(cat "$TMP/tok-chars-decode.out")"; }
run tok-chars-skip "$BIN" tokenize --tokenizer chars --decode "[1, 20, 2]" --no-special
expect_rc tok-chars-skip 0 && { [ "$(cat "$TMP/tok-chars-skip.out")" = "1" ] ||
  fail "tokenize --decode --no-special: $(cat "$TMP/tok-chars-skip.out")"; }
printf 'line one\nline two\n' >"$TMP/text.txt"
run tok-file "$BIN" tokenize --tokenizer chars --file "$TMP/text.txt"
run tok-stdin "$BIN" tokenize --tokenizer chars --file - <"$TMP/text.txt"
expect_rc tok-stdin 0 && { cmp -s "$TMP/tok-file.out" "$TMP/tok-stdin.out" || fail "tokenize: --file - differs from the file"; }
IDS=$(tr -d '[]' <"$TMP/tok-file.out")
run tok-file-back "$BIN" tokenize --tokenizer chars --decode "$IDS"
expect_rc tok-file-back 0 && { cmp -s "$TMP/text.txt" "$TMP/tok-file-back.out" || fail "tokenize: decode(encode(file)) differs"; }

run tok-none "$BIN" tokenize --tokenizer chars
expect_rc tok-none 2 && expect_one_line_error tok-none 'exactly one of --text, --file or --decode'
run tok-two "$BIN" tokenize --tokenizer chars --text a --decode 1
expect_rc tok-two 2 && expect_one_line_error tok-two 'exactly one'
run tok-range "$BIN" tokenize --tokenizer chars --decode "1,500"
expect_rc tok-range 1 && expect_one_line_error tok-range 'token id 500 at position 1 is not in the vocabulary \(ids 0\.\.98\)'
run tok-badids "$BIN" tokenize --tokenizer chars --decode "1,x"
expect_rc tok-badids 2 && expect_one_line_error tok-badids '--decode: expected comma-separated token ids'
run tok-outside "$BIN" tokenize --tokenizer chars --decode "1,99"
expect_rc tok-outside 1 && expect_one_line_error tok-outside 'token id 99 at position 1'
run tok-unknown "$BIN" tokenize --tokenizer chars --text "ab€"
expect_rc tok-unknown 1 && expect_one_line_error tok-unknown 'no token for "€" \(U\+20AC\) at byte 2'
run tok-nofile "$BIN" tokenize --tokenizer "$TMP/none.json" --text a
expect_rc tok-nofile 1 && expect_one_line_error tok-nofile 'none\.json'
# a file named as the command keeps its name in the message (it was stripped as if it were
# a library module's "tokenize: " prefix: "longhaul tokenize: cannot open: ...")
mkdir -p "$TMP/named"
run tok-named-cmd bash -c 'cd "$1" && exec "$2" tokenize --tokenizer tokenize --text hi' _ "$TMP/named" "$BIN"
expect_rc tok-named-cmd 1 &&
  expect_one_line_error tok-named-cmd '^longhaul tokenize: tokenize: cannot open: No such file or directory$'
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\\\w+"}, "behavior": "Isolated"}}' >"$TMP/badpat.json"
run tok-badpat "$BIN" tokenize --tokenizer "$TMP/badpat.json" --text a
expect_rc tok-badpat 1 && expect_one_line_error tok-badpat 'badpat\.json: pre_tokenizer\.pattern\.Regex: unknown pattern'

# A real tokenizer: Qwen3's, from the committed fixture (scripts/install-deps.sh installs zstd).
if ! command -v zstd >/dev/null; then
  fail "zstd is not installed (scripts/install-deps.sh installs it): Qwen3 tokenize checks not run"
else
  zstd -q -dc "$SRC/tests/fixtures/tokenizer/qwen3.tokenizer.json.zst" >"$TMP/qwen3.json"
  run tok-qwen "$BIN" tokenize --tokenizer "$TMP/qwen3.json" --text "<|im_start|>Hello, world!"
  expect_rc tok-qwen 0 && { [ "$(cat "$TMP/tok-qwen.out")" = "[151644,9707,11,1879,0]" ] ||
    fail "tokenize qwen3: $(cat "$TMP/tok-qwen.out")"; }
  run tok-qwen-back "$BIN" tokenize --tokenizer "$TMP/qwen3.json" --decode 151644,9707,11,1879,0
  expect_rc tok-qwen-back 0 && { [ "$(cat "$TMP/tok-qwen-back.out")" = "<|im_start|>Hello, world!" ] ||
    fail "tokenize qwen3 --decode: $(cat "$TMP/tok-qwen-back.out")"; }
fi

# init-model --tokenizer chars: tokenizer.json next to the model, vocab 99, bos 1, eos 2.
run init-chars "$BIN" init-model --arch qwen2 --preset tiny --seed 3 --out "$TMP/chars-model" --tokenizer chars
expect_rc init-chars 0 && {
  cmp -s "$TMP/chars-model/tokenizer.json" "$SRC/tests/fixtures/tokenizer/chars.tokenizer.json" ||
    fail "init-model --tokenizer chars: tokenizer.json differs from the fixture"
  py init-chars-config '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["vocab_size"] == 99 and c["bos_token_id"] == 1 and c["eos_token_id"] == 2, c
' "$TMP/chars-model/config.json"
  run tok-dir "$BIN" tokenize --tokenizer "$TMP/chars-model" --text "ab"
  expect_rc tok-dir 0 && { [ "$(cat "$TMP/tok-dir.out")" = "[68,69]" ] || fail "tokenize --tokenizer DIR: $(cat "$TMP/tok-dir.out")"; }
  printf '[1, 68, 69, 2]\n' >"$TMP/chars-ids.jsonl"
  run score-chars "$BIN" score --model "$TMP/chars-model" --input "$TMP/chars-ids.jsonl"
  expect_rc score-chars 0
}

# init-model --tokenizer FILE: a small byte-level tokenizer (256 byte tokens + 3 merges).
python3 - "$TMP/bytes.json" <<'PYEOF'
import json, sys
keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
cp, n = {}, 0
for b in range(256):
    if b in keep:
        cp[b] = b
    else:
        cp[b] = 256 + n
        n += 1
vocab = {chr(cp[b]): b for b in range(256)}
for i, t in enumerate(["\u0120t", "he", "\u0120the"]):
    vocab[t] = 256 + i
tok = {"model": {"type": "BPE", "vocab": vocab, "merges": ["\u0120 t", "h e", "\u0120t he"]},
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "decoder": {"type": "ByteLevel"},
       "added_tokens": [{"id": 259, "content": "<|end|>", "special": True}]}
json.dump(tok, open(sys.argv[1], "w"))
PYEOF
run init-tokfile "$BIN" init-model --arch llama --preset tiny --seed 3 --out "$TMP/bytes-model" --tokenizer "$TMP/bytes.json"
expect_rc init-tokfile 0 && {
  cmp -s "$TMP/bytes.json" "$TMP/bytes-model/tokenizer.json" || fail "init-model --tokenizer FILE: not an exact copy"
  py init-tokfile-config '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["vocab_size"] == 260, c
' "$TMP/bytes-model/config.json"
  run tok-bytes "$BIN" tokenize --tokenizer "$TMP/bytes-model" --text " the the<|end|>"
  expect_rc tok-bytes 0 && { [ "$(cat "$TMP/tok-bytes.out")" = "[258,258,259]" ] || fail "tokenize bytes: $(cat "$TMP/tok-bytes.out")"; }
}
# A preset file's eos id is checked against the tokenizer's vocabulary (260), not the tiny
# preset's 256 it overrides (the file was checked before --tokenizer sized the vocabulary).
printf '{"eos_token_id": 259}\n' >"$TMP/eos259.json"
run init-tok-eos "$BIN" init-model --arch llama --preset "$TMP/eos259.json" --seed 3 --out "$TMP/eos259" --tokenizer "$TMP/bytes.json"
expect_rc init-tok-eos 0 && py init-tok-eos-config '
import json, sys
c = json.load(open(sys.argv[1]))
assert c["vocab_size"] == 260 and c["eos_token_id"] == 259, c
' "$TMP/eos259/config.json"
# A preset file may pad vocab_size above the tokenizer's size, not below it.
printf '{"vocab_size": 300}\n' >"$TMP/vocab300.json"
run init-padded "$BIN" init-model --arch llama --preset "$TMP/vocab300.json" --seed 3 --out "$TMP/padded" --tokenizer "$TMP/bytes.json"
expect_rc init-padded 0 && { grep -q '"vocab_size": 300' "$TMP/padded/config.json" || fail "init-model: padded vocab_size not kept"; }
printf '{"vocab_size": 100}\n' >"$TMP/vocab100.json"
run init-small-vocab "$BIN" init-model --arch llama --preset "$TMP/vocab100.json" --seed 3 --out "$TMP/small-vocab" --tokenizer "$TMP/bytes.json"
expect_rc init-small-vocab 1 && expect_one_line_error init-small-vocab 'vocab_size 100, smaller than the 260 ids'
run init-badtok "$BIN" init-model --arch llama --preset tiny --seed 3 --out "$TMP/badtok-model" --tokenizer "$TMP/badpat.json"
expect_rc init-badtok 1 && expect_one_line_error init-badtok 'badpat\.json: pre_tokenizer'
[ -e "$TMP/badtok-model" ] && fail "init-model with a bad tokenizer created $TMP/badtok-model"

# ---------------------------------------------------------------- generate
check_help help-generate model prompt prompt-tokens max-new temperature top-p top-k min-p stop seed n threads json -- generate
check_help help-bench-generate model batch prompt-len new threads json -- bench generate
run gen-init "$BIN" init-model --arch qwen2 --preset tiny --seed 5 --out "$TMP/gen" --tokenizer chars
expect_rc gen-init 0
run gen-json "$BIN" generate --model "$TMP/gen" --prompt "12+34=" --max-new 12 --n 3 --seed 4 --json
expect_rc gen-json 0 && py gen-json-check '
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
for r in rows:
    assert 1 <= len(r["tokens"]) <= 12 and len(r["logprobs"]) == len(r["tokens"]), r
    assert len(r["logprobs_model"]) == len(r["tokens"]), r
    assert all(math.isfinite(x) and x <= 0 for x in r["logprobs"] + r["logprobs_model"]), r
    assert r["finish"] in ("length", "eos"), r
    assert isinstance(r["text"], str), r
assert len({tuple(r["tokens"]) for r in rows}) > 1, "three samples are identical"
' "$TMP/gen-json.out"
# the same seed gives the same samples: sample 0's tokens do not depend on --n (its log-probs
# may differ in the last digits: a batch of 3 prompts is prefilled by another product path)
run gen-json2 "$BIN" generate --model "$TMP/gen" --prompt "12+34=" --max-new 12 --n 1 --seed 4 --json
expect_rc gen-json2 0 && py gen-json2-check '
import json, sys
a = json.loads(open(sys.argv[1]).readline())
b = json.loads(open(sys.argv[2]).readline())
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4
' "$TMP/gen-json.out" "$TMP/gen-json2.out"
# a byte-level tokenizer: samples cut inside a multi-byte character still give JSON lines (the
# bad bytes as U+FFFD), and writing to a full disk is an error
py bytes-tok '
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": bl,
           "post_processor": None, "decoder": bl,
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
' "$TMP/bytes.tokenizer.json"
run gen-bytes-init "$BIN" init-model --arch qwen2 --preset tiny --seed 3 --tokenizer "$TMP/bytes.tokenizer.json" --out "$TMP/bytes"
# init-model again without --tokenizer removes the earlier tokenizer.json (it would not match)
run stale-init "$BIN" init-model --arch qwen2 --preset tiny --seed 3 --out "$TMP/bytes"
expect_rc stale-init 0 && { [ -e "$TMP/bytes/tokenizer.json" ] && fail "stale-init: tokenizer.json kept"; }
run gen-bytes-init2 "$BIN" init-model --arch qwen2 --preset tiny --seed 3 --tokenizer "$TMP/bytes.tokenizer.json" --out "$TMP/bytes"
run gen-bytes "$BIN" generate --model "$TMP/bytes" --prompt-tokens 104,105 --max-new 8 --n 8 --json
expect_rc gen-bytes 0 && py gen-bytes-check '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8, len(rows)
assert any("\ufffd" in r["text"] for r in rows), "no sample with a byte outside UTF-8"
' "$TMP/gen-bytes.out"
"$BIN" generate --model "$TMP/bytes" --prompt-tokens 104,105 --max-new 4 --json >/dev/full \
  2>"$TMP/gen-full.err"
RC=$?
expect_rc gen-full 1 && expect_one_line_error gen-full 'cannot write the output'
# A model whose vocab_size is padded past its tokenizer (as Qwen's: 151936 rows, 151669 ids)
# samples padding ids now and then; they decode to nothing, as in Hugging Face (generate and rl
# used to stop there with "token id ... is not in the vocabulary").
printf '{"vocab_size": 160}\n' >"$TMP/v160.json"
run gen-pad-init "$BIN" init-model --arch qwen2 --preset "$TMP/v160.json" --seed 3 --tokenizer chars --out "$TMP/pad"
run gen-pad "$BIN" generate --model "$TMP/pad" --prompt "1+2=" --max-new 16 --n 8 --json
expect_rc gen-pad 0 && py gen-pad-check '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 8, len(rows)
pad = [t for r in rows for t in r["tokens"] if t >= 99]
assert pad, "no padding id sampled: the check did not run"
for r in rows:
    want = "".join(chr(32 + t - 3) if t < 98 else "\n" for t in r["tokens"] if 3 <= t < 99)
    assert r["text"] == want, (r["text"], want, r["tokens"])
' "$TMP/gen-pad.out"
run rl-pad "$BIN" rl --model "$TMP/pad" --env arith:digits=1 --steps 1 --prompts 2 --group 2 --max-new 16 --out "$TMP/rl-pad"
expect_rc rl-pad 0
# rl's own messages do not name the command (no "longhaul rl: rl: --max-prompt ..."), and a
# run directory named rl keeps its name
run rl-ctx "$BIN" rl --model "$TMP/pad" --env arith --out "$TMP/rl-ctx" --max-prompt 2045 --max-new 8
expect_rc rl-ctx 1 && expect_one_line_error rl-ctx '^longhaul rl: --max-prompt 2045 and --max-new 8 exceed'
touch "$TMP/named/rl"
run rl-named-cmd bash -c 'cd "$1" && exec "$2" rl --model "$3" --env arith --out rl --steps 1' \
  _ "$TMP/named" "$BIN" "$TMP/pad"
expect_rc rl-named-cmd 1 && expect_one_line_error rl-named-cmd '^longhaul rl: rl: not a directory$'
mkdir -p "$TMP/named-env"
run rl-named-env bash -c 'cd "$1" && exec "$2" rl --model "$3" --env jsonl:path=rl --out o --steps 1' \
  _ "$TMP/named-env" "$BIN" "$TMP/pad"
expect_rc rl-named-env 1 && expect_one_line_error rl-named-env '^longhaul rl: rl: cannot open'
# greedy is deterministic and text mode prints the completion
run gen-greedy "$BIN" generate --model "$TMP/gen" --prompt-tokens 5,6,7 --max-new 8 --temperature 0
run gen-greedy2 "$BIN" generate --model "$TMP/gen" --prompt-tokens 5,6,7 --max-new 8 --temperature 0 --seed 9
expect_rc gen-greedy2 0 && { cmp -s "$TMP/gen-greedy.out" "$TMP/gen-greedy2.out" || fail "generate: greedy output depends on the seed"; }
# a stop string ends the sample with the string at the end of its text
first=$(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r["text"][2] if len(r["text"]) > 2 else "")' "$TMP/gen-json.out")
if [ -n "$first" ] && [ "$first" != '"' ] && [ "$first" != '\' ]; then
  run gen-stop "$BIN" generate --model "$TMP/gen" --prompt "12+34=" --max-new 12 --n 1 --seed 4 --json --stop "$first"
  expect_rc gen-stop 0 && py gen-stop-check '
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["finish"] == "stop" and r["text"].endswith(sys.argv[2]), r
' "$TMP/gen-stop.out" "$first"
fi
# refusals: a prompt filling the context, text without a tokenizer, bad ids
long=$(python3 -c 'print(",".join(["5"] * 2048))')
run gen-long "$BIN" generate --model "$TMP/gen" --prompt-tokens "$long"
expect_rc gen-long 1 && expect_one_line_error gen-long 'no room is left'
run gen-notok "$BIN" generate --model "$TMP/qwen2" --prompt "hi"
expect_rc gen-notok 1 && expect_one_line_error gen-notok 'no tokenizer.json'
run gen-badids "$BIN" generate --model "$TMP/gen" --prompt-tokens 1,x
expect_rc gen-badids 2 && expect_one_line_error gen-badids 'prompt-tokens: expected comma-separated token ids'
# an id outside the vocabulary: the engine's message, under the command's name once (it was
# "longhaul generate: generate: request 0: ...")
run gen-oov "$BIN" generate --model "$TMP/gen" --prompt-tokens 5,99999
expect_rc gen-oov 1 && expect_one_line_error gen-oov '^longhaul generate: request 0: prompt token 1 is 99999, outside the vocabulary \[0, [0-9]+\)$'
run gen-unclosed "$BIN" generate --model "$TMP/gen" --prompt-tokens "[1,2"
expect_rc gen-unclosed 2 && expect_one_line_error gen-unclosed 'prompt-tokens: expected comma-separated token ids, got "\[1,2"'
# an empty prompt on the command line is a usage error, given as text or as ids
run gen-empty-text "$BIN" generate --model "$TMP/gen" --prompt ""
expect_rc gen-empty-text 2 && expect_one_line_error gen-empty-text '--prompt: empty value'
run gen-empty-ids "$BIN" generate --model "$TMP/gen" --prompt-tokens "[]"
expect_rc gen-empty-ids 2 && expect_one_line_error gen-empty-ids '^longhaul generate: --prompt-tokens: empty list "\[\]" \(expected at least one token id\)$'
run gen-both "$BIN" generate --model "$TMP/gen" --prompt a --prompt-tokens 1
expect_rc gen-both 2 && expect_one_line_error gen-both 'exactly one of --prompt and --prompt-tokens'
# number flags are decimal, as the integer ones: no leading whitespace, no hex; a subnormal is a
# number (strtod's ERANGE on underflow is no error), a nonzero one that would read as 0 is refused
run gen-temp-space "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --temperature " 0.5"
expect_rc gen-temp-space 2 && expect_one_line_error gen-temp-space '--temperature: expected a number in \[0, 1e\+06\], got " 0.5"$'
run gen-temp-hex "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --temperature 0x1p-1
expect_rc gen-temp-hex 2 && expect_one_line_error gen-temp-hex '--temperature: expected a number in \[0, 1e\+06\], got "0x1p-1"$'
run gen-temp-sub "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --max-new 2 --temperature 1e-40
expect_rc gen-temp-sub 0
# the flags are used as floats, where 5e-324 (a double) is 0: greedy without a word
run gen-temp-dsub "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --temperature 5e-324
expect_rc gen-temp-dsub 2 && expect_one_line_error gen-temp-dsub '--temperature: "5e-324" is too small to represent'
run gen-temp-tiny "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --temperature 1e-400
expect_rc gen-temp-tiny 2 && expect_one_line_error gen-temp-tiny '--temperature: "1e-400" is too small to represent \(it would read as 0\)'
run gen-temp-zero "$BIN" generate --model "$TMP/gen" --prompt-tokens 5 --max-new 2 --temperature 0e-400
expect_rc gen-temp-zero 0
run gen-bench "$BIN" bench generate --model "$TMP/gen" --batch 2 --prompt-len 4 --new 3 --json
expect_rc gen-bench 0 && py gen-bench-check '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["batch"] == 2 and r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0, r
assert r["weight_bytes"] == 2 * r["params"], r  # bf16 weights
assert r["kernel"] in ("scalar", "avx2", "avx512"), r
# decode_s holds the N - 1 decode forwards (the first token comes from the prefill): the tokens
# counted are the B x (N - 1) they make, and a step is one of them (it counted B x N, and N steps)
B, N, d = r["batch"], r["new"], r["decode_s"]
assert 0 <= r["sample_s"] <= d, r
assert abs(r["decode_tokens_per_s"] * d - B * (N - 1)) <= 1e-4 * B * (N - 1), r
assert abs(r["decode_step_s"] * (N - 1) - d) <= 1e-4 * d, r
assert abs(r["prefill_tokens_per_s"] * r["prefill_s"] - B * r["prompt_len"]) <= 1e-4 * B * r["prompt_len"], r
' "$TMP/gen-bench.out"
run_full gen-bench-full "$BIN" bench generate --model "$TMP/gen" --batch 1 --prompt-len 4 --new 2
expect_rc gen-bench-full 1 && expect_one_line_error gen-bench-full '^longhaul bench generate: cannot write the output: '
# above 8 sequences the weights stay bf16 (there was an fp32 copy), and LH_KERNEL picks the path
LH_KERNEL=scalar run gen-bench9 "$BIN" bench generate --model "$TMP/gen" --batch 9 --prompt-len 2 --new 2 --json
expect_rc gen-bench9 0 && py gen-bench9-check '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["weight_bytes"] == 2 * r["params"], r
assert r["kernel"] == "scalar", r
' "$TMP/gen-bench9.out"
MAXPOS_GEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_position_embeddings"])' "$TMP/gen/config.json")
run gen-bench-ctx "$BIN" bench generate --model "$TMP/gen" --batch 1 --prompt-len "$MAXPOS_GEN" --new 2
expect_rc gen-bench-ctx 2 && expect_one_line_error gen-bench-ctx 'exceeds the context of '
# --new 1 has no decode forward to time (it printed sampling alone as decode throughput)
run gen-bench-new1 "$BIN" bench generate --model "$TMP/gen" --batch 2 --prompt-len 4 --new 1
expect_rc gen-bench-new1 2 && expect_one_line_error gen-bench-new1 '--new: expected an integer in \[2, '

# ---------------------------------------------------------------- sft
check_help help-sft model env out steps batch lr max-seq log-every force threads -- sft
run sft "$BIN" sft --model "$TMP/gen" --env arith:digits=1 --steps 60 --batch 16 --log-every 20 --out "$TMP/sft-out"
expect_rc sft 0 && py sft-check '
import re, sys
losses = [float(m) for m in re.findall(r"loss ([0-9.]+)", open(sys.argv[1]).read())]
assert len(losses) == 3, losses
assert losses[-1] < 0.8 * losses[0], losses
' "$TMP/sft.err" && {
  cmp -s "$TMP/gen/tokenizer.json" "$TMP/sft-out/tokenizer.json" || fail "sft: tokenizer.json not copied"
  run sft-gen "$BIN" generate --model "$TMP/sft-out" --prompt "3+4=" --temperature 0 --max-new 4
  expect_rc sft-gen 0
}
run sft-short "$BIN" sft --model "$TMP/gen" --env arith:digits=1 --steps 1 --max-seq 4 --out "$TMP/sft-short"
expect_rc sft-short 1 && expect_one_line_error sft-short 'train task 0: [0-9]+ tokens of prompt, solution and eos; --max-seq allows 4'
# A tokenizer.json with more ids than the model's vocab_size: refused before any step (the ids
# indexed past the embedding and logits rows).
printf '{"vocab_size": 40, "num_hidden_layers": 1}\n' >"$TMP/v40.json"
run sft-v40-init "$BIN" init-model --arch qwen2 --preset "$TMP/v40.json" --seed 1 --out "$TMP/v40"
expect_rc sft-v40-init 0 && cp "$TMP/gen/tokenizer.json" "$TMP/v40/tokenizer.json"
printf '{"prompt":"zz?","answer":"yy~"}\n{"prompt":"q","answer":"x"}\n' >"$TMP/sft-hi.jsonl"
run sft-vocab "$BIN" sft --model "$TMP/v40" --env "jsonl:path=$TMP/sft-hi.jsonl" --steps 1 --batch 2 --out "$TMP/sft-bad"
expect_rc sft-vocab 1 && expect_one_line_error sft-vocab "token [0-9]+ is outside the model's vocabulary \\[0, 40\\)"
# A jsonl example that cannot be trained on, late in the file, is found before step 1 (it ended
# the run after the steps before it, with nothing written); an empty one has nothing to learn
# (jsonl refuses a blank answer, naming the line, so an exec program gives the empty example).
python3 -c '
import json
for i in range(60): print(json.dumps({"prompt": "%d+%d=" % (i % 10, i // 10), "answer": str(i % 10 + i // 10)}))
print(json.dumps({"prompt": "1+" * 40 + "1=", "answer": "41"}))' >"$TMP/sft-late.jsonl"
run sft-late "$BIN" sft --model "$TMP/gen" --env "jsonl:path=$TMP/sft-late.jsonl" --steps 20 --batch 4 --max-seq 32 --log-every 1 --out "$TMP/sft-bad"
expect_rc sft-late 1 && expect_one_line_error sft-late 'train task [0-9]+: 8[0-9] tokens of prompt, solution and eos; --max-seq allows 32'
printf '%s\n' 'while read -r l; do echo "{\"prompt\":\"\",\"answer\":\"x\",\"solution\":\"\"}"; done' >"$TMP/sft-empty.sh"
run sft-empty "$BIN" sft --model "$TMP/gen" --env "exec:path=sh $TMP/sft-empty.sh" --steps 1 --out "$TMP/sft-bad"
expect_rc sft-empty 1 && expect_one_line_error sft-empty 'train task 0: nothing to learn'
printf '{"prompt":"","answer":""}\n' >"$TMP/sft-blank.jsonl"
run sft-blank "$BIN" sft --model "$TMP/gen" --env "jsonl:path=$TMP/sft-blank.jsonl" --steps 1 --out "$TMP/sft-bad"
expect_rc sft-blank 1 && expect_one_line_error sft-blank 'sft-blank.jsonl:1: field answer: expected a non-blank answer'
# --batch x --max-seq past INT_MAX tokens is a usage error (it overflowed an int)
printf '{"max_position_embeddings": 1048576}\n' >"$TMP/ctx1m.json"
run sft-ctx1m-init "$BIN" init-model --arch qwen2 --preset "$TMP/ctx1m.json" --seed 1 --out "$TMP/ctx1m" --tokenizer chars
run sft-huge "$BIN" sft --model "$TMP/ctx1m" --env arith --batch 4096 --max-seq 1048576 --out "$TMP/sft-bad"
expect_rc sft-huge 2 && expect_one_line_error sft-huge '--batch 4096 x --max-seq 1048576 is more than 2147483647 tokens'
[ -e "$TMP/sft-bad" ] && fail "sft: a refused run wrote $TMP/sft-bad"
run sft-badenv "$BIN" sft --model "$TMP/gen" --env nosuchenv --out "$TMP/sft-bad"
expect_rc sft-badenv 2 && expect_one_line_error sft-badenv 'nosuchenv'
run sft-notok "$BIN" sft --model "$TMP/qwen2" --env arith --out "$TMP/sft-bad"
expect_rc sft-notok 1 && expect_one_line_error sft-notok 'tokenizer.json'

# ---------------------------------------------------------------- eval
check_help help-eval model env split n samples temperature top-p max-new seed batch threads compare json -- eval
grep -q -- eval "$TMP/top-help.out" || fail "longhaul --help does not list eval"
run eval-nomodel "$BIN" eval --env arith
expect_rc eval-nomodel 2 && expect_one_line_error eval-nomodel 'missing required flag --model'
run eval-split "$BIN" eval --model "$TMP/gen" --env arith --split dev
expect_rc eval-split 2 && expect_one_line_error eval-split '--split: expected one of train\|test, got "dev"'
run eval-samples "$BIN" eval --model "$TMP/gen" --env arith --samples 0
expect_rc eval-samples 2 && expect_one_line_error eval-samples '--samples: expected an integer'
run eval-greedy-k "$BIN" eval --model "$TMP/gen" --env arith --samples 4 --temperature 0
expect_rc eval-greedy-k 2 && expect_one_line_error eval-greedy-k '--samples 4 with --temperature 0: greedy decoding gives the same sample every time'
run eval-ctx "$BIN" eval --model "$TMP/gen" --env arith --n 2 --max-new 2047
expect_rc eval-ctx 1 && expect_one_line_error eval-ctx 'and --max-new is 2047; the model.s context is 2048 tokens'
run eval-notok "$BIN" eval --model "$TMP/qwen2" --env arith --n 2
expect_rc eval-notok 1 && expect_one_line_error eval-notok 'tokenizer.json'
run eval-nocompare "$BIN" eval --model "$TMP/gen" --env arith --n 2 --compare "$TMP/nowhere"
expect_rc eval-nocompare 1 && expect_one_line_error eval-nocompare 'nowhere' &&
  { [ -s "$TMP/eval-nocompare.out" ] && fail "eval: printed results before rejecting --compare"; }
# a --compare model that cannot run is refused before the first model generates anything: a
# context too small for a prompt and --max-new, or no weights
printf '{"max_position_embeddings": 16}\n' >"$TMP/ctx16.json"
run eval-ctx16-init "$BIN" init-model --arch qwen2 --preset "$TMP/ctx16.json" --seed 3 --tokenizer chars --out "$TMP/ctx16"
expect_rc eval-ctx16-init 0
run eval-ctx2 "$BIN" eval --model "$TMP/gen" --compare "$TMP/ctx16" --env arith:digits=1 --n 2 --max-new 14
expect_rc eval-ctx2 1 && expect_one_line_error eval-ctx2 'ctx16: task 0: the prompt has [0-9]+ tokens and --max-new is 14; the model.s context is 16 tokens' &&
  { [ -s "$TMP/eval-ctx2.out" ] && fail "eval: printed results before rejecting --compare"; }
mkdir -p "$TMP/noweights" && cp "$TMP/gen/config.json" "$TMP/gen/tokenizer.json" "$TMP/noweights/"
run eval-noweights "$BIN" eval --model "$TMP/gen" --compare "$TMP/noweights" --env arith:digits=1 --n 2 --max-new 4
expect_rc eval-noweights 1 && expect_one_line_error eval-noweights 'noweights/model.safetensors'
# check_eval NAME FILE: every number of an eval --json file, recomputed from its per_task results
# with exact binomials (pass@k of Chen et al.), Wilson and normal intervals and the paired
# difference (docs/ALGORITHMS.md, "Evaluation"), agrees with the file's to 1e-9.
cat >"$TMP/check_eval.py" <<'PYEOF'
import json, math, statistics, sys
from fractions import Fraction

Z, TOL = 1.96, 1e-9
r = json.load(open(sys.argv[1], encoding="utf-8"))
K, n = r["samples"], r["tasks"]
ks = [1] + [2**j for j in range(1, 13) if 2**j < K] + ([K] if K > 1 else [])


def pass_at_k(c, k):  # 1 - C(K - c, k) / C(K, k), exactly
    return float(1 - Fraction(math.comb(K - c, k), math.comb(K, k)))


def normal(v, lo, hi):
    m = statistics.fmean(v)
    if len(v) == 1:
        return m, lo, hi
    h = Z * statistics.stdev(v) / math.sqrt(len(v))
    return m, max(lo, m - h), min(hi, m + h)


def mean_ci(v):
    if not v:
        return 0.0, 0.0, 1.0
    if any(x not in (0.0, 1.0) for x in v):
        return normal(v, 0.0, 1.0)
    m, d = len(v), 1 + Z * Z / len(v)
    p = sum(v) / m
    centre = (p + Z * Z / (2 * m)) / d
    half = Z / d * math.sqrt(p * (1 - p) / m + Z * Z / (4 * m * m))
    return p, max(0.0, centre - half), min(1.0, centre + half)


def paired_ci(a, b):
    return normal([x - y for x, y in zip(a, b)], -1.0, 1.0) if a else (0.0, -1.0, 1.0)


def value(who, i, k):  # pass@k of task i (k >= 1), or its mean reward (k = 0)
    t = who["per_task"][i]
    assert t["index"] == i and 0 <= t["correct"] <= K, t
    return pass_at_k(t["correct"], k) if k else t["reward"]


def check_block(what, block, a, b=None):
    """block holds a's numbers (b None) or the paired difference a - b"""
    scored = [i for i in range(n) if a["per_task"][i]["ok"] and (b is None or b["per_task"][i]["ok"])]

    def same(row, got, tasks, k):
        va = [value(a, i, k) for i in tasks]
        want = mean_ci(va) if b is None else paired_ci(va, [value(b, i, k) for i in tasks])
        g = (got["mean"], got["lo"], got["hi"])
        assert got["tasks"] == len(tasks), f"{what} {row}: {got['tasks']} tasks, want {len(tasks)}"
        assert max(abs(x - y) for x, y in zip(g, want)) <= TOL, f"{what} {row}: {g}, recomputed {want}"

    assert sorted(block["pass_at_k"], key=int) == [str(k) for k in ks], (what, list(block["pass_at_k"]))
    for k in ks:
        same(f"pass@{k}", block["pass_at_k"][str(k)], scored, k)
    same("pass_at_1", block["pass_at_1"], scored, 1)
    same("mean reward", block["mean_reward"], scored, 0)
    levels = sorted({t["level"] for t in a["per_task"] if t["level"]})
    assert [l["level"] for l in block["by_level"]] == levels, (what, block["by_level"])
    for l in block["by_level"]:
        tasks = [i for i in scored if a["per_task"][i]["level"] == l["level"]]
        same(f"{l['level']} pass@1", l["pass_at_1"], tasks, 1)
        same(f"{l['level']} mean reward", l["mean_reward"], tasks, 0)
    return len(scored)


for who in ("model", "compare"):
    if who in r:
        m = r[who]
        assert len(m["per_task"]) == n and m["tasks_scored"] == check_block(who, m, m), who
if "compare" in r:
    assert r["paired"]["tasks"] == check_block("paired", r["paired"], r["model"], r["compare"])
PYEOF
check_eval() {
  py "$1" "$(cat "$TMP/check_eval.py")" "$2"
}

EVAL_MODEL=$TMP/sft-out
[ -d "$EVAL_MODEL" ] || EVAL_MODEL=$TMP/gen
run eval "$BIN" eval --model "$EVAL_MODEL" --env arith:digits=1 --n 40 --json "$TMP/eval.json"
expect_rc eval 0 && {
  grep -Eq '^  pass@1 +[01]\.[0-9]{3}  \[[01]\.[0-9]{3}, [01]\.[0-9]{3}\]$' "$TMP/eval.out" ||
    fail "eval: no pass@1 line with an interval: $(cat "$TMP/eval.out")"
  py eval-json '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["command"] == "eval" and r["tasks"] == 40 and r["samples"] == 1 and r["split"] == "test", r
assert r["temperature"] == 0, "greedy by default with one sample"
m = r["model"]
for k in ["dir", "pass_at_1", "pass_at_k", "mean_reward", "by_level", "per_task", "tasks_scored"]:
    assert k in m, k
per = m["per_task"]
assert [t["index"] for t in per] == list(range(40)), per
assert all(t["ok"] and t["correct"] in (0, 1) and t["reward"] == t["correct"] for t in per), per
p = m["pass_at_1"]
assert abs(p["mean"] - sum(t["correct"] for t in per) / 40) < 1e-9, p
assert 0 <= p["lo"] <= p["mean"] <= p["hi"] <= 1 and p["hi"] > p["lo"], p
levels = {t["level"] for t in per}
assert levels and all(l[:2] in ("+ ", "- ") for l in levels), levels
assert sorted(b["level"] for b in m["by_level"]) == sorted(levels), m["by_level"]
assert sum(b["tasks"] for b in m["by_level"]) == 40, m["by_level"]
assert "compare" not in r and "paired" not in r
' "$TMP/eval.json"
}
# a report that cannot be written is a failure (exit 1; stderr's first line is the progress
# summary), and the --json file is written all the same
run_full eval-full "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 --json "$TMP/eval-full.json"
expect_rc eval-full 1 && {
  grep -q '^longhaul eval: cannot write the output: ' "$TMP/eval-full.err" ||
    fail "eval-full: no 'cannot write the output' error: $(cat "$TMP/eval-full.err")"
  py eval-full-json '
import json, sys
assert json.load(open(sys.argv[1]))["tasks"] == 2
' "$TMP/eval-full.json"
}
# --json PATH by what PATH names. A symbolic link is followed and its target replaced (the link
# was replaced by a regular file); a FIFO is written in place for its reader (it was replaced);
# a character device is written in place and its write error reported (as root, /dev/full
# itself was replaced: the device here is made in $TMP, never the real one); a directory is
# refused before the run.
echo old >"$TMP/json-target.json"
ln -s json-target.json "$TMP/json-link.json"
run eval-jlink "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 --json "$TMP/json-link.json"
expect_rc eval-jlink 0 && {
  [ -L "$TMP/json-link.json" ] || fail "eval --json: the symbolic link was replaced"
  py eval-jlink-json 'import json, sys; assert json.load(open(sys.argv[1]))["tasks"] == 2' "$TMP/json-target.json"
}
mkfifo "$TMP/json-fifo"
cat "$TMP/json-fifo" >"$TMP/json-fifo.read" &
reader=$!
run eval-jfifo timeout 120 "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 --json "$TMP/json-fifo"
# a reader still waiting (nothing was written to the FIFO): let it go
{ [ "$RC" -eq 0 ] && [ -p "$TMP/json-fifo" ]; } || kill "$reader" 2>/dev/null
wait "$reader" 2>/dev/null
expect_rc eval-jfifo 0 && {
  [ -p "$TMP/json-fifo" ] || fail "eval --json: the FIFO was replaced"
  py eval-jfifo-json 'import json, sys; assert json.load(open(sys.argv[1]))["tasks"] == 2' "$TMP/json-fifo.read"
}
if [ "$(id -u)" -eq 0 ] && mknod "$TMP/json-full" c 1 7 2>/dev/null; then
  run eval-jdev "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 --json "$TMP/json-full"
  expect_rc eval-jdev 1 && {
    grep -q "json-full: write failed: No space left on device" "$TMP/eval-jdev.err" ||
      fail "eval --json to a full device: no ENOSPC error: $(cat "$TMP/eval-jdev.err")"
    [ -c "$TMP/json-full" ] || fail "eval --json: the character device was replaced"
  }
fi
mkdir "$TMP/json-dir"
run eval-jdir "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 --json "$TMP/json-dir"
expect_rc eval-jdir 1 && expect_one_line_error eval-jdir '^longhaul eval: --json .*json-dir: is a directory, expected a file$'
# K samples: pass@k rises with k; results do not depend on how tasks are batched (streams are
# fixed per task and sample)
run eval-k "$BIN" eval --model "$EVAL_MODEL" --env arith:digits=1 --n 12 --samples 4 --max-new 6 --json "$TMP/eval-k.json"
expect_rc eval-k 0
run eval-k2 "$BIN" eval --model "$EVAL_MODEL" --env arith:digits=1 --n 12 --samples 4 --max-new 6 --batch 3 --json "$TMP/eval-k2.json"
expect_rc eval-k2 0 && py eval-k-json '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["temperature"] == 1, "temperature 1 by default with K > 1"
pk = a["model"]["pass_at_k"]
assert sorted(pk, key=int) == ["1", "2", "4"], pk
assert pk["1"]["mean"] <= pk["2"]["mean"] <= pk["4"]["mean"], pk
assert a["model"]["per_task"] == b["model"]["per_task"], "per-task results depend on --batch"
' "$TMP/eval-k.json" "$TMP/eval-k2.json"
# a model against itself: the paired difference is exactly 0
run eval-self "$BIN" eval --model "$EVAL_MODEL" --env arith:digits=1 --n 24 --samples 2 --max-new 6 --compare "$EVAL_MODEL" --json "$TMP/eval-self.json"
expect_rc eval-self 0 && {
  grep -Eq '^  pass@1 +\+0\.000  \[\+0\.000, \+0\.000\]$' "$TMP/eval-self.out" ||
    fail "eval --compare itself: $(cat "$TMP/eval-self.out")"
  py eval-self-json '
import json, sys
r = json.load(open(sys.argv[1]))
d = r["paired"]
assert d["tasks"] == 24 and d["pass_at_1"]["mean"] == 0 and d["pass_at_1"]["lo"] == 0 and d["pass_at_1"]["hi"] == 0, d
assert r["model"]["per_task"] == r["compare"]["per_task"]
' "$TMP/eval-self.json"
  grep -q 'note:' "$TMP/eval-self.out" && fail "eval --compare itself: a note on zero-width intervals"
}
# two different models: the briefly sft-trained one, which solves some tasks with some of its
# samples, and the untrained one it started from (its numbers are checked against per_task below)
run eval-cmp "$BIN" eval --model "$TMP/sft-out" --compare "$TMP/gen" --env arith:digits=1 --n 24 \
  --samples 4 --max-new 6 --json "$TMP/eval-cmp.json"
expect_rc eval-cmp 0 && py eval-cmp-json '
import json, sys
r = json.load(open(sys.argv[1]))
m, p = r["model"], r["paired"]
assert any(0 < t["correct"] < 4 for t in m["per_task"]), "the sft model solved no task with 1-3 of 4 samples"
assert m["per_task"] != r["compare"]["per_task"], "the two models gave the same results"
pk = m["pass_at_k"]
assert pk["1"]["mean"] < pk["2"]["mean"] < pk["4"]["mean"], pk
assert p["pass_at_1"]["mean"] > 0 and p["pass_at_k"]["4"]["mean"] > p["pass_at_1"]["mean"], p
' "$TMP/eval-cmp.json"
# two different untrained models that both solve no task: every paired difference is 0, so the
# normal interval has zero width, and eval says why (docs/ALGORITHMS.md, "The paired difference")
run eval-zero "$BIN" eval --model "$TMP/gen" --compare "$TMP/chars-model" --env arith:digits=1 --n 8 \
  --max-new 4 --json "$TMP/eval-zero.json"
expect_rc eval-zero 0 && py eval-zero-note '
import json, sys
r = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
assert r["model"]["pass_at_1"]["mean"] == 0 and r["compare"]["pass_at_1"]["mean"] == 0, "a model solved a task"
p = r["paired"]["pass_at_1"]
assert p["lo"] == p["hi"] == 0, p
notes = [l for l in out.splitlines() if l.startswith("  note:")]
assert len(notes) == 1 and "zero width" in notes[0] and "pass@1" in notes[0], out
' "$TMP/eval-zero.json" "$TMP/eval-zero.out"
# paths that are not UTF-8 (a jsonl file, model directories) reach the --json file with U+FFFD
# for the bad bytes
bad=$(printf '\xe9')
printf '{"prompt":"1+1=","answer":"2"}\n{"prompt":"2+2=","answer":"4"}\n' >"$TMP/d$bad.jsonl"
cp -r "$TMP/gen" "$TMP/m$bad" && cp -r "$TMP/chars-model" "$TMP/c$bad"
run eval-utf8 "$BIN" eval --model "$TMP/m$bad" --compare "$TMP/c$bad" --n 3 --max-new 4 \
  --env "jsonl:path=$TMP/d$bad.jsonl,test_fraction=0.5" --json "$TMP/eval-utf8.json"
expect_rc eval-utf8 0 && py eval-utf8-json '
import json, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
assert r["env"].endswith("/d\ufffd.jsonl,test_fraction=0.5"), r["env"]
assert r["model"]["dir"].endswith("/m\ufffd") and r["compare"]["dir"].endswith("/c\ufffd"), r
assert r["tasks"] == 2 and r["paired"]["tasks"] == 2, r
' "$TMP/eval-utf8.json"
# seeds are recorded as JSON integers (signed 64-bit): every command refuses 2^63 and above, and
# eval records the largest accepted one exactly
for cmd in "init-model --arch qwen2 --preset tiny --out $TMP/x" "generate --model $TMP/gen --prompt 1" \
  "eval --model $TMP/gen --env arith" "rl --model $TMP/gen --env arith --out $TMP/x"; do
  for seed in 9223372036854775808 18446744073709551616; do
    # shellcheck disable=SC2086
    run seed-big "$BIN" $cmd --seed $seed
    expect_rc seed-big 2 &&
      expect_one_line_error seed-big "--seed: expected an integer in \[0, 9223372036854775807\], got \"$seed\"\$"
  done
done
run eval-seed "$BIN" eval --model "$TMP/gen" --env arith:digits=1 --n 2 --max-new 2 \
  --seed 9223372036854775807 --json "$TMP/eval-seed.json"
expect_rc eval-seed 0 && py eval-seed-json '
import json, sys
assert json.load(open(sys.argv[1]))["seed"] == 2**63 - 1
' "$TMP/eval-seed.json"
# an exec environment is asked for each task once, however many models run on it; the task it
# fails on (index 2 answers garbage) is skipped for both models and counted
rm -f "$TMP/exec.log"
run eval-exec env EXEC_ENV_LOG="$TMP/exec.log" "$BIN" eval --model "$EVAL_MODEL" --n 6 --samples 2 --max-new 6 \
  --env "exec:path=/usr/bin/python3 $SRC/tests/fixtures/env/exec_env.py garbage" --compare "$EVAL_MODEL" --json "$TMP/eval-exec.json"
expect_rc eval-exec 0 && py eval-exec-requests '
import json, sys
reqs = [l.split() for l in open(sys.argv[1])]
gen = sorted(int(r[2]) for r in reqs if r[0] == "generate")
assert gen == [0, 1, 2, 3, 4, 5], f"generate requests: {gen}"
assert sum(r[0] == "score" for r in reqs) == 2 * 5 * 2, reqs
r = json.load(open(sys.argv[2]))
for who in ("model", "compare"):
    assert r[who]["tasks_scored"] == 5 and r[who]["tasks_skipped"] == 1, r[who]
    assert not r[who]["per_task"][2]["ok"], r[who]["per_task"][2]
' "$TMP/exec.log" "$TMP/eval-exec.json"
# an exec program's helpers die with a trainer killed by SIGKILL: eval is killed while the program
# (which started a child, a child in its own session and a double-forked daemon) sleeps on task 1
rm -f "$TMP/tree.pids"
EXEC_ENV_PIDS="$TMP/tree.pids" "$BIN" eval --model "$EVAL_MODEL" --n 3 --max-new 4 \
  --env "exec:path=/usr/bin/python3 $SRC/tests/fixtures/env/exec_env.py spawn-hang" >"$TMP/eval-kill.out" 2>"$TMP/eval-kill.err" &
evpid=$!
for _ in $(seq 300); do [ -s "$TMP/tree.pids" ] && break; sleep 0.05; done
sleep 0.2 # the program is now asleep on task 1
{ kill -9 "$evpid" && wait "$evpid"; } 2>/dev/null # (bash's "Killed" notice goes there too)
# alive PID: the process exists and is not a zombie
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "${st:0:1}" != Z ] && [ "${st:0:1}" != X ]
}
if read -r _ prog _ child session daemon <"$TMP/tree.pids"; then
  left=""
  for _ in $(seq 40); do
    left=""
    for p in $prog $child $session $daemon; do alive "$p" && left="$left $p"; done
    [ -z "$left" ] && break
    sleep 0.05
  done
  if [ -n "$left" ]; then
    fail "eval killed with SIGKILL: the exec program's processes$left still run 2 s later"
    kill -9 $left 2>/dev/null
  else
    pass
  fi
else
  fail "eval-kill: the exec program reported no pids: $(cat "$TMP/eval-kill.err")"
fi
# every --json file above: its numbers recomputed from its per-task results
for name in eval eval-k eval-k2 eval-self eval-cmp eval-zero eval-utf8 eval-seed eval-exec; do
  if [ -f "$TMP/$name.json" ]; then
    check_eval "$name-stats" "$TMP/$name.json"
  else
    fail "$name: no --json file to check"
  fi
done

# ---------------------------------------------------------------- env show
check_help help-env-show n split -- env show
grep -Eq '^  env ' "$TMP/top-help.out" || fail "longhaul --help does not list env"
run env-show "$BIN" env show arith:digits=3 --n 2
expect_rc env-show 0 && py env-show-out '
import re, sys
out = open(sys.argv[1]).read()
lines = out.splitlines()
assert "settings: arith:digits=3,ops=+-,seed=0" in lines, out
assert any(l.startswith("prompt format: ") and "A+B=" in l for l in lines), out
assert re.search(r"^  digits +3 +1\.\.9, default 2$", out, re.M), out
assert re.search(r"^  ops +\+- +characters of \+-\*, default \+-$", out, re.M), out
tasks = [l for l in lines if l.startswith("task ")]
assert len(tasks) == 2 and tasks[0].startswith("task 0 (level \"") and tasks[1].startswith("task 1 "), tasks
prompts = re.findall(r"^  prompt: +\"(\d{3})([-+])(\d{3})=\"$", out, re.M)
answers = re.findall(r"^  answer: +\"(-?\d+)\"$", out, re.M)
sols = re.findall(r"^  solution: +\"(-?\d+)\"$", out, re.M)
assert len(prompts) == 2 and len(answers) == 2 and sols == answers, out
for (a, op, b), ans in zip(prompts, answers):
    assert (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(ans), (a, op, b, ans)
' "$TMP/env-show.out"
# three tasks by default; the test split's tasks are other tasks; settings get their defaults
run env-show-cd "$BIN" env show countdown
run env-show-cd-test "$BIN" env show countdown --split test
expect_rc env-show-cd-test 0 && py env-show-cd '
import re, sys
a, b = open(sys.argv[1]).read(), open(sys.argv[2]).read()
pa, pb = re.findall(r"^  prompt: +(.*)$", a, re.M), re.findall(r"^  prompt: +(.*)$", b, re.M)
assert len(pa) == 3 and len(pb) == 3 and not set(pa) & set(pb), (pa, pb)
assert "settings: countdown:count=4,max=10,seed=0" in a and "test split: unbounded" in b, b
assert re.search(r"^task 0 \(level \"uses 4, [0-9] mul/div\"\)$", a, re.M), a
' "$TMP/env-show-cd.out" "$TMP/env-show-cd-test.out"
# jsonl: the split's size; no task shown twice; text escaped (a prompt's newline and ESC)
printf '{"prompt":"line one\\nline two \\u001b[2J","answer":"x"}\n{"prompt":"b","answer":2}\n' >"$TMP/show.jsonl"
run env-show-jsonl "$BIN" env show "jsonl:path=$TMP/show.jsonl,test_fraction=0.01" --n 9
expect_rc env-show-jsonl 0 && py env-show-jsonl-out '
import sys
out = open(sys.argv[1], "rb").read()
assert b"\x1b" not in out, out
text = out.decode()
assert "train split: 2 tasks" in text and text.count("\ntask ") == 2, text
want = "  prompt:   " + chr(34) + r"line one\nline two \x1b[2J" + chr(34)
assert want in text.splitlines(), text
assert "match         auto" in text and "test_fraction 0.01" in text, text
' "$TMP/env-show-jsonl.out"
run env-show-exec "$BIN" env show "exec:path=/usr/bin/python3 $SRC/tests/fixtures/env/exec_env.py good" --n 2 --split test
expect_rc env-show-exec 0 && { grep -q '^  prompt:   "1001+1001="$' "$TMP/env-show-exec.out" ||
  fail "env show exec: $(cat "$TMP/env-show-exec.out")"; }
# a bad spec is a usage error whose message lists the environment's keys and their ranges
ARITH_KEYS='valid keys: digits \(1\.\.9, default 2\), ops \(characters of \+-\*, default \+-\), seed \(0\.\.18446744073709551615, default 0\)$'
run env-show-key "$BIN" env show arith:digit=3
expect_rc env-show-key 2 && expect_one_line_error env-show-key "^longhaul env show: arith: unknown key 'digit'; $ARITH_KEYS"
run env-show-range "$BIN" env show arith:digits=0
expect_rc env-show-range 2 && expect_one_line_error env-show-range "arith: digits: expected 1\.\.9, found '0'; $ARITH_KEYS"
run env-show-twice "$BIN" env show sort:count=3,count=4
expect_rc env-show-twice 2 && expect_one_line_error env-show-twice "sort: key 'count' given twice; valid keys: count \(1\.\.64, default 5\), digits"
run env-show-name "$BIN" env show nosuch
expect_rc env-show-name 2 && expect_one_line_error env-show-name "unknown environment 'nosuch' \(expected arith, countdown, sort, jsonl or exec\)"
run env-show-path "$BIN" env show jsonl:match=exact
expect_rc env-show-path 2 && expect_one_line_error env-show-path "jsonl: missing key path; valid keys: path \(a file, required\)"
run env-show-esc "$BIN" env show "$(printf 'arith:\033[2J=1')"
expect_rc env-show-esc 2 && expect_one_line_error env-show-esc "unknown key '.x1b\[2J'" &&
  { grep -q "$(printf '\033')" "$TMP/env-show-esc.err" && fail "env show: an ESC byte of the spec reached stderr"; }
run env-show-nospec "$BIN" env show --n 2
expect_rc env-show-nospec 2 && expect_one_line_error env-show-nospec 'missing SPEC'
run env-show-two "$BIN" env show arith sort
expect_rc env-show-two 2 && expect_one_line_error env-show-two 'unexpected argument "sort"'
run env-show-n "$BIN" env show arith --n -1
expect_rc env-show-n 2 && expect_one_line_error env-show-n '--n: expected an integer'
run env-sub "$BIN" env frob
expect_rc env-sub 2 && expect_one_line_error env-sub 'unknown subcommand "frob"'
# a file that cannot be used is a failure (exit 1) naming FILE:LINE, its text escaped
printf '{"prompt":"a","answer":"1"}\n{"prompt":"b","answer":\033[31mred}\n' >"$TMP/esc.jsonl"
run env-show-badline "$BIN" env show "jsonl:path=$TMP/esc.jsonl"
expect_rc env-show-badline 1 && expect_one_line_error env-show-badline "esc\.jsonl:2: column [0-9]+: invalid token near '.x1b'" &&
  { grep -q "$(printf '\033')" "$TMP/env-show-badline.err" && fail "env show: an ESC byte of the file reached stderr"; }
# an exec program that fails on a task: the tasks before it are shown, then the error (exit 1)
run env-show-crash "$BIN" env show "exec:path=/usr/bin/python3 $SRC/tests/fixtures/env/exec_env.py crash" --n 5
expect_rc env-show-crash 1 && expect_one_line_error env-show-crash 'generate train 2: the program exited with status 3' &&
  { [ "$(grep -c '^task ' "$TMP/env-show-crash.out")" = 2 ] || fail "env show crash: $(cat "$TMP/env-show-crash.out")"; }

echo "cli.sh: $CHECKS checks passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
