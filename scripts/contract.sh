#!/usr/bin/env bash
# Checks the running service against its own OpenAPI contract with
# schemathesis: no 5xx, every status and body as documented. Starts
# `bloomgate serve` on SQLite in a temporary directory on a free loopback
# port, runs a bounded number of examples per operation, stops the server.
#   scripts/contract.sh [path-to-bloomgate-binary] [max-examples]
# (positive_data_acceptance is skipped: SKU bodies have cross-field rules,
# end after start and sale price at most the list price, that JSON Schema
# cannot state, so some schema-valid bodies are rightly refused with 400.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${CARGO_TARGET_DIR:-target}/debug/bloomgate}
examples=${2:-50}
if ! command -v schemathesis >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "contract: installing pip"
    apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "contract: installing schemathesis from PyPI"
  python3 -m pip install --quiet --break-system-packages schemathesis 2>/dev/null \
    || python3 -m pip install --quiet schemathesis
fi
[ -x "$bin" ] || cargo build -p bloomgate-cli
bin=$(realpath "$bin")
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$dir" && exec env -u DATABASE_URL -u REDIS_URL BLOOMGATE_LISTEN="127.0.0.1:$port" \
  BLOOMGATE_SEED_IF_EMPTY=2000 "$bin" serve >"$dir/serve.log" 2>&1) &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$dir"' EXIT
up=
for _ in $(seq 1 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
if [ -z "$up" ]; then
  echo "contract: $bin serve did not listen on $port; its log:" >&2
  cat "$dir/serve.log" >&2
  exit 1
fi
schemathesis run "http://127.0.0.1:$port/openapi.json" \
  --max-examples "$examples" --seed 20261130 \
  --exclude-checks positive_data_acceptance \
  --no-color
if grep -q "panicked" "$dir/serve.log"; then
  echo "contract: the server panicked:" >&2
  grep -A5 panicked "$dir/serve.log" >&2
  exit 1
fi
