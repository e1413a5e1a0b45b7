#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 60 s each),
# starting from the seeds in fuzz/seeds/<target>. Needs nightly Rust and
# cargo-fuzz (`cargo install cargo-fuzz`). A crash leaves its input in
# fuzz/artifacts/<target>/; turn it into a regression test before fixing.
#   scripts/fuzz.sh [seconds-per-target] [target…]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(snapshot_decode parse_id json_bodies resp_frame)
fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log="corpus/$t.log"
  echo "== $t for ${secs}s"
  if ! cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    echo "!! $t failed: see fuzz/$log and fuzz/artifacts/$t/"
    status=1
  fi
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|Done [0-9]+ runs" "$log" || true
done
exit $status
