#!/usr/bin/env bash
# Two bloomgate builds and the deep anchor on the Redis hit, in one run:
# the setting of ../shared/anchors/deepceiling/deep.py (MariaDB database
# bg_pair seeded with 200,000 SKUs, Redis warm, an L1 of one entry, random
# ids 1..200000 with seed 7), measured three ways:
#   1. req/s, wrk -t2 -c64 rounds of DUR s, the three in turn, ROUNDS
#      rounds in each order (median of the round ratios new/old);
#   2. server CPU µs per request in the same rounds (utime+stime from
#      /proc/<pid>/stat around each round, over wrk's request count);
#   3. user-space instructions per request under callgrind: 5,000
#      keep-alive reads by one curl after 400 untimed (repeatable to
#      a hundredth of a percent, unlike 1 and 2 on a shared VM).
# Usage: scripts/redis_hit_pair.sh OLD_BIN NEW_BIN DEEPCEILING_BIN
# Environment: ROUNDS (6), DUR (3). Needs wrk, valgrind, mariadb, redis-cli.
set -euo pipefail
OLD=$1; NEW=$2; DEEP=$3; ROUNDS=${ROUNDS:-6}; DUR=${DUR:-3}
db=mysql://root@127.0.0.1:3306/bg_pair; prefix=bgpair:
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
lscpu | grep -E 'Model name|L1d|L2|L3'

mariadb -uroot -e 'DROP DATABASE IF EXISTS bg_pair; CREATE DATABASE bg_pair'
"$NEW" seed --count 200000 --database-url "$db" >/dev/null
redis-cli --scan --pattern "$prefix*" | xargs -r -n 1000 redis-cli del >/dev/null

# serve RUNNER PORT BIN: a bloomgate with deep.py's settings (RUNNER
# prefixes the command: nothing, or valgrind).
serve() {
  local runner=$1 port=$2 bin=$3
  RUST_LOG=warn DATABASE_URL=$db BLOOMGATE_CACHE__L1_CAPACITY=1 \
    BLOOMGATE_CACHE__REDIS_PREFIX=$prefix REDIS_URL=redis://127.0.0.1:6379/ \
    BLOOMGATE_LISTEN=127.0.0.1:$port $runner "$bin" serve >"$tmp/$port.log" 2>&1 &
  pids+=($!); echo $! >"$tmp/$port.pid"
  for _ in $(seq 1 1200); do
    curl -s "127.0.0.1:$port/api/cache/stats" | grep -q '"ready":true' && break; sleep 0.5
  done
  curl -s -X POST -H 'content-type: application/json' -d '{"limit":200000}' \
    "127.0.0.1:$port/api/cache/warm" >/dev/null
}
anchor() { # RUNNER PORT
  LISTEN=127.0.0.1:$2 DATABASE_URL=$db PREFIX=$prefix $1 "$DEEP" >"$tmp/$2.log" 2>&1 &
  pids+=($!); echo $! >"$tmp/$2.pid"
  for _ in $(seq 1 1200); do curl -s "127.0.0.1:$2/redis/42" | grep -q '"id"' && break; sleep 0.5; done
}
path_of() { if [ "$1" = 18403 ] || [ "$1" = 18413 ]; then echo /redis/; else echo /api/seckill/; fi; }
for port in 18401 18402 18403 18411 18412 18413; do
  printf 'math.randomseed(7)\nrequest = function() return wrk.format(nil, "%s" .. math.random(1, 200000)) end\n' \
    "$(path_of $port)" >"$tmp/$port.lua"
done

echo "== req/s and server CPU µs per request: old 18401, new 18402, anchor 18403"
serve "" 18401 "$OLD"; serve "" 18402 "$NEW"; anchor "" 18403
tck=$(getconf CLK_TCK)
round() { # ports in order
  local line="" p pid a n b
  for p in "$@"; do
    pid=$(cat "$tmp/$p.pid"); a=$(awk '{print $14+$15}' "/proc/$pid/stat")
    out=$(wrk -t2 -c64 -d"${DUR}s" -s "$tmp/$p.lua" "http://127.0.0.1:$p/")
    b=$(awk '{print $14+$15}' "/proc/$pid/stat")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    line="$line $p=$(awk '/Requests\/sec/ {print $2}' <<<"$out"):$(python3 -c "print(round(($b-$a)/$tck*1e6/$n,2))")"
  done
  echo "$line"
}
for _ in $(seq 1 "$ROUNDS"); do round 18401 18402 18403; done | tee "$tmp/rounds"
for _ in $(seq 1 "$ROUNDS"); do round 18402 18401 18403; done | tee -a "$tmp/rounds"
python3 - "$tmp/rounds" <<'EOF'
import statistics, sys
rows = [dict((k, tuple(map(float, v.split(":")))) for k, v in (x.split("=") for x in l.split())) for l in open(sys.argv[1])]
med = lambda f: statistics.median(f(r) for r in rows)
print(f"req/s median: old {med(lambda r: r['18401'][0]):,.0f}, new {med(lambda r: r['18402'][0]):,.0f}, anchor {med(lambda r: r['18403'][0]):,.0f}")
print(f"req/s new/old {med(lambda r: r['18402'][0] / r['18401'][0]):.3f}, new/anchor {med(lambda r: r['18402'][0] / r['18403'][0]):.3f}, old/anchor {med(lambda r: r['18401'][0] / r['18403'][0]):.3f} (medians of round ratios)")
print(f"CPU µs/request median: old {med(lambda r: r['18401'][1]):.2f}, new {med(lambda r: r['18402'][1]):.2f}, anchor {med(lambda r: r['18403'][1]):.2f}; new/old {med(lambda r: r['18402'][1] / r['18401'][1]):.3f}")
EOF
for p in 18401 18402 18403; do kill "$(cat "$tmp/$p.pid")"; done

echo "== user-space instructions per request (callgrind)"
python3 -c "
import random
random.seed(7)
for _ in range(5400): print('url = \"http://127.0.0.1:PORT/PATH%d\"\noutput = /dev/null' % random.randint(1, 200000))
" >"$tmp/urls"
count() { # NAME PORT [BIN]: a bloomgate BIN, or the anchor
  local name=$1 port=$2 bin=${3:-}
  local cg="valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$tmp/cg.$name"
  if [ -n "$bin" ]; then serve "$cg" "$port" "$bin"; else anchor "$cg" "$port"; fi
  local pid; pid=$(cat "$tmp/$port.pid")
  local path; path=$(path_of "$port")
  sed -e "s/PORT/$port/" -e "s#/PATH#$path#" "$tmp/urls" >"$tmp/u.$port"
  head -800 "$tmp/u.$port" | curl -s -K -
  callgrind_control -i on "$pid" >/dev/null 2>&1
  tail -n +801 "$tmp/u.$port" | curl -s -K -
  callgrind_control -i off "$pid" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 -c "
import glob, re
t = sum(int(m.group(1)) for f in glob.glob('$tmp/cg.$name*') for m in [re.search(r'^totals: (\d+)', open(f).read(), re.M)] if m)
print('$name', t // 5000, 'instructions per request')"
}
count old 18411 "$OLD"
count new 18412 "$NEW"
count anchor 18413
