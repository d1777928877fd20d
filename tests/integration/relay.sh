#!/usr/bin/env bash
# Policy blobs relayed by a real HTTP cache: Debian's nginx (started here on a free loopback
# port, config written here, stopped at the end) caches /v1/blobs/ and /v1/manifests/ in front
# of `longhaul serve` and passes everything else through. Two workers sync through it, one
# after the other: every blob the second fetches is a cache HIT (nginx's $upstream_cache_status
# in its access log), the server served each blob once, and both hold the same version with
# the same hash, which the ledger published.
# Usage: relay.sh LONGHAUL_BIN SOURCE_DIR
set -euo pipefail
BIN=$1
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || {
  echo "FAIL: nginx is not installed (scripts/install-deps.sh installs nginx-light)" >&2
  exit 1
}
. "$(dirname "$0")/lib.bash"
lh_setup relay
on_exit() { [ -f "$TMP/nginx.pid" ] && kill -QUIT "$(cat "$TMP/nginx.pid")" 2>/dev/null; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$TMP"
ENV=sort:count=3,digits=1
"$BIN" init-model --arch qwen2 --preset tiny --tokenizer chars --seed 3 --out base >/dev/null 2>&1
"$BIN" keygen --out trainer.key >/dev/null 2>&1
lh_serve serve.log port --run run --model base --env $ENV --key trainer.key --steps 12 \
  --prompts 2 --group 4 --max-new 6 --keyframe-every 5 --linger 300
PORT=$(cat port)

NPORT=$(lh_free_port)
USER_LINE=""
[ "$(id -u)" = 0 ] && USER_LINE="user root;"
mkdir -p cache tmp
cat >nginx.conf <<EOF
$USER_LINE
worker_processes 1;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 64; }
http {
  log_format relay '\$request_uri \$upstream_cache_status \$status';
  access_log $TMP/access.log relay;
  client_body_temp_path $TMP/tmp/body;
  proxy_temp_path $TMP/tmp/proxy;
  fastcgi_temp_path $TMP/tmp/fastcgi;
  uwsgi_temp_path $TMP/tmp/uwsgi;
  scgi_temp_path $TMP/tmp/scgi;
  proxy_cache_path $TMP/cache levels=1:2 keys_zone=longhaul:10m max_size=1g inactive=7d use_temp_path=off;
  upstream trainer { server 127.0.0.1:$PORT; keepalive 8; }
  server {
    listen 127.0.0.1:$NPORT;
    client_max_body_size 64m;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    # immutable, content-addressed: cache them for as long as the trainer says
    location /v1/blobs/ {
      proxy_pass http://trainer;
      proxy_cache longhaul;
      proxy_cache_lock on;
      add_header X-Cache-Status \$upstream_cache_status;
    }
    location /v1/manifests/ {
      proxy_pass http://trainer;
      proxy_cache longhaul;
      proxy_cache_valid 200 7d;
      add_header X-Cache-Status \$upstream_cache_status;
    }
    # everything else (signed requests, long polls) goes straight through
    location / {
      proxy_pass http://trainer;
      proxy_buffering off;
      proxy_read_timeout 60s;
    }
  }
}
EOF
"$NGINX" -p "$TMP" -c "$TMP/nginx.conf" >nginx.log 2>&1 || fail "nginx did not start: $(cat nginx.log)"
for _ in $(seq 1 100); do [ -s nginx.pid ] && break; sleep 0.05; done

run_worker() { # name: runs until it holds version 12
  lh_worker "http://127.0.0.1:$NPORT" "$1"
  local pid=$WORKER
  for _ in $(seq 1 600); do
    [ -s "$1/version" ] && [ "$(cut -d' ' -f1 "$1/version")" = 12 ] && break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ "$(cut -d' ' -f1 "$1/version" 2>/dev/null)" = 12 ] || fail "$1 did not reach version 12"
}
run_worker wa
# the trainer has published version 12 and lingers; the second worker syncs from scratch
mark=$(wc -l <access.log)
run_worker wb

# every blob the second worker fetched came from the cache
tail -n +"$((mark + 1))" access.log | grep '^/v1/blobs/' >second.log || fail "the second worker fetched no blob"
misses=$(grep -vc ' HIT ' second.log || true)
[ "$misses" = 0 ] || fail "$misses of the second worker's blob requests were not cache hits: $(grep -v ' HIT ' second.log | head -3)"
hits=$(grep -c ' HIT ' second.log)
# the trainer served each blob once: at most one MISS per blob in the whole log
twice=$(grep '^/v1/blobs/' access.log | grep ' MISS ' | cut -d' ' -f1 | sort | uniq -d | wc -l)
[ "$twice" = 0 ] || fail "$twice blobs were fetched from the trainer more than once"
# and both hold the same version with the same hash, the one the ledger published
[ "$(cat wa/version)" = "$(cat wb/version)" ] || fail "wa holds $(cat wa/version), wb $(cat wb/version)"
read -r v h <wb/version
[ "$(sqlite3 run/ledger.sqlite "SELECT lower(hex(slab_hash)) FROM versions WHERE version = $v")" = "$h" ] ||
  fail "version $v's hash is not the ledger's"
curl -sI "http://127.0.0.1:$NPORT/v1/blobs/$(sqlite3 run/ledger.sqlite "SELECT lower(hex(hash)) FROM blobs LIMIT 1")" |
  grep -qi '^x-cache-status: HIT' || fail "a blob is not served from the cache"
echo "relay.sh: ok (the second worker's $hits blob requests were all cache hits; both hold version $v)"
