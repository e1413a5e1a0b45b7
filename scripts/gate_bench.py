#!/usr/bin/env python3
"""The HTTP gate (docs/http-gate.md) against the proxies people run, in one run.

One upstream for all: nginx answering a fixed JSON body (1 worker). In
front of it, side by side:
  * bloomgate's reverse proxy (`[gate]`, release build, a SQLite `users`
    table of 1,000 keys, one route);
  * nginx `proxy_pass` with an upstream keep-alive pool (2 workers);
  * HAProxy (2 threads, `http-reuse always`);
  * nginx `auth_request` asking bloomgate's `/api/gate/check`, then
    `proxy_pass` (the docs' config, docs/gate/nginx.conf);
  * the upstream straight (what no proxy costs).
Forwarded requests are `GET /api/profiles/u1` (a present key). Rejected
requests (`GET /api/profiles/nobody<n>`, random absent keys) are measured
against the bare axum app's fixed response
(crates/bloomgate-service/examples/bare_axum.rs).

Every target gets `wrk -t2 -c64` for DURATION seconds, targets alternating,
ROUNDS rounds, each round starting one target later; the tables show the
median req/s, the median of the per-round ratios to the anchor, and the
median p99. Then 1 GiB is downloaded and uploaded through the gate and
through nginx (curl, timed), with the gate's peak RSS (VmHWM).

The bare hyper proxy (crates/bloomgate-service/examples/bare_proxy.rs:
hyper's server and hyper-util's pooled client, nothing else) is a row of
its own: the floor of a proxy on the crates the gate is built on; it runs
twice, on one multi-threaded runtime (the service's shape) and with one
single-threaded runtime per core (`THREADS`, nginx's worker model).

With OLD_BIN set (another build of bloomgate), its gate runs beside the
first with the same config, in the same rounds: the pair's ratio is the
change's cost. The server CPU per request (user and system time of the
process over the run, divided by the requests wrk counted) is given for
the processes started here (the gates and the bare proxies).

Usage: scripts/gate_bench.py BIN BARE_AXUM BARE_PROXY
Environment: ROUNDS (5), DURATION (3), STREAM=0 to skip the 1 GiB rows,
OLD_BIN (a second bloomgate to pair with BIN).
"""

import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

from bench_http import machine_header, run, wait

ROUNDS = int(os.environ.get("ROUNDS", "5"))
DURATION = int(os.environ.get("DURATION", "3"))
STREAM = os.environ.get("STREAM", "1") != "0"
BIN, BARE, BARE_PROXY_BIN = sys.argv[1], sys.argv[2], sys.argv[3]
OLD_BIN = os.environ.get("OLD_BIN")
TMP = tempfile.mkdtemp()
PROCS = []
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

UP, GATE, SVC, NGINX, HAPROXY, AUTH, BARE_PORT, BARE_PROXY, BARE_THREADS = (
    18101, 18102, 18103, 18104, 18105, 18106, 18107, 18108, 18109)
OLD_GATE, OLD_SVC = 18110, 18111

ABSENT = """
math.randomseed(7)
request = function()
  return wrk.format(nil, "/api/profiles/nobody" .. math.random(1, 100000000))
end
"""


def start(args, log, **env):
    p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                         env={**os.environ, **env})
    PROCS.append(p)
    return p


def nginx(name, body):
    conf = os.path.join(TMP, f"{name}.conf")
    with open(conf, "w") as f:
        f.write(f"""worker_processes {2 if name != 'upstream' else 1};
pid {TMP}/{name}.pid;
error_log {TMP}/{name}.err;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {TMP}/{name}-body;
  proxy_temp_path {TMP}/{name}-proxy;
  fastcgi_temp_path {TMP}/{name}-fcgi;
  uwsgi_temp_path {TMP}/{name}-uwsgi;
  scgi_temp_path {TMP}/{name}-scgi;
  {body}
}}
""")
    start(["nginx", "-p", TMP, "-c", conf, "-g", "daemon off;"], os.path.join(TMP, f"{name}.log"))


def wrk(url, script=None):
    args = ["wrk", "-t2", "-c64", f"-d{DURATION}s", "--latency", url]
    if script:
        args[1:1] = ["-s", script]
    out = subprocess.run(args, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, float(p99.group(1)) * scale, int(non2xx.group(1)) if non2xx else 0


def cpu_ticks(pid):
    """User and system time of `pid` (and its threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def table(title, targets, anchor):
    """`targets`: name -> (url, script[, pid]). Alternating rounds."""
    names = list(targets)
    rps = {n: [] for n in names}
    p99 = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            url, script, *pid = targets[n]
            before = cpu_ticks(pid[0]) if pid else None
            a, b, _ = wrk(url, script)
            if pid:
                cpu[n].append((cpu_ticks(pid[0]) - before) * TICK_US / (a * DURATION))
            rps[n].append(a)
            p99[n].append(b)
    print(f"\n### {title}\n")
    print(f"| target | req/s (median) | ratio to {anchor} (median of rounds) | p99 ms (median) "
          f"| server CPU µs/req (median) |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        ratios = [x / y for x, y in zip(rps[n], rps[anchor])]
        us = f"{statistics.median(cpu[n]):.2f}" if cpu[n] else ""
        print(f"| {n} | {statistics.median(rps[n]):,.0f} | {statistics.median(ratios):.2f} | "
              f"{statistics.median(p99[n]):.2f} | {us} |")
    return rps


def vmhwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return 0


def stream(name, port):
    """1 GiB down, then up, through `port`; seconds each."""
    t = time.time()
    got = subprocess.run(["curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}",
                          f"http://127.0.0.1:{port}/big"], check=True, capture_output=True, text=True)
    assert int(got.stdout) == 1 << 30, f"{name}: downloaded {got.stdout} bytes"
    down = time.time() - t
    t = time.time()
    subprocess.run(f"head -c 1073741824 /dev/zero | curl -sf -o /dev/null -T - "
                   f"http://127.0.0.1:{port}/upload", shell=True, check=True)
    up = time.time() - t
    return down, up


def main():
    print(f"`scripts/gate_bench.py` (ROUNDS={ROUNDS}, DURATION={DURATION}); machine:\n")
    machine_header()
    # The upstream: a fixed body, a 1 GiB body, and an upload sink.
    # nginx's workers run as nobody: the directory and file must be theirs to read.
    os.chmod(TMP, 0o755)
    big = os.path.join(TMP, "big")
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    os.chmod(big, 0o644)
    nginx("upstream", f"""server {{ listen 127.0.0.1:{UP};
    location / {{ default_type application/json; return 200 '{{"ok":true}}'; }}
    location = /big {{ alias {big}; }}
    location = /upload {{ client_max_body_size 0; client_body_buffer_size 1m;
                          proxy_request_buffering off; return 200 'ok'; }}
  }}""")
    # bloomgate: users u1..u1000, a gate on GATE, the check on SVC.
    db = os.path.join(TMP, "users.db")
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE users (id VARCHAR(32) PRIMARY KEY, name TEXT NOT NULL)")
    c.executemany("INSERT INTO users VALUES (?, ?)", [(f"u{i}", f"user {i}") for i in range(1, 1001)])
    c.commit()
    c.close()
    conf = os.path.join(TMP, "bloomgate.toml")
    with open(conf, "w") as f:
        f.write(f"""listen = "127.0.0.1:{SVC}"
database_url = "sqlite://{db}"
[[resources]]
name = "users"
table = "users"
key = "id"
key_type = "text"
[gate]
listen = "127.0.0.1:{GATE}"
upstream = "http://127.0.0.1:{UP}"
[[gate.routes]]
path = "/api/profiles/{{key}}"
resource = "users"
""")
    gate = start([BIN, "serve", "--config", conf], os.path.join(TMP, "gate.log"), RUST_LOG="warn")
    old = None
    if OLD_BIN:
        old_dir = os.path.join(TMP, "old")
        os.makedirs(old_dir)
        old_conf = os.path.join(old_dir, "bloomgate.toml")
        old_db = os.path.join(old_dir, "users.db")
        with open(db, "rb") as f, open(old_db, "wb") as g:
            g.write(f.read())
        with open(conf) as f, open(old_conf, "w") as g:
            g.write(f.read().replace(f"127.0.0.1:{SVC}", f"127.0.0.1:{OLD_SVC}")
                    .replace(f"127.0.0.1:{GATE}", f"127.0.0.1:{OLD_GATE}")
                    .replace(db, old_db))
        old = subprocess.Popen([OLD_BIN, "serve", "--config", old_conf], cwd=old_dir,
                               stdout=open(os.path.join(TMP, "old.log"), "w"),
                               stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"})
        PROCS.append(old)
    start([BARE, f"127.0.0.1:{BARE_PORT}"], os.path.join(TMP, "bare.log"))
    bare_proxy = start([BARE_PROXY_BIN, f"127.0.0.1:{BARE_PROXY}", f"http://127.0.0.1:{UP}"],
                       os.path.join(TMP, "bare_proxy.log"))
    # The same, one single-threaded runtime per core (nginx's worker model).
    bare_threads = start([BARE_PROXY_BIN, f"127.0.0.1:{BARE_THREADS}", f"http://127.0.0.1:{UP}"],
                         os.path.join(TMP, "bare_threads.log"), THREADS=str(os.cpu_count() or 2))
    nginx("proxy", f"""upstream api {{ server 127.0.0.1:{UP}; keepalive 64; }}
  server {{ listen 127.0.0.1:{NGINX};
    location / {{ proxy_pass http://api; proxy_http_version 1.1; proxy_set_header Connection "";
                 client_max_body_size 0; proxy_request_buffering off; proxy_max_temp_file_size 0; }}
  }}""")
    site = open(os.path.join(ROOT, "docs/gate/nginx.conf")).read()
    site = (site.replace("127.0.0.1:8080", f"127.0.0.1:{SVC}")
                .replace("127.0.0.1:9000", f"127.0.0.1:{UP}")
                .replace("127.0.0.1:8000", f"127.0.0.1:{AUTH}"))
    nginx("auth", site)
    hcfg = os.path.join(TMP, "haproxy.cfg")
    with open(hcfg, "w") as f:
        f.write(f"""global
  nbthread 2
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend fe
  bind 127.0.0.1:{HAPROXY}
  default_backend be
backend be
  server up 127.0.0.1:{UP}
""")
    start(["haproxy", "-f", hcfg], os.path.join(TMP, "haproxy.log"))
    wait(f"http://127.0.0.1:{SVC}/readyz", '"ready":true', 120)
    if old:
        wait(f"http://127.0.0.1:{OLD_SVC}/readyz", '"ready":true', 120)
    for port in (GATE, NGINX, HAPROXY, AUTH, UP, BARE_PROXY, BARE_THREADS) + ((OLD_GATE,) if old else ()):
        wait(f"http://127.0.0.1:{port}/api/profiles/u1", "ok", 30)
    wait(f"http://127.0.0.1:{BARE_PORT}/api/seckill/1", "not_found", 30)
    script = os.path.join(TMP, "absent.lua")
    with open(script, "w") as f:
        f.write(ABSENT)
    present = "/api/profiles/u1"
    forwarded = {
        "nginx proxy_pass": (f"http://127.0.0.1:{NGINX}{present}", None),
        "bloomgate gate": (f"http://127.0.0.1:{GATE}{present}", None, gate.pid),
        "HAProxy": (f"http://127.0.0.1:{HAPROXY}{present}", None),
        "bare hyper proxy, one multi-threaded runtime":
            (f"http://127.0.0.1:{BARE_PROXY}{present}", None, bare_proxy.pid),
        "bare hyper proxy, a runtime per core":
            (f"http://127.0.0.1:{BARE_THREADS}{present}", None, bare_threads.pid),
        "nginx auth_request + /api/gate/check": (f"http://127.0.0.1:{AUTH}{present}", None),
        "upstream straight": (f"http://127.0.0.1:{UP}{present}", None),
    }
    rejected = {
        "bare axum": (f"http://127.0.0.1:{BARE_PORT}/api/seckill/1", None),
        "bloomgate gate": (f"http://127.0.0.1:{GATE}/", script, gate.pid),
        "nginx auth_request + /api/gate/check": (f"http://127.0.0.1:{AUTH}/", script),
    }
    if old:
        forwarded["bloomgate gate, OLD_BIN"] = (f"http://127.0.0.1:{OLD_GATE}{present}", None, old.pid)
        rejected["bloomgate gate, OLD_BIN"] = (f"http://127.0.0.1:{OLD_GATE}/", script, old.pid)
    for title, targets, anchor in (
        ("Forwarded requests (a present key), against nginx proxy_pass", forwarded, "nginx proxy_pass"),
        ("Rejected requests (random absent keys), against the bare axum fixed response",
         rejected, "bare axum"),
    ):
        rps = table(title, targets, anchor)
        if old:
            pair = [n / o for n, o in zip(rps["bloomgate gate"], rps["bloomgate gate, OLD_BIN"])]
            print(f"\nBIN / OLD_BIN req/s, median of rounds: {statistics.median(pair):.3f} "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in pair)})")
    if STREAM:
        print("\n### 1 GiB through the proxy (curl, one transfer each)\n")
        print("| through | download s | upload s |")
        print("|---|---:|---:|")
        for name, port in (("nginx proxy_pass", NGINX), ("bloomgate gate", GATE)):
            down, up = stream(name, port)
            print(f"| {name} | {down:.2f} | {up:.2f} |")
        print(f"\nbloomgate's peak RSS (VmHWM) after the transfers: {vmhwm(gate.pid)} MiB")


run(main, PROCS, TMP)
