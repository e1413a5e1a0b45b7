#!/usr/bin/env python3
"""Sizing with the defaults (issue 43 item 13): a resource over a large
MariaDB table, configured with nothing but its name, table, key and key
type (so `bloom_expected` is its default, 100,000). Reports when `/readyz`
first answers 200, and how many of 2,000 random absent ids (fixed seed)
pass the filter then and 10 s later (a pass is a request the filter did
not reject: `resources.items.filter.rejected` in the stats).

    mariadb -e "CREATE DATABASE sizing; CREATE TABLE sizing.items
      (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(32) NOT NULL)"
    mariadb sizing -e "INSERT INTO items SELECT seq, CONCAT('n', seq)
      FROM seq_1_to_10000000; ANALYZE TABLE items"
    python3 scripts/sizing_defaults.py target/release/bloomgate sizing 10000000
"""

import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BASE = "http://127.0.0.1:18090"


def get(path):
    try:
        with urllib.request.urlopen(BASE + path, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return None, str(e).encode()


def filter_stats():
    stats = json.loads(get("/api/cache/stats")[1])
    return stats["resources"]["items"]["filter"]


def probe(label, rows):
    rng = random.Random(7)
    ids = [rng.randrange(rows + 1, 2**62) for _ in range(2000)]
    before = filter_stats()["rejected"]
    for i in ids:
        get(f"/api/items/{i}")
    f = filter_stats()
    passed = 2000 - (f["rejected"] - before)
    shown = {k: f.get(k) for k in ("capacity", "added", "expected_fpr", "ready")}
    print(f"{label}: {passed} of 2000 absent ids passed the filter; {json.dumps(shown)}", flush=True)


def main():
    binary, database, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as cfg:
        cfg.write(
            f'database_url = "mysql://root@127.0.0.1:3306/{database}"\n'
            'listen = "127.0.0.1:18090"\n\n'
            '[[resources]]\nname = "items"\ntable = "items"\nkey = "id"\nkey_type = "int"\n'
        )
    server = subprocess.Popen([binary, "serve", "--config", cfg.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = time.time()
        while get("/readyz")[0] != 200:
            if server.poll() is not None:
                sys.exit("the service exited before it was ready")
            time.sleep(0.2)
        print(f"/readyz 200 after {time.time() - started:.1f} s", flush=True)
        probe("at readiness", rows)
        time.sleep(10)
        probe("10 s later", rows)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
