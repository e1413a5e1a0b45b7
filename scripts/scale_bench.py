#!/usr/bin/env python3
"""Scale benchmark of issue 32: start-up, rebuild and restart of one large
table against the database client's own scan of its key column, in the
same run. Seed the table first with scripts/seed_big.sh.

    python3 scripts/scale_bench.py target/release/bloomgate mariadb bg_big [skus|users]

For `skus` the service guards the default SKU table; for `users` it guards
the text-key `users` resource (bloom_expected sized for the rows either
way). Each instance: a fresh Redis prefix, a snapshot file in a temporary
directory, SQL statement timeouts as shipped (the read path's 2 s).
ROUNDS (3) rounds, each a client scan then a first start and a restart;
medians (the ratio is the median of the rounds' ratios), the largest peak
RSS. Reports one JSON line:
  client_scan_s    the client's `SELECT key FROM table` piped to wc -l
  ready_s          process start to GET /readyz = 200
  rebuild_s        the rebuild's own duration (stats last_rebuild_ms)
  rebuild_ratio    rebuild_s / client_scan_s
  peak_rss_mb      VmHWM of the first instance
  snapshot_mb      the snapshot file saved at shutdown
  restart_ready_s  second start, from the snapshot: start to ready
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def client_scan(backend, db, table):
    if backend == "mariadb":
        cmd = f"mariadb -uroot -h127.0.0.1 -P3306 -N -e 'SELECT id FROM {table}' {db} | wc -l"
    else:
        cmd = f"psql -At -h127.0.0.1 -p5432 -U postgres -d {db} -c 'SELECT id FROM {table}' | wc -l"
    t = time.monotonic()
    out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True).stdout
    return time.monotonic() - t, int(out.strip())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def config(backend, db, table, rows, snap, prefix, port):
    url = (f"mysql://root@127.0.0.1:3306/{db}" if backend == "mariadb"
           else f"postgres://postgres@127.0.0.1:5432/{db}")
    expected = int(rows * 1.1)
    lines = [
        f'listen = "127.0.0.1:{port}"',
        f'database_url = "{url}"',
        'redis_url = "redis://127.0.0.1:6379/"',
        "seed_if_empty = 0",
        "[cache]",
        f'redis_prefix = "{prefix}"',
    ]
    if table == "skus":
        lines += [f"bloom_expected = {expected}", f'bloom_snapshot_path = "{snap}"']
    else:
        lines += [
            # The SKU table of the same database is not built: the users
            # scan runs alone.
            "bloom_build_on_start = false",
            "[[resources]]",
            'name = "users"',
            'table = "users"',
            'key = "id"',
            'key_type = "text"',
            'columns = ["name"]',
            f"bloom_expected = {expected}",
            f'bloom_snapshot_path = "{snap}"',
        ]
    return "\n".join(lines) + "\n"


def ready(port, table):
    status, _ = get(f"http://127.0.0.1:{port}/readyz")
    if status != 404:
        return status == 200
    # A build without /readyz (the baseline): the filter's own flag.
    status, body = get(f"http://127.0.0.1:{port}/api/cache/stats", timeout=30)
    if status != 200:
        return False
    s = json.loads(body)
    return (s["bloom"] if table == "skus" else s["resources"][table]["bloom"])["ready"]


def run_instance(binary, cfg_path, port, log, table):
    t = time.monotonic()
    p = subprocess.Popen([binary, "serve", "--config", cfg_path], stdout=log, stderr=log)
    while True:
        if p.poll() is not None:
            raise SystemExit(f"bloomgate exited with {p.returncode}; see {log.name}")
        if ready(port, table):
            return p, time.monotonic() - t
        time.sleep(0.05)


def stats(port):
    _, body = get(f"http://127.0.0.1:{port}/api/cache/stats", timeout=30)
    return json.loads(body)


def one_round(binary, backend, db, table, rows, tmp, r):
    """A client scan, then a first start (scan) and a restart (snapshot)."""
    scan_s, counted = client_scan(backend, db, table)
    assert counted == rows, (counted, rows)
    snap = os.path.join(tmp, f"filter-{r}.bgf")
    prefix = f"bench:scale:{os.getpid()}:{r}:"
    port = free_port()
    cfg_path = os.path.join(tmp, f"config-{r}.toml")
    with open(cfg_path, "w") as f:
        f.write(config(backend, db, table, rows, snap, prefix, port))
    log = open(os.path.join(tmp, f"serve-{r}.log"), "w")
    p, ready_s = run_instance(binary, cfg_path, port, log, table)
    s = stats(port)
    gate = s["bloom"] if table == "skus" else s["resources"][table]["bloom"]
    out = {
        "client_scan_s": scan_s, "ready_s": ready_s,
        "rebuild_s": gate["last_rebuild_ms"] / 1000, "added": gate["added"],
        "full_counts": s["sql"]["full_counts"], "peak_rss_mb": peak_rss_mb(p.pid),
    }
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    out["snapshot_mb"] = os.path.getsize(snap) / 2**20
    p, out["restart_ready_s"] = run_instance(binary, cfg_path, port, log, table)
    s2 = stats(port)
    gate2 = s2["bloom"] if table == "skus" else s2["resources"][table]["bloom"]
    out["restored"] = gate2["snapshot_restores"]
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    log.close()
    subprocess.run(f"redis-cli --scan --pattern '{prefix}*' | xargs -r redis-cli del",
                   shell=True, capture_output=True)
    return out


def main():
    binary, backend, db = sys.argv[1:4]
    table = sys.argv[4] if len(sys.argv) > 4 else "skus"
    rounds = int(os.environ.get("ROUNDS", "3"))
    _, rows = client_scan(backend, db, table)
    tmp = tempfile.mkdtemp(prefix="bg-scale-")
    runs = [one_round(binary, backend, db, table, rows, tmp, r) for r in range(rounds)]
    med = lambda k: statistics.median(x[k] for x in runs)
    result = {
        "backend": backend, "table": table, "rows": rows, "rounds": rounds,
        "added": runs[0]["added"], "full_counts": max(x["full_counts"] for x in runs),
        "client_scan_s": round(med("client_scan_s"), 2), "ready_s": round(med("ready_s"), 2),
        "rebuild_s": round(med("rebuild_s"), 2),
        "rebuild_ratio": round(statistics.median(x["rebuild_s"] / x["client_scan_s"] for x in runs), 2),
        "peak_rss_mb": round(max(x["peak_rss_mb"] for x in runs), 1),
        "snapshot_mb": round(runs[0]["snapshot_mb"], 1),
        "restart_ready_s": round(med("restart_ready_s"), 2),
        "restored": min(x["restored"] for x in runs),
    }
    print(json.dumps(result))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
