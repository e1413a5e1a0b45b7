#!/usr/bin/env bash
# The HTTP gate's quickstart, first command: a SQLite users table (u1 to
# u10000), the Python API of "your own" on 127.0.0.1:9000, and bloomgate
# in front of it on 127.0.0.1:8088 (its own API on 127.0.0.1:8080).
# Ctrl-C stops both. Run from anywhere; see examples/gate/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p examples/gate/data
python3 - <<'PY'
import sqlite3
c = sqlite3.connect("examples/gate/data/users.db")
c.execute("CREATE TABLE IF NOT EXISTS users (id VARCHAR(32) PRIMARY KEY, name TEXT NOT NULL)")
if c.execute("SELECT COUNT(*) FROM users").fetchone()[0] == 0:
    c.executemany("INSERT INTO users VALUES (?, ?)", [(f"u{i}", f"user {i}") for i in range(1, 10001)])
c.commit()
PY
python3 examples/gate/upstream.py examples/gate/data/users.db 9000 &
UPSTREAM=$!
trap 'kill $UPSTREAM 2>/dev/null' EXIT
cargo run --release -q -p bloomgate-cli -- serve --config examples/gate/bloomgate.toml
