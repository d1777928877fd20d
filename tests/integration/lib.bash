# What the integration scripts that start processes share: a temporary directory removed on
# exit, every process started stopped on exit, a fatal `fail` that shows the logs, and starting
# serve, workers and netem on loopback with the ports the kernel picks. Sourced by a script that
# has set BIN (the longhaul binary); it defines nothing else and runs nothing when sourced.
#
#   lh_setup NAME            TMP, a new directory (${TMPDIR:-/tmp}/longhaul-NAME.XXXXXX); PIDS,
#                            empty. On exit: the script's on_exit (when it defines one), then
#                            kill -9 of every PID in PIDS, wait, and TMP removed (kept when
#                            KEEP_TMP is set).
#   fail MSG                 prints FAIL: MSG, the last 5 lines of every $TMP/*.log and what the
#                            script's fail_detail prints (when it defines one), and exits 1. A
#                            script that counts failures instead defines its own after sourcing.
#   lh_alive PID             whether PID runs (a zombie does not)
#   lh_wait_file FILE S [PID]  until FILE is not empty: at most S seconds, and no longer than PID
#                            runs; returns 1 when FILE is still empty
#   lh_free_port             a free loopback port (bound and released: for a program that cannot
#                            report the port it binds, as nginx)
#   lh_serve LOG PORTFILE ARGS...   `$BIN serve ARGS --port-file PORTFILE` in the background,
#                            appending to LOG; waits for the port (LH_SERVE_WAIT_S seconds,
#                            default 20) and sets SERVE (its PID) and URL; fails when no port comes
#   lh_worker URL NAME [ARGS...]    `$BIN worker` with key NAME.key, trusting trainer.key.pub, in
#                            directory NAME with 8 slots, appending to NAME.log, at nice
#                            LH_WORKER_NICE (default 0); sets WORKER (its PID)
#   lh_netem NAME UPSTREAM_PORT [ARGS...]   `$BIN netem` from a port of its own to
#                            127.0.0.1:UPSTREAM_PORT, stdout in NAME.out and stderr in NAME.log;
#                            sets NETEM (its PID) and NETEM_PORT; fails when it does not listen
# Paths without a directory (logs, port files, NAME) are in the current directory: the scripts
# cd "$TMP" first. (Named .bash, not .sh: tests/CMakeLists.txt runs every *.sh here as a test.)

lh_cleanup() {
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}

lh_setup() {
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/longhaul-$1.XXXXXX")
  PIDS=()
  trap lh_cleanup EXIT
}

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done
  if declare -F fail_detail >/dev/null; then fail_detail >&2 || true; fi
  exit 1
}

lh_alive() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${st#Z}" = "$st" ]
}

lh_wait_file() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    [ -s "$1" ] && return 0
    [ -n "${3:-}" ] && ! lh_alive "$3" && break
    sleep 0.05
  done
  [ -s "$1" ]
}

lh_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

lh_serve() {
  local log=$1 portfile=$2
  shift 2
  rm -f "$portfile"
  "$BIN" serve "$@" --port-file "$portfile" >>"$log" 2>&1 &
  SERVE=$!
  PIDS+=("$SERVE")
  lh_wait_file "$portfile" "${LH_SERVE_WAIT_S:-20}" "$SERVE" ||
    { fail "serve did not write its port: $(tail -2 "$log")"; return 1; }
  URL=http://127.0.0.1:$(cat "$portfile")
}

lh_worker() {
  local url=$1 name=$2
  shift 2
  nice -n "${LH_WORKER_NICE:-0}" "$BIN" worker --server "$url" --key "$name.key" \
    --trust-key trainer.key.pub --dir "$name" --slots 8 --name "$name" "$@" >>"$name.log" 2>&1 &
  WORKER=$!
  PIDS+=("$WORKER")
}

lh_netem() {
  local name=$1 upstream=$2 i
  shift 2
  "$BIN" netem --listen 127.0.0.1:0 --upstream "127.0.0.1:$upstream" "$@" >"$name.out" \
    2>"$name.log" &
  NETEM=$!
  PIDS+=("$NETEM")
  for ((i = 0; i < 100; i++)); do grep -qs listening "$name.out" && break; sleep 0.05; done
  NETEM_PORT=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\) ->.*/\1/p' "$name.out")
  [ -n "$NETEM_PORT" ] || fail "netem $name did not start: $(cat "$name.log")"
}
