#!/usr/bin/env bash
# BF.EXISTS over bloomgate's RESP listener against the machine's own
# redis-server answering GET, same redis-benchmark load, alternating rounds;
# then one key per call and 100 keys per call over HTTP (`exists`) and
# RESP (BF.EXISTS / BF.MEXISTS). Prints markdown tables for BENCHMARKS.md.
#   scripts/bench_resp.sh [target/release/bloomgate] [rounds] [requests]
set -euo pipefail
bin=${1:-target/release/bloomgate}
rounds=${2:-3}
n=${3:-400000}
work=$(mktemp -d)
resp_port=16390 http_port=18090 redis_port=16391
cleanup() {
  [ -n "${svc:-}" ] && kill "$svc" 2>/dev/null || true
  redis-cli -p $redis_port shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
cat >"$work/c.toml" <<EOF
listen = "127.0.0.1:$http_port"
database_url = "sqlite://$work/b.db"
seed_if_empty = 200000
[resp]
listen = "127.0.0.1:$resp_port"
EOF
mkdir -p "$work"
RUST_LOG=warn "$bin" serve --config "$work/c.toml" >"$work/log" 2>&1 &
svc=$!
redis-server --port $redis_port --save "" --appendonly no --daemonize yes --logfile "$work/redis.log"
for _ in $(seq 1 120); do
  if curl -sf "127.0.0.1:$http_port/readyz" >/dev/null; then break; fi
  sleep 0.5
done
redis-cli -p $redis_port set key value >/dev/null
[ "$(redis-cli -p $resp_port BF.EXISTS skus 42)" = 1 ]
[ "$(redis-cli -p $resp_port BF.EXISTS skus 900000)" = 0 ]

# One redis-benchmark run: "rps p50 p99" from its CSV line.
bench() {
  local port=$1 pipe=$2
  shift 2
  redis-benchmark -p "$port" -c 50 -n "$n" -P "$pipe" --csv "$@" 2>/dev/null |
    tail -1 | tr -d '"' | awk -F, '{print $2, $5, $7}'
}

echo "## redis-benchmark -c 50 -n $n, $rounds alternating rounds (median)"
echo
echo "| load | server | requests/s | p50 ms | p99 ms |"
echo "|---|---|---:|---:|---:|"
for pipe in 1 16; do
  for who in ours redis; do : >"$work/$who.$pipe"; done
  for _ in $(seq 1 "$rounds"); do
    bench $resp_port $pipe BF.EXISTS skus 42 >>"$work/ours.$pipe"
    bench $redis_port $pipe GET key >>"$work/redis.$pipe"
  done
  for who in ours redis; do
    label=$([ $who = ours ] && echo "bloomgate BF.EXISTS skus 42" || echo "redis-server GET key")
    sort -n "$work/$who.$pipe" | awk -v l="$label" -v p="$pipe" \
      '{a[NR]=$0} END {split(a[int((NR+1)/2)], m, " "); printf "| -P %s | %s | %.0f | %.3f | %.3f |\n", p, l, m[1], m[2], m[3]}'
  done
  # Each round's ratio (bloomgate / redis-server), then their median.
  paste -d' ' "$work/ours.$pipe" "$work/redis.$pipe" | awk '{print $1 / $4}' | sort -n |
    awk -v p="$pipe" '{a[NR]=$1} END {printf "| -P %s | ratio, median of rounds | %.2fx | | |\n", p, a[int((NR+1)/2)]}'
done

echo
echo "## Keys per second: HTTP exists against RESP (one client process each; wrk -t2 -c50 -d10s, redis-benchmark -c 50)"
echo
keys100=$(seq 1 100 | paste -sd, -)
printf '{"keys":[42]}' >"$work/one.json"
printf '{"keys":[%s]}' "$keys100" >"$work/many.json"
cat >"$work/post.lua" <<'EOF'
local f = io.open(os.getenv("BODY"), "r")
wrk.method = "POST"
wrk.body = f:read("*a")
wrk.headers["Content-Type"] = "application/json"
EOF
echo "| call | keys/call | calls/s | keys/s |"
echo "|---|---:|---:|---:|"
for spec in "one.json 1" "many.json 100"; do
  set -- $spec
  rps=$(BODY="$work/$1" wrk -t2 -c50 -d10s -s "$work/post.lua" "http://127.0.0.1:$http_port/api/skus/exists" |
    awk '/Requests\/sec/ {print $2}')
  printf '| HTTP POST /api/skus/exists | %s | %.0f | %.0f |\n' "$2" "$rps" "$(echo "$rps * $2" | bc)"
done
one=$(bench $resp_port 1 BF.EXISTS skus 42 | awk '{print $1}')
printf '| RESP BF.EXISTS | 1 | %.0f | %.0f |\n' "$one" "$one"
# shellcheck disable=SC2046
many=$(bench $resp_port 1 BF.MEXISTS skus $(seq 1 100) | awk '{print $1}')
printf '| RESP BF.MEXISTS | 100 | %.0f | %.0f |\n' "$many" "$(echo "$many * 100" | bc)"
