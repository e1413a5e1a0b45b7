#!/usr/bin/env bash
# What the capture triggers cost the application's own writers: 16
# concurrent clients inserting rows into a `users` table, without the
# triggers and with them (installed by `bloomgate capture install`),
# alternating, on PostgreSQL (pgbench) and MariaDB (mysqlslap).
#
#   scripts/capture_writers.sh target/debug/bloomgate [rounds] [seconds]
#
# Uses databases of its own (bg_bench_capture), dropped at the end; the
# servers are the machine's (127.0.0.1:5432 trust, 127.0.0.1:3306 root).
set -euo pipefail
bin=${1:?usage: capture_writers.sh BLOOMGATE_BINARY [rounds] [seconds]}
rounds=${2:-3}
secs=${3:-10}
clients=16
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pg="psql -q -h 127.0.0.1 -U postgres"
my="mysql -h 127.0.0.1 -uroot"

config() { # url
  cat > "$tmp/bloomgate.toml" <<EOF
database_url = "$1"
[[resources]]
name = "users"
table = "users"
key = "id"
key_type = "text"
capture = "triggers"
EOF
}

pg_setup() {
  $pg -d postgres -c "DROP DATABASE IF EXISTS bg_bench_capture WITH (FORCE)" -c "CREATE DATABASE bg_bench_capture"
  $pg -d bg_bench_capture -c "CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL)"
  echo "INSERT INTO users VALUES (md5(random()::text || clock_timestamp()::text), 'n');" > "$tmp/insert.sql"
}
pg_run() { # -> inserts per second
  pgbench -n -h 127.0.0.1 -U postgres -c $clients -j 2 -T "$secs" -f "$tmp/insert.sql" bg_bench_capture 2>/dev/null |
    awk '/^tps/ {print int($3)}'
}
pg_capture() { # install|remove
  config "postgres://postgres@127.0.0.1:5432/bg_bench_capture"
  "$bin" capture "$1" --config "$tmp/bloomgate.toml" --resource users > /dev/null
}

my_setup() {
  $my -e "DROP DATABASE IF EXISTS bg_bench_capture; CREATE DATABASE bg_bench_capture"
  $my bg_bench_capture -e "CREATE TABLE users (id VARCHAR(64) PRIMARY KEY, name VARCHAR(10) NOT NULL)"
}
my_run() { # -> inserts per second
  local n=$((clients * 1500))
  local start end
  start=$(date +%s.%N)
  mysqlslap -h 127.0.0.1 -uroot --create-schema=bg_bench_capture --concurrency=$clients \
    --number-of-queries=$n --query="INSERT INTO users VALUES (UUID(), 'n')" > /dev/null
  end=$(date +%s.%N)
  echo "$n $start $end" | awk '{print int($1 / ($3 - $2))}'
}
my_capture() {
  config "mysql://root@127.0.0.1:3306/bg_bench_capture"
  "$bin" capture "$1" --config "$tmp/bloomgate.toml" --resource users > /dev/null
}

lscpu | grep -E 'Model name|L1d|L2|L3'
for db in pg my; do
  ${db}_setup
  without=()
  with=()
  for _ in $(seq "$rounds"); do
    without+=("$(${db}_run)")
    ${db}_capture install
    with+=("$(${db}_run)")
    ${db}_capture remove
  done
  printf '%s: inserts/s without capture: %s; with: %s\n' "$db" "${without[*]}" "${with[*]}"
  printf '%s\n' "${without[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' > "$tmp/w0"
  printf '%s\n' "${with[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' > "$tmp/w1"
  awk -v a="$(cat "$tmp/w0")" -v b="$(cat "$tmp/w1")" -v db="$db" \
    'BEGIN {printf "%s: medians %d without, %d with: %.2fx\n", db, a, b, b / a}'
done
$pg -d postgres -c "DROP DATABASE IF EXISTS bg_bench_capture WITH (FORCE)"
$my -e "DROP DATABASE IF EXISTS bg_bench_capture"
