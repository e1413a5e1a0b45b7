#!/usr/bin/env bash
# A/B of two bloomgate binaries on seed 000's filter rejection and L1 hit
# (SQLite, defaults), alternating wrk -t2 -c64 runs; prints req/s per run.
set -euo pipefail
OLD=$1; NEW=$2; ROUNDS=${ROUNDS:-5}; DUR=${DUR:-3}
tmp=$(mktemp -d)
start() { # bin port dir
  mkdir -p "$3"
  (cd "$3" && BLOOMGATE_LISTEN=127.0.0.1:$2 "$1" serve >/dev/null 2>&1 &)
  for _ in $(seq 1 1500); do
    if curl -s "localhost:$2/readyz" | grep -q '"ready":true'; then return; fi
    sleep 0.2
  done
  echo "no ready on $2" >&2; exit 1
}
start "$OLD" 18181 "$tmp/old"
start "$NEW" 18182 "$tmp/new"
curl -s localhost:18181/api/seckill/42 >/dev/null; curl -s localhost:18182/api/seckill/42 >/dev/null
for path in /api/seckill/200100 /api/seckill/42; do
  for r in $(seq 1 "$ROUNDS"); do
    for port in 18181 18182; do
      rps=$(wrk -t2 -c64 -d${DUR}s "http://127.0.0.1:$port$path" | awk '/Requests\/sec/ {print $2}')
      echo "$path $port round $r $rps"
    done
  done
done
pkill -f "$tmp" || true
fuser -k 18181/tcp 18182/tcp >/dev/null 2>&1 || true
rm -rf "$tmp"
