#!/usr/bin/env bash
# Integration test of `longhaul netem`, run against the built binary: in front of a loopback HTTP
# server (python3 -m http.server), it prints its listening line with the kernel's port, curl
# fetches a file through it intact and the round trip shows the delay (2 x --delay more than
# direct), --reset-after cuts a download at exactly that many bytes, SIGTERM stops it with exit
# code 0 and its counters on stderr; bad flags and non-loopback hosts are usage errors (exit 2,
# one line), a port in use exits 1, --help names every flag.
# Usage: bash netem.sh LONGHAUL_BIN SOURCE_DIR. Prints every failed check; exits 1 if any failed.
set -uo pipefail

BIN=${1:?usage: netem.sh LONGHAUL_BIN SOURCE_DIR}
SRC=${2:?usage: netem.sh LONGHAUL_BIN SOURCE_DIR}
[ -f "$SRC/include/longhaul/netem.h" ] || { echo "netem.sh: $SRC is not the longhaul source tree"; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
command -v curl >/dev/null || { echo "netem.sh: curl is needed"; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-netem.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
forget() { # PID: waited for, so never killed by cleanup (its number may be reused)
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

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

# usage_error NAME PATTERN FLAGS...: exit code 2 and one line on stderr matching PATTERN.
usage_error() {
  local name=$1 pat=$2
  shift 2
  run "$name" timeout 10 "$BIN" netem "$@"
  if [ "$RC" -ne 2 ]; then
    fail "$name: exit code $RC, expected 2; stderr: $(head -c 400 "$TMP/$name.err")"
    return
  fi
  if [ "$(wc -l <"$TMP/$name.err")" -ne 1 ] || ! grep -Eq -- "^longhaul netem: .*$pat" "$TMP/$name.err"; then
    fail "$name: expected one line matching /$pat/, got: $(cat "$TMP/$name.err")"
    return
  fi
  pass
}

# wait_line FILE PATTERN: waits up to 10 s for a line of FILE matching PATTERN; prints it.
wait_line() {
  for _ in $(seq 100); do
    if grep -Em1 -- "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# start_netem NAME FLAGS...: starts netem in the background; sets NPID and NPORT.
start_netem() {
  local name=$1
  shift
  "$BIN" netem --listen 127.0.0.1:0 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  NPID=$!
  PIDS+=("$NPID")
  local line
  line=$(wait_line "$TMP/$name.out" '^netem: listening') || {
    fail "$name: no listening line after 10 s; stderr: $(head -c 400 "$TMP/$name.err")"
    NPORT=
    return 1
  }
  if [[ $line =~ ^netem:\ listening\ on\ 127\.0\.0\.1:([0-9]+)\ -\>\ 127\.0\.0\.1:([0-9]+)$ ]]; then
    NPORT=${BASH_REMATCH[1]}
    pass
  else
    fail "$name: the listening line is not 'netem: listening on 127.0.0.1:PORT -> 127.0.0.1:PORT': $line"
    NPORT=
    return 1
  fi
}

# stop NAME PID: SIGTERM, then the exit code must be 0 and the counters on stderr.
stop() {
  kill -TERM "$2"
  local rc=0
  wait "$2" || rc=$?
  [ "$rc" -eq 0 ] && pass || fail "$1: exit code $rc after SIGTERM, expected 0"
  forget "$2"
  grep -Eq '^netem: stopped \(SIGTERM\): accepted=[0-9]+ ' "$TMP/$1.err" && pass ||
    fail "$1: no counters on stderr after SIGTERM: $(cat "$TMP/$1.err")"
}

# ------------------------------------------------------------------ an HTTP server on loopback
mkdir -p "$TMP/www"
head -c 300000 /dev/urandom >"$TMP/www/blob"
(cd "$TMP/www" && exec python3 -u -m http.server --bind 127.0.0.1 0 >"$TMP/http.out" 2>"$TMP/http.err") &
PIDS+=($!)
line=$(wait_line "$TMP/http.out" '^Serving HTTP on 127\.0\.0\.1 port [0-9]+') ||
  { echo "FAIL: the python HTTP server did not start: $(cat "$TMP/http.err")"; exit 1; }
SPORT=$(sed -E 's/^Serving HTTP on 127\.0\.0\.1 port ([0-9]+).*/\1/' <<<"$line")

# ------------------------------------------------------------------ delay, content, counters
start_netem delay --upstream "127.0.0.1:$SPORT" --delay 100
if [ -n "$NPORT" ]; then
  grep -q -- "-> 127.0.0.1:$SPORT\$" "$TMP/delay.out" && pass || fail "delay: the line names another upstream"
  direct=$(curl -s -o "$TMP/direct" -w '%{time_total}' "http://127.0.0.1:$SPORT/blob")
  through=$(curl -s -o "$TMP/through" -w '%{time_total}' "http://127.0.0.1:$NPORT/blob")
  cmp -s "$TMP/through" "$TMP/www/blob" && pass || fail "delay: the file fetched through netem differs"
  # one request and its reply cross the proxy once each way: >= 2 x 100 ms more than direct
  python3 -c "import sys; d, t = map(float, sys.argv[1:]); sys.exit(0 if t - d >= 0.195 and t < 5 else 1)" \
    "$direct" "$through" && pass ||
    fail "delay: direct ${direct}s, through netem --delay 100 ${through}s (expected >= 0.2 s more)"
  echo "netem.sh: curl direct ${direct}s, through --delay 100 ${through}s"
  stop delay "$NPID"
  grep -Eq 'stopped \(SIGTERM\): accepted=1 refused=0 reset=0 upstream_failed=0 bytes_up=[0-9]+ bytes_down=[0-9]+ dropped=0$' \
    "$TMP/delay.err" && pass || fail "delay: counters: $(tail -1 "$TMP/delay.err")"
  down=$(sed -nE 's/.* bytes_down=([0-9]+).*/\1/p' "$TMP/delay.err")
  [ "${down:-0}" -gt 300000 ] && pass || fail "delay: $down bytes down, expected the 300000-byte file and headers"
fi

# ------------------------------------------------------------------ a download cut by a reset
start_netem reset --upstream "localhost:$SPORT" --reset-after 50000
if [ -n "$NPORT" ]; then
  run reset-curl curl -s -o "$TMP/partial" "http://127.0.0.1:$NPORT/blob"
  [ "$RC" -ne 0 ] && pass || fail "reset: curl succeeded through --reset-after 50000"
  size=$(stat -c %s "$TMP/partial" 2>/dev/null || echo 0)
  [ "$size" -lt 50000 ] && pass || fail "reset: curl got $size bytes, expected fewer than 50000"
  cmp -s -n "$size" "$TMP/partial" "$TMP/www/blob" && pass || fail "reset: the partial download is not a prefix"
  echo "netem.sh: --reset-after 50000 cut the download at $size bytes of body (curl exit $RC)"
  stop reset "$NPID"
  grep -Eq ' accepted=1 .*reset=1 ' "$TMP/reset.err" && pass ||
    fail "reset: counters: $(tail -1 "$TMP/reset.err")"
  total=$(sed -nE 's/.* bytes_up=([0-9]+) bytes_down=([0-9]+).*/\1 \2/p' "$TMP/reset.err" | awk '{print $1 + $2}')
  [ "$total" = 50000 ] && pass || fail "reset: $total bytes forwarded in all, expected exactly 50000"
fi

# ------------------------------------------------------------------ SIGINT too
start_netem int --upstream "127.0.0.1:$SPORT"
if [ -n "$NPORT" ]; then
  kill -INT "$NPID"
  rc=0
  wait "$NPID" || rc=$?
  forget "$NPID"
  [ "$rc" -eq 0 ] && pass || fail "int: exit code $rc after SIGINT, expected 0"
fi

# ------------------------------------------------------------------ refusals
usage_error no-upstream "missing required flag --upstream" --listen 127.0.0.1:0
usage_error no-listen "missing required flag --listen" --upstream 127.0.0.1:80
usage_error far-listen "listen host \"10.0.0.1\": not a loopback address" --listen 10.0.0.1:0 --upstream 127.0.0.1:80
usage_error any-listen "listen host \"0.0.0.0\": not a loopback address" --listen 0.0.0.0:0 --upstream 127.0.0.1:80
usage_error far-upstream "upstream host \"8.8.8.8\": not a loopback address" --listen 127.0.0.1:0 --upstream 8.8.8.8:53
usage_error name-upstream "upstream host \"example.com\": expected an IPv4 loopback address" --listen 127.0.0.1:0 --upstream example.com:80
usage_error no-port "--listen: expected HOST:PORT" --listen 127.0.0.1 --upstream 127.0.0.1:80
usage_error big-port "--upstream: expected HOST:PORT with a port in \[1, 65535\]" --listen 127.0.0.1:0 --upstream 127.0.0.1:65536
usage_error zero-port "--upstream: expected HOST:PORT with a port in \[1, 65535\]" --listen 127.0.0.1:0 --upstream 127.0.0.1:0
usage_error neg-delay "--delay: expected an integer in \[0, 60000\]" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --delay -1
usage_error word-delay "--delay: expected an integer" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --delay 10ms
usage_error jitter "--jitter 20 is larger than --delay 10" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --delay 10 --jitter 20
usage_error drop "--drop: expected a number in \[0, 1\]" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --drop 1.5
usage_error rate "--rate: expected a non-negative integer" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --rate 1.5
usage_error window "--window: expected an integer in \[4096," --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --window 100
usage_error maxc "--max-connections: expected an integer in \[1, 4096\]" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --max-connections 0
usage_error unknown "unknown flag --loss" --listen 127.0.0.1:0 --upstream 127.0.0.1:80 --loss 0.1
# the HTTP server's port is taken: a failure to run, not a usage error
run taken timeout 10 "$BIN" netem --listen "127.0.0.1:$SPORT" --upstream 127.0.0.1:80
[ "$RC" -eq 1 ] && grep -Eq "^longhaul netem: cannot listen on 127\.0\.0\.1:$SPORT: Address already in use" "$TMP/taken.err" &&
  pass || fail "taken: exit code $RC, expected 1 with 'cannot listen'; stderr: $(cat "$TMP/taken.err")"

run help "$BIN" netem --help
[ "$RC" -eq 0 ] && pass || fail "help: exit code $RC"
for f in listen upstream delay jitter rate drop reset-after seed max-connections window; do
  grep -q -- "--$f " "$TMP/help.out" && pass || fail "help: --$f is not described"
done
# and names no flag that is not one
while read -r f; do
  case "$f" in
  --help | --listen | --upstream | --delay | --jitter | --rate | --drop | --reset-after | --seed | \
    --max-connections | --window) pass ;;
  *) fail "help: mentions $f, which is not a flag of netem" ;;
  esac
done < <(grep -oE -- '--[a-z][a-z-]*' "$TMP/help.out" | sort -u)
[ -s "$TMP/help.err" ] && fail "help: wrote to stderr: $(cat "$TMP/help.err")"
run top-help "$BIN" --help
grep -q '^  netem ' "$TMP/top-help.out" && pass || fail "longhaul --help does not list netem"

echo "netem.sh: $CHECKS checks passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
