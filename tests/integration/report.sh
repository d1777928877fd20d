#!/usr/bin/env bash
# `longhaul report` in a real browser: a short rl run (with --eval-every) and a short serve run
# (two workers on loopback, with --eval-every), an `eval --json` of the rl run, and a report of
# each, opened in headless Chromium through the DevTools protocol (report_browser.js). Checks:
# the page logs no console message or error and requests nothing but itself; every plot holds
# the number of points that metrics.jsonl, the ledger (read here with sqlite3) and the eval JSON
# say it must (counted here in Python, not by longhaul); plots without data say so; a
# screenshot is written (kept in $REPORT_SHOTS when set). Also: --eval-every leaves the trained
# weights as they are without it, and a bad metrics line is an error naming file and line.
# Usage: report.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
. "$(dirname "$0")/lib.bash"
lh_setup report
CHROMIUM=$(command -v chromium || true)
[ -n "$CHROMIUM" ] || fail "chromium is not installed (scripts/install-deps.sh installs it)"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$TMP"
ENV=arith:digits=1
T=(--threads 2)
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 1 --out m0 >/dev/null 2>&1
"$BIN" sft --model m0 --env $ENV --steps 60 --batch 16 --out base "${T[@]}" >sft.log 2>&1

# ---------------------------------------------------------------- rl, with and without --eval-every
RL=(--model base --env $ENV --steps 12 --staleness 1 --prompts 8 --group 4 --max-new 8 --seed 3
  --log-every 4 "${T[@]}")
"$BIN" rl "${RL[@]}" --out run --eval-every 4 --eval-n 24 >rl.log 2>&1 || fail "rl --eval-every"
"$BIN" rl "${RL[@]}" --out plain >plain.log 2>&1 || fail "rl"
grep -q 'heldout [0-9.]*@12' rl.log || fail "the progress line shows no held-out pass@1"
grep -q '"eval_every": 4' run/run.json || fail "run.json does not record --eval-every"
cmp run/checkpoints/step-000012/model.safetensors plain/checkpoints/step-000012/model.safetensors ||
  fail "--eval-every changed the trained weights"
# a resumed run keeps --eval-every from run.json, and refuses another value
"$BIN" rl --out run --resume --steps 14 --eval-every 5 >resume.log 2>&1 &&
  fail "--resume accepted another --eval-every"
grep -q -- '--eval-every 5 (the run has 4)' resume.log || fail "resume: $(cat resume.log)"
"$BIN" rl --out run --resume --steps 16 "${T[@]}" >resume.log 2>&1 || fail "rl --resume"
[ "$(grep -c '"kind":"eval"' run/metrics.jsonl)" = 5 ] || fail "evaluations after resume: $(grep -c '"kind":"eval"' run/metrics.jsonl), not 5 (steps 0, 4, 8, 12, 16)"
"$BIN" eval --model run --env $ENV --n 40 --samples 2 --compare base --json ev.json "${T[@]}" \
  >eval.log 2>&1 || fail "eval --json"

# ---------------------------------------------------------------- serve with two workers
"$BIN" keygen --out trainer.key >/dev/null 2>&1
lh_serve serve.log port --run srun --model base --env $ENV --key trainer.key \
  --steps 8 --prompts 4 --group 4 --max-new 8 --max-staleness 2 --keyframe-every 4 \
  --eval-every 4 --eval-n 16 --threads 1
for w in wa wb; do lh_worker "$URL" "$w"; done
wait "$SERVE" || fail "serve exited with $?"

# ---------------------------------------------------------------- the pages in Chromium
check_page() { # name run [--eval-json FILE]
  local name=$1 run=$2
  shift 2
  "$BIN" report --run "$run" --out "$name.html" "$@" >"$name-report.log" 2>&1 ||
    fail "report $name: $(cat "$name-report.log")"
  mkdir "ud-$name"
  node "$SRC/tests/integration/report_browser.js" "$CHROMIUM" "$name.html" "$name.png" \
    "ud-$name" >"$name.json" 2>"$name-browser.log" || fail "report_browser.js $name"
  [ -s "$name.png" ] || fail "$name: no screenshot"
  if [ -n "${REPORT_SHOTS:-}" ]; then mkdir -p "$REPORT_SHOTS" && cp "$name.png" "$name.html" "$REPORT_SHOTS/"; fi
  /usr/bin/python3 - "$name" "$run" "$@" <<'PY' || fail "$name: the page is not what $run holds"
import json, sqlite3, sys, os
name, run = sys.argv[1], sys.argv[2]
ev_path = sys.argv[4] if len(sys.argv) > 4 else None
page = json.load(open(name + ".json"))
bad = []
if page.get("problems"):
    bad.append("the page reported: %s" % page["problems"])
if page.get("external", 1) != 0:
    bad.append("%s script/link/img/iframe elements" % page.get("external"))
plots = {p["plot"]: p for p in page.get("plots", [])}
lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
upd = [l for l in lines if "kind" not in l]
evals = [l for l in lines if l.get("kind") == "eval"]
fin = lambda key: sum(1 for l in upd if isinstance(l.get(key), (int, float)))
served = os.path.exists(os.path.join(run, "ledger.sqlite"))
want = {"reward": fin("reward" if served else "reward_mean"), "accuracy": fin("accuracy"),
        "heldout": len(evals)}
if served:
    db = sqlite3.connect(os.path.join(run, "ledger.sqlite"))
    q = lambda s: db.execute(s).fetchone()[0]
    want["bytes"] = (q("SELECT count(DISTINCT version) FROM blobs WHERE kind = 1") +
                     q("SELECT count(DISTINCT version) FROM blobs WHERE kind = 0"))
    want["workers"] = 4 * q("SELECT count(*) FROM workers")
    # trained groups by staleness (version of the update - 1 - version used): one bar per bin
    # from 0 to the largest
    top = q("SELECT max(trained_at - 1 - version_used) FROM groups WHERE state = 3")
    want["staleness"] = top + 1
    absent = {"entropy", "kl", "clip", "eval"}
else:
    want["entropy"] = fin("entropy")
    want["kl"] = fin("kl_mu_pi")
    want["clip"] = fin("clip_frac")
    want["staleness"] = int(max(l["staleness"] for l in upd)) + 1
    absent = {"bytes", "workers"}
    if ev_path:
        ev = json.load(open(ev_path))
        rows = len(ev["model"]["pass_at_k"]) + 1
        want["eval"] = 2 * rows
        want["paired"] = rows
    else:
        absent.add("eval")
if len(evals) < 3:
    bad.append("only %d held-out evaluations in metrics.jsonl" % len(evals))
for k, n in want.items():
    p = plots.get(k)
    if not p:
        bad.append("no plot %s" % k)
    elif p["absent"] or p["points"] != n or p["tooltips"] != n or p["width"] < 300:
        bad.append("plot %s: %s, expected %d points" % (k, p, n))
for k in absent:
    p = plots.get(k)
    if not p or not p["absent"] or "Not" not in p["text"] and "No " not in p["text"]:
        bad.append("plot %s should say its data is absent: %s" % (k, p))
if page.get("height", 0) < 1500:
    bad.append("page height %s" % page.get("height"))
if bad:
    print("\n".join(bad))
    sys.exit(1)
print("%s: %d plots checked, %d absent as expected" % (name, len(want), len(absent)))
PY
}
check_page rl run --eval-json ev.json
check_page serve srun
# the page loads nothing from anywhere
if grep -Eo '(src|href)=' rl.html serve.html; then fail "the page references outside files"; fi

# ---------------------------------------------------------------- bad input: file and line
cp -r run broken
printf '{"step":17,"reward_mean":"high"}\n' >>broken/metrics.jsonl
if "$BIN" report --run broken --out b.html >bad.log 2>&1; then fail "a bad metrics line was accepted"; fi
grep -q 'metrics.jsonl:22: "reward_mean": expected a number or null, found string' bad.log ||
  fail "the error does not name the file and line: $(cat bad.log)"
[ ! -e b.html ] || fail "a page was written from bad metrics"
echo "report: rl and serve pages open in Chromium with every plot's points, no console errors"
