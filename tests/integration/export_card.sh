#!/usr/bin/env bash
# Integration test of the model card `longhaul export` writes (OUT/README.md): for an `rl` run
# with an `eval --json` file, for the same run with `--eval SPEC` (export runs the evaluation
# against the run's base), and for a `serve` run (one worker; provenance from the ledger). Every
# number the card states is recomputed here from the sources (metrics.jsonl, the eval JSON,
# the ledger with sqlite3, the signed manifest's BLAKE2b-256 with Python's hashlib, the key
# file). Bad inputs (a run.json field of the wrong type, an eval file that is not one) fail
# with messages naming the file and the field, before anything is written.
# Usage: bash export_card.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any.
set -uo pipefail

BIN=${1:?usage: export_card.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: export_card.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/export.h" ] || { echo "export_card.sh: $SRC is not the longhaul source tree"; exit 1; }
. "$(dirname "$0")/lib.bash"
lh_setup card
PY=/usr/bin/python3
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=$((FAILED + 1))
}
has() { # has FILE TEXT: the card holds TEXT verbatim
  grep -qF -- "$2" "$1" || fail "$1 lacks: $2"
}
cd "$TMP" || exit 1
ENV=sort:count=3,digits=1
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 2 --out m0 >/dev/null 2>&1
"$BIN" sft --model m0 --env $ENV --steps 30 --batch 16 --log-every 30 --out base >/dev/null 2>&1 ||
  fail "sft"

# ---------------------------------------------------------------- an rl run, eval --json
"$BIN" rl --model base --env $ENV --out rlrun --steps 3 --prompts 4 --group 4 --max-new 8 \
  --threads 1 --eval-every 2 --eval-n 8 >/dev/null 2>rl.err || fail "rl: $(tail -2 rl.err)"
grep -q '"kind":"eval"' rlrun/metrics.jsonl || fail "rl --eval-every wrote no eval line"
"$BIN" eval --model rlrun --env $ENV --n 12 --max-new 8 --compare base --json ev.json \
  --threads 1 >/dev/null 2>&1 || fail "eval"
"$BIN" export --model rlrun --out ex1 --gguf q8_0 --eval-json ev.json >/dev/null 2>ex1.err ||
  fail "export rl: $(cat ex1.err)"
C=ex1/README.md
head -1 $C | grep -qx -- "---" || fail "$C: no front matter"
has $C "license: other"
has $C "library_name: transformers"
has $C "base_model: \"base\""
has $C "- longhaul"
has $C "- sort"
has $C "| env | \`$ENV\` |"
has $C "| group | 4 |"
has $C "| prompts | 4 |"
has $C "| \`model-q8_0.gguf\` |"
has $C "llama-cli -m model-q8_0.gguf"
has $C "$(sed -n 's/.*"command": "\(.*\)",/\1/p' rlrun/run.json)"
has $C "longhaul export --model rlrun --out ex1 --gguf q8_0 --eval-json ev.json"
# the provenance numbers, summed here from metrics.jsonl
read -r updates groups skipped < <($PY -c '
import json,sys
u=g=s=0
for l in open("rlrun/metrics.jsonl"):
    o=json.loads(l)
    if "kind" in o: continue
    u+=o["updates"]; g+=o["groups_used"]; s+=o["skipped_groups"]
print(u,g,s)')
has $C "- updates: $updates (3 metrics lines"
has $C "- prompt groups trained: $groups ($((groups * 4)) rollouts of 4 per group)"
[ "$skipped" -eq 0 ] || has $C "; $skipped more had equal rewards (no learning signal) and were skipped"
has $C "- exported checkpoint: step 3"
# the evaluation rows, formatted here from the eval JSON
$PY - ev.json >rows.txt <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
f = lambda c, s="": f"{c['mean']:{s}.3f} [{c['lo']:{s}.3f}, {c['hi']:{s}.3f}]"
for name, key in (("pass@1", None), ("mean reward", "mean_reward")):
    get = (lambda o: o["pass_at_k"]["1"]) if key is None else (lambda o: o[key])
    print(f"| {name} | {f(get(e['compare']))} | {f(get(e['model']))} | {f(get(e['paired']), '+')} |")
PY
while read -r row; do has $C "$row"; done <rows.txt
has $C "| metric | base \`base\` | this model | difference (paired, 95% interval) |"

# ---------------------------------------------------------------- --eval SPEC: the same numbers
"$BIN" export --model rlrun --out ex2 --eval "$ENV" --eval-n 12 >/dev/null 2>ex2.err ||
  fail "export --eval: $(cat ex2.err)"
while read -r row; do has ex2/README.md "$row"; done <rows.txt
has ex2/README.md "from longhaul export --eval."

# ---------------------------------------------------------------- a serve run, from its ledger
"$BIN" keygen --out trainer.key >/dev/null 2>&1
lh_serve serve.log port --run srun --model base --env $ENV --key trainer.key \
  --listen 127.0.0.1:0 --steps 3 --prompts 3 --group 4 --max-new 8 --lease-s 5
lh_worker "$URL" w1
for _ in $(seq 1 600); do kill -0 "$SERVE" 2>/dev/null || break; sleep 0.1; done
wait "$SERVE" || fail "serve exited with $? ($(tail -2 serve.log))"
"$BIN" export --model srun --out ex3 >/dev/null 2>ex3.err || fail "export serve: $(cat ex3.err)"
C=ex3/README.md
# group states in the ledger: 2 rejected, 3 trained (include/longhaul/ledger.h)
trained=$(sqlite3 srun/ledger.sqlite "SELECT count(*) FROM groups WHERE state = 3")
rejected=$(sqlite3 srun/ledger.sqlite "SELECT count(*) FROM groups WHERE state = 2")
[ "$trained" -gt 0 ] || fail "the serve run trained no group"
latest=$(sqlite3 srun/ledger.sqlite "SELECT max(version) FROM versions")
hash=$($PY -c '
import hashlib,sqlite3,sys
db=sqlite3.connect("srun/ledger.sqlite")
m=db.execute("SELECT manifest FROM versions ORDER BY version DESC LIMIT 1").fetchone()[0]
print(hashlib.blake2b(bytes(m),digest_size=32).hexdigest())')
has $C "networked run (\`longhaul serve\`)"
has $C "- updates: 3 (3 metrics lines"
has $C "- prompt groups trained: $trained ($((trained * 4)) rollouts of 4 per group)"
has $C "  - workers: 1"
has $C "    - w1: $trained groups trained, $rejected rejected"
has $C "  - groups: $trained trained, $rejected rejected"
has $C "  - last manifest (version $latest): BLAKE2b-256 \`$hash\`"
has $C "$(cat trainer.key.pub)"
has $C "No evaluation was given to the export"

# ---------------------------------------------------------------- bad inputs, nothing written
echo '{"command":"eval","env":"x","split":"test","tasks":"many"}' >bad_eval.json
if "$BIN" export --model rlrun --out bad1 --eval-json bad_eval.json >/dev/null 2>bad1.err; then
  fail "a bad eval file was accepted"
fi
grep -q 'bad_eval.json: "tasks" and "samples": expected integers >= 1' bad1.err ||
  fail "bad eval file: $(cat bad1.err)"
[ ! -e bad1 ] || fail "a refused export wrote bad1"
cp -r rlrun badrun && sed -i 's/"env": "[^"]*"/"env": 7/' badrun/run.json
if "$BIN" export --model badrun --out bad2 >/dev/null 2>bad2.err; then fail "a bad run.json was accepted"; fi
grep -q "badrun/run.json: field env: expected a string, found integer" bad2.err ||
  fail "bad run.json: $(cat bad2.err)"
if "$BIN" export --model rlrun --out bad3 --eval-json rlrun/run.json >/dev/null 2>bad3.err; then
  fail "run.json taken as an eval file"
fi
grep -q '"command": expected "eval"' bad3.err || fail "not an eval file: $(cat bad3.err)"

cp -r rlrun badm && echo 'not json' >>badm/metrics.jsonl
if "$BIN" export --model badm --out bad4 >/dev/null 2>bad4.err; then fail "a bad metrics line was accepted"; fi
grep -q "badm/metrics.jsonl:$(($(wc -l <rlrun/metrics.jsonl) + 1)): expected a JSON object per line" bad4.err || fail "bad metrics: $(cat bad4.err)"
[ ! -e bad4 ] || fail "a refused export wrote bad4"

if [ "$FAILED" -ne 0 ]; then
  echo "export_card.sh: $FAILED check(s) failed"
  exit 1
fi
echo "export_card.sh: all checks passed"
