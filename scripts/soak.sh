#!/usr/bin/env bash
# A bounded soak (minutes, not in CI): one server on SQLite (+ Redis when
# REDIS_URL is set), a random-id attack with the filter on for MINUTES
# minutes, and the server's resident memory sampled every 10 s. Memory must
# stay flat: the filter, not the attack, decides what is kept.
#   MINUTES=5 scripts/soak.sh
#   MINUTES=3 BIN=/tmp/older/bloomgate scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-5}
# BIN=path runs another build (an earlier one, to compare) without building.
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p bloomgate-cli
  BIN=target/release/bloomgate
fi
BIN=$(realpath "$BIN")
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$TMP" && exec env BLOOMGATE_LISTEN=127.0.0.1:$PORT RUST_LOG=warn "$BIN" serve >"$TMP/serve.log" 2>&1) &
PID=$!
ATTACK=
trap 'kill $PID ${ATTACK:-} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 1 600); do
  curl -s "localhost:$PORT/api/cache/stats" 2>/dev/null | grep -q '"ready":true' && break
  sleep 0.2
done
SERVER=$PID
rss() { awk '/VmRSS/ {print $2}' "/proc/$SERVER/status"; }
echo "minute  rss_kib  requests_rejected  sql_queries"
"$BIN" attack --url "http://127.0.0.1:$PORT" --concurrency 32 \
  --max-id 10000000 --duration $((MINUTES * 60)) >"$TMP/attack.log" 2>&1 &
ATTACK=$!
end=$((SECONDS + MINUTES * 60))
while [ $SECONDS -lt $end ] && kill -0 $ATTACK 2>/dev/null; do
  stats=$(curl -s "localhost:$PORT/api/cache/stats")
  rejected=$(echo "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bloom"]["rejected"])')
  queries=$(echo "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sql"]["queries"])')
  printf "%6.1f  %7s  %17s  %11s\n" "$(echo "($SECONDS) / 60" | bc -l)" "$(rss)" "$rejected" "$queries"
  sleep 10
done
wait $ATTACK || true
tail -5 "$TMP/attack.log"
