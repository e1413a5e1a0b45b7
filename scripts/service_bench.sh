#!/usr/bin/env bash
# Whole-service benchmarks for BENCHMARKS.md (not part of the tests):
#  1. wrk on loopback against one server: the fixed-JSON ceiling (/api/ping),
#     an L1 hit (/api/seckill/42) and a filter rejection (/api/seckill/200100).
#  2. a 100,000-request random-id attack (ids 1..10^7) against MariaDB + Redis,
#     with the filter on and off, counting SQL selects (MariaDB Com_select)
#     and Redis keys added.
# Usage: scripts/service_bench.sh   (needs wrk, MariaDB and Redis on localhost)
set -euo pipefail
cd "$(dirname "$0")/.."
# BIN=path measures another build (an older commit, side by side).
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p bloomgate-cli
  BIN=target/release/bloomgate
fi
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

rps() { wrk -t2 -c64 -d"${DURATION}s" "http://127.0.0.1:$PORT$1" | awk '/Requests\/sec/ {print $2}'; }

echo "== wrk, SQLite, no Redis, ${DURATION}s each, 2 threads, 64 connections"
start DATABASE_URL="sqlite://$TMP/skus.db"
curl -s -o /dev/null "localhost:$PORT/api/seckill/42"
ceiling=$(rps /api/ping)
l1=$(rps /api/seckill/42)
reject=$(rps /api/seckill/200100)
stop
echo "ping (ceiling)      $ceiling req/s"
echo "L1 hit              $l1 req/s  ($(python3 -c "print(f'{$l1/$ceiling:.2f}')") of ceiling)"
echo "filter rejection    $reject req/s  ($(python3 -c "print(f'{$reject/$ceiling:.2f}')") of ceiling)"

[ "${WRK_ONLY:-}" = 1 ] && exit 0
echo "== 100,000-request random-id attack, MariaDB + Redis"
# The attack tool reads MariaDB's Com_select and Redis's DBSIZE itself;
# PLOTS=dir keeps its SVGs (docs/ for README).
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
