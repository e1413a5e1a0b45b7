#!/usr/bin/env bash
# Whole-service benchmarks for BENCHMARKS.md (not part of the tests):
#  1. wrk on loopback, side by side in one run: the anchors (a bare axum app
#     with a fixed JSON body; nginx's fixed response when nginx is installed)
#     against the service's filter rejection, L1 hit, Redis hit and SQL load
#     (scripts/http_anchors.py; ROUNDS, DURATION and DEEP=0 tune it).
#  2. a 100,000-request random-id attack (ids 1..10^7) against MariaDB + Redis,
#     with the filter on and off, counting SQL selects (MariaDB Com_select)
#     and Redis keys added.
# Usage: scripts/service_bench.sh   (needs wrk, MariaDB and Redis on localhost;
# nginx-light for the nginx row)
set -euo pipefail
cd "$(dirname "$0")/.."
# BIN=path measures another build (an older commit, side by side).
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p bloomgate-cli
  BIN=target/release/bloomgate
fi
cargo build --release -q -p bloomgate-service --example bare_axum
BARE=target/release/examples/bare_axum
TMP=$(mktemp -d)
PORT=18080
DURATION=${DURATION:-10}
cleanup() { [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

start() { # env assignments...
  env "$@" BLOOMGATE_LISTEN=127.0.0.1:$PORT RUST_LOG=warn "$BIN" serve > "$TMP/serve.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    if curl -s "localhost:$PORT/api/cache/stats" 2>/dev/null | grep -q '"ready":true\|"enabled":false'; then return 0; fi
    sleep 0.2
  done
  echo "server did not become ready"; cat "$TMP/serve.log"; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }


echo "== HTTP paths against a bare axum app and nginx (scripts/http_anchors.py)"
python3 scripts/http_anchors.py "$BIN" "$BARE"

[ "${WRK_ONLY:-}" = 1 ] && exit 0
echo "== 100,000-request random-id attack, MariaDB + Redis"
# The attack tool reads MariaDB's Com_select and Redis's DBSIZE itself;
# PLOTS=dir keeps its SVGs (docs/ for docs/cli.md).
mariadb -uroot -e 'DROP DATABASE IF EXISTS bg_attack; CREATE DATABASE bg_attack'
for mode in on off; do
  prefix="bgattack:$mode:"
  redis-cli --scan --pattern "$prefix*" | xargs -r redis-cli del > /dev/null
  enabled=$([ "$mode" = on ] && echo true || echo false)
  start DATABASE_URL=mysql://root@127.0.0.1:3306/bg_attack REDIS_URL=redis://127.0.0.1:6379/ \
    BLOOMGATE_CACHE__REDIS_PREFIX="$prefix" BLOOMGATE_CACHE__BLOOM_ENABLED=$enabled
  "$BIN" attack --url "http://127.0.0.1:$PORT" --mode random --requests 100000 --concurrency 32 \
    --max-id 10000000 --seed 7 --database-url mysql://root@127.0.0.1:3306/bg_attack \
    --redis-url redis://127.0.0.1:6379/ --plot "${PLOTS:-$TMP}/attack-filter-$mode.svg" > "$TMP/attack.txt"
  stop
  sed "s/^/filter $mode: /" "$TMP/attack.txt"
done
