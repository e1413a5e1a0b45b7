#!/usr/bin/env python3
"""The service's HTTP paths against the limit of this machine, in one run.

Anchors: a bare axum app answering a fixed JSON body
(crates/bloomgate-service/examples/bare_axum.rs) and, when it is installed,
nginx returning a fixed body (2 workers). The service's filter rejection and
L1 hit (SQLite, no Redis), for the SKUs (integer keys) and for a `users`
resource of text keys (seed 002's `u1001`) in the same process, then its
deeper levels: Redis hits and SQL loads (MariaDB, an L1 of one entry,
random existing ids), all side by side.

Every target gets `wrk -t2 -c64` for DURATION seconds, targets alternating,
ROUNDS rounds, each round starting one target later (so no target always
runs first, or always after the same one); the table shows the median
req/s, the ratio of medians to the bare axum app, the median of the
per-round ratios, the p99 latency, the server's own CPU time per request
(/proc utime+stime over the run) and the median of its per-round ratios
to the bare app's. A second bare axum process is measured as a target of
its own: how far it strays from 1.00 is this machine's noise.

With TLS=1, a third table puts the Redis hit and the SQL load over TLS
beside the same over plain TCP: one redis-server of the script's own with a
plain port and a TLS port (a certificate made with openssl), and the
machine's PostgreSQL (ssl = on) with sslmode=disable against sslmode=require.

Usage: scripts/http_anchors.py BIN BARE_AXUM   (from scripts/service_bench.sh)
Environment: ROUNDS (7), DURATION (3), DEEP=0 to skip Redis and SQL, TLS=1
for the TLS table (TLS_ONLY=1: that table alone).
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_http import get, machine_header, run, wait

ROUNDS = int(os.environ.get("ROUNDS", "7"))
DURATION = int(os.environ.get("DURATION", "3"))
DEEP = os.environ.get("DEEP", "1") != "0"
TLS = os.environ.get("TLS", "0") != "0"
TLS_ONLY = os.environ.get("TLS_ONLY", "0") != "0"
BIN, BARE = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp()
PROCS = []

RANDOM_IDS = """
math.randomseed(7)
request = function()
  return wrk.format(nil, "%s" .. math.random(1, 200000))
end
"""


def spawn(args, env=None, log="server.log"):
    out = open(os.path.join(TMP, log), "w")
    p = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=out, stderr=out)
    PROCS.append(p)
    return p


def serve(port, env, args=()):
    env = {
        **env,
        "BLOOMGATE_LISTEN": f"127.0.0.1:{port}",
        "RUST_LOG": "warn",
    }
    p = spawn([BIN, "serve", *args], env, f"serve-{port}.log")
    wait(f"http://127.0.0.1:{port}/api/cache/stats", '"ready":true')
    return p


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def wrk(port, path, pid, script=None):
    args = ["wrk", "-t2", "-c64", f"-d{DURATION}s", "--latency"]
    if script:
        args += ["-s", script]
    before = cpu_ticks(pid)
    out = subprocess.run(args + [f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, check=True).stdout
    ticks = cpu_ticks(pid) - before
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)]
    hz = os.sysconf("SC_CLK_TCK")
    return rps, float(p99.group(1)) * scale, ticks / hz * 1e6 / max(requests, 1)


def table(title, targets, runs):
    print(f"\n{title}: wrk -t2 -c64, {DURATION}s each, {ROUNDS} rounds alternating")
    print("| target | req/s (median) | × bare axum | median of round ratios "
          "| p99 ms | server CPU µs/request | CPU × bare (median of round ratios) |")
    print("|---|---|---|---|---|---|---|")
    bare = runs["bare axum"]
    base = statistics.median(r[0] for r in bare)
    for name, _ in targets:
        r = runs[name]
        rps = statistics.median(x[0] for x in r)
        ratios = [x[0] / b[0] for x, b in zip(r, bare)]
        cpu = [x[2] / b[2] for x, b in zip(r, bare)]
        print(f"| {name} | {rps:,.0f} | {rps / base:.2f} | {statistics.median(ratios):.2f} "
              f"| {statistics.median(x[1] for x in r):.2f} | {statistics.median(x[2] for x in r):.1f} "
              f"| {statistics.median(cpu):.2f} |")


def measure(title, targets):
    runs = {name: [] for name, _ in targets}
    for i in range(ROUNDS):
        k = i % len(targets)
        for name, (port, path, pid, script) in targets[k:] + targets[:k]:
            runs[name].append(wrk(port, path, pid, script))
    table(title, targets, runs)


def warm(port, prefix_note):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/cache/warm", method="POST",
                                 data=b'{"limit":200000}',
                                 headers={"content-type": "application/json"})
    warmed = json.loads(urllib.request.urlopen(req, timeout=600).read())
    # The Redis row measures hits only if the warm filled Redis.
    if warmed.get("redis_written") != 200000:
        sys.exit(f"the warm did not fill Redis ({prefix_note}): {warmed}")


def tls_table(anchors, script):
    """The Redis hit and the SQL load over TLS and over plain TCP."""
    ssl = os.path.join(TMP, "tls")
    os.makedirs(ssl)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(["openssl", "req", "-x509", "-days", "1", *ec, "-keyout", "ca.key",
                    "-out", "ca.pem", "-subj", "/CN=bench CA"], cwd=ssl, check=True,
                   capture_output=True)
    subprocess.run(["openssl", "req", *ec, "-keyout", "key.pem", "-out", "cert.csr",
                    "-subj", "/CN=127.0.0.1"], cwd=ssl, check=True, capture_output=True)
    with open(os.path.join(ssl, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    subprocess.run(["openssl", "x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey",
                    "ca.key", "-CAcreateserial", "-days", "1", "-out", "cert.pem",
                    "-extfile", "ext"], cwd=ssl, check=True, capture_output=True)
    spawn(["redis-server", "--port", "16379", "--tls-port", "16380", "--bind", "127.0.0.1",
           "--tls-cert-file", f"{ssl}/cert.pem", "--tls-key-file", f"{ssl}/key.pem",
           "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", ssl],
          log="redis-tls.log")
    time.sleep(0.5)
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc",
                    "DROP DATABASE IF EXISTS bg_anchors_tls WITH (FORCE)"], check=True)
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc",
                    "CREATE DATABASE bg_anchors_tls"], check=True)
    pg = "postgres://postgres@127.0.0.1:5432/bg_anchors_tls"
    rows = []
    for i, (name, redis_url) in enumerate([("plain", "redis://127.0.0.1:16379/"),
                                           ("TLS", "rediss://127.0.0.1:16380/")]):
        port = 18090 + i
        env = {"DATABASE_URL": f"{pg}?sslmode=disable", "REDIS_URL": redis_url,
               "BLOOMGATE_CACHE__REDIS_PREFIX": f"bganchors:{name}:",
               "BLOOMGATE_CACHE__L1_CAPACITY": "1"}
        if redis_url.startswith("rediss"):
            env["BLOOMGATE_REDIS_TLS_CA"] = f"{ssl}/ca.pem"
        p = serve(port, env)
        warm(port, name)
        rows.append((f"bloomgate Redis hit, {name}", (port, "/", p.pid, script)))
    for i, mode in enumerate(["disable", "require"]):
        port = 18092 + i
        p = serve(port, {"DATABASE_URL": f"{pg}?sslmode={mode}",
                         "BLOOMGATE_CACHE__L1_CAPACITY": "1"})
        rows.append((f"bloomgate SQL load, PostgreSQL sslmode={mode}", (port, "/", p.pid, script)))
    measure("Over TLS and over plain TCP (Redis 7 of the script's own, the machine's "
            "PostgreSQL; an L1 of one entry, random ids of 200,000)", anchors + rows)


def main():
    machine_header()
    bare = spawn([BARE, "127.0.0.1:18081"], log="bare.log")
    wait("http://127.0.0.1:18081/api/seckill/1", "not_found")
    again = spawn([BARE, "127.0.0.1:18085"], log="bare-again.log")
    wait("http://127.0.0.1:18085/api/seckill/1", "not_found")
    anchors = [("bare axum", (18081, "/api/seckill/200100", bare.pid, None)),
               ("bare axum, a second process", (18085, "/api/seckill/200100", again.pid, None))]
    if shutil.which("nginx"):
        conf = os.path.join(TMP, "nginx.conf")
        os.makedirs(os.path.join(TMP, "logs"), exist_ok=True)
        with open(conf, "w") as f:
            f.write(f"""worker_processes 2; daemon off; error_log {TMP}/logs/error.log warn;
pid {TMP}/nginx.pid; events {{ worker_connections 1024; }}
http {{ access_log off; server {{ listen 127.0.0.1:18082;
  location / {{ default_type application/json; return 200 '{{"code":404,"error":"not_found"}}'; }} }} }}
""")
        ngx = spawn(["nginx", "-c", conf, "-p", TMP], log="nginx.log")
        wait("http://127.0.0.1:18082/", "not_found")
        # The workers do the work: count the master's children.
        time.sleep(0.3)
        workers = subprocess.run(["pgrep", "-P", str(ngx.pid)], capture_output=True,
                                 text=True).stdout.split()
        anchors.append(("nginx (fixed body, 2 workers)", (18082, "/", int(workers[0]), None)))
        print("(nginx's CPU column counts one of its two workers)")
    else:
        print("(nginx not installed: apt-get install nginx-light for its row)")

    script = os.path.join(TMP, "random.lua")
    with open(script, "w") as f:
        f.write(RANDOM_IDS % "/api/seckill/")
    if TLS_ONLY:
        tls_table(anchors, script)
        return
    # A text-key resource beside the SKUs: 200,000 users u000001.. in the
    # same SQLite file.
    import sqlite3
    with sqlite3.connect(f"{TMP}/skus.db") as db:
        db.execute("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL)")
        db.executemany("INSERT INTO users VALUES (?, ?)",
                       ((f"u{i:06}", f"user {i}") for i in range(1, 200_001)))
    conf = os.path.join(TMP, "users.toml")
    with open(conf, "w") as f:
        # The demo SKU table beside `users`: both are measured.
        f.write('demo = true\n[[resources]]\nname = "users"\ntable = "users"\nkey = "id"\n'
                'key_type = "text"\nbloom_expected = 200000\n')
    sqlite = serve(18080, {"DATABASE_URL": f"sqlite://{TMP}/skus.db"}, ["--config", conf])
    wait("http://127.0.0.1:18080/api/cache/stats", '"key_type":"text","filter":{"enabled":true,"ready":true')
    get("http://127.0.0.1:18080/api/seckill/42")
    get("http://127.0.0.1:18080/api/users/u000042")
    # The text key refused: one the filter says no to (checked below).
    refused = "x200100"
    before = json.loads(get("http://127.0.0.1:18080/api/cache/stats"))
    get(f"http://127.0.0.1:18080/api/users/{refused}")
    after = json.loads(get("http://127.0.0.1:18080/api/cache/stats"))
    users = lambda s: s["resources"]["users"]["filter"]["rejected"]
    assert users(after) == users(before) + 1, "pick another refused key"
    measure("Filter rejection and L1 hit (SQLite, no Redis)", anchors + [
        ("bloomgate /api/ping", (18080, "/api/ping", sqlite.pid, None)),
        ("bloomgate filter rejection", (18080, "/api/seckill/200100", sqlite.pid, None)),
        ("bloomgate L1 hit", (18080, "/api/seckill/42", sqlite.pid, None)),
        ("bloomgate text key rejection", (18080, f"/api/users/{refused}", sqlite.pid, None)),
        ("bloomgate text key L1 hit", (18080, "/api/users/u000042", sqlite.pid, None)),
    ])
    sqlite.terminate()
    sqlite.wait()
    if TLS:
        tls_table(anchors, script)
    if not DEEP:
        return
    subprocess.run(["mariadb", "-uroot", "-e",
                    "DROP DATABASE IF EXISTS bg_anchors; CREATE DATABASE bg_anchors"], check=True)
    db = "mysql://root@127.0.0.1:3306/bg_anchors?ssl-mode=DISABLED"
    prefix = "bganchors:"
    keys = subprocess.run(["redis-cli", "--scan", "--pattern", f"{prefix}*"],
                          capture_output=True, text=True).stdout.split()
    for i in range(0, len(keys), 1000):
        subprocess.run(["redis-cli", "del", *keys[i:i + 1000]], capture_output=True)
    redis = serve(18083, {"DATABASE_URL": db, "REDIS_URL": "redis://127.0.0.1:6379/",
                          "BLOOMGATE_CACHE__REDIS_PREFIX": prefix,
                          "BLOOMGATE_CACHE__L1_CAPACITY": "1"})
    warm(18083, prefix)
    sql = serve(18084, {"DATABASE_URL": db, "BLOOMGATE_CACHE__L1_CAPACITY": "1"})
    # The deeper anchors: the bare app doing one Redis GET of the keys the
    # warm wrote, or one SQL point read of the same table, per request.
    io = spawn([BARE, "127.0.0.1:18086", "--redis", "redis://127.0.0.1:6379/", prefix,
                "--sql", db], log="bare-io.log")
    wait("http://127.0.0.1:18086/sql/42", '"id":42')
    wait("http://127.0.0.1:18086/redis/42", '"id":42')
    scripts = {}
    for name in ("redis", "sql"):
        scripts[name] = os.path.join(TMP, f"random-{name}.lua")
        with open(scripts[name], "w") as f:
            f.write(RANDOM_IDS % f"/{name}/")
    measure("Deeper levels (MariaDB, an L1 of one entry, random ids of 200,000)", anchors + [
        ("bare axum + one Redis GET", (18086, "/", io.pid, scripts["redis"])),
        ("bloomgate Redis hit", (18083, "/", redis.pid, script)),
        ("bare axum + one SQL SELECT", (18086, "/", io.pid, scripts["sql"])),
        ("bloomgate SQL load", (18084, "/", sql.pid, script)),
    ])


run(main, PROCS, TMP, grace=10)
