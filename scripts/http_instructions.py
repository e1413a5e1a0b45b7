#!/usr/bin/env python3
"""User-space instructions per HTTP request, counted by callgrind: the bare
axum anchor (crates/bloomgate-service/examples/bare_axum.rs) and the
service's paths (SQLite, no Redis), each server under
`valgrind --tool=callgrind`, loaded by `wrk -t1 -c4`.

Unlike req/s under wrk, which moves by ±20% between rounds on a shared VM,
an instruction count repeats to within a fraction of a percent for the
same binary and load: it is how a change to the request path is judged
before the wrk anchors (scripts/http_anchors.py) are run again. It counts
only user space (hyper, axum, tokio, the service, libc); the kernel's TCP
work, the same for every server, is left out.

For each target: warm up, zero the counters (callgrind_control --zero),
run wrk for DURATION seconds, dump; instructions ÷ wrk's request count.
TOP=n also prints the n functions whose own cost per request grew most
over the bare app's (names as callgrind_annotate gives them).

Usage: scripts/http_instructions.py BIN BARE_AXUM
Environment: DURATION (3), TOP (0).
"""

import collections
import os
import re
import subprocess
import sys
import tempfile
import time

from bench_http import get, machine_header, run, wait

DURATION = int(os.environ.get("DURATION", "3"))
TOP = int(os.environ.get("TOP", "0"))
BIN, BARE = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp()
PROCS = []


def under_callgrind(name, args, env=None):
    out = os.path.join(TMP, f"cg.{name}")
    log = open(os.path.join(TMP, f"{name}.log"), "w")
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *args],
                         env={**os.environ, **(env or {})}, stdout=log, stderr=log)
    PROCS.append(p)
    return p, out


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def totals(dump):
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", dump],
                          capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
    own = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*([\d.]+)%\)\s+(.*)$", line)
        if not m or float(m.group(2)) > 50:
            continue
        where = re.sub(r"\s*\[[^\]]*\]\s*$", "", m.group(3))
        fn = where.split(":", 1)[1] if ":" in where and not where.startswith("<") else where
        own[fn[:110]] += int(m.group(1).replace(",", ""))
    return total, own


def measure(pid, dump, port, path, name):
    url = f"http://127.0.0.1:{port}{path}"
    subprocess.run(["wrk", "-t1", "-c4", "-d1s", url], capture_output=True, check=True)
    control(pid, "--zero")
    out = subprocess.run(["wrk", "-t1", "-c4", f"-d{DURATION}s", url],
                         capture_output=True, text=True, check=True).stdout
    control(pid, f"--dump={name}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    deadline = time.time() + 30
    while True:
        parts = [f for f in os.listdir(TMP) if f.startswith(os.path.basename(dump) + ".")]
        done = [f for f in parts if os.path.getsize(os.path.join(TMP, f)) > 0]
        if len(done) > measure.dumps.get(dump, 0) or time.time() > deadline:
            break
        time.sleep(0.2)
    measure.dumps[dump] = len(done)
    latest = max((os.path.join(TMP, f) for f in done), key=os.path.getmtime)
    total, own = totals(latest)
    return total / requests, {k: v / requests for k, v in own.items()}, requests


measure.dumps = {}


def main():
    machine_header()
    bare, bare_dump = under_callgrind("bare", [BARE, "127.0.0.1:18181"])
    wait("http://127.0.0.1:18181/api/seckill/1", "not_found", secs=300)
    svc, svc_dump = under_callgrind("svc", [BIN, "serve"], {
        "BLOOMGATE_LISTEN": "127.0.0.1:18180",
        "DATABASE_URL": f"sqlite://{TMP}/skus.db",
        "RUST_LOG": "warn",
    })
    wait("http://127.0.0.1:18180/api/cache/stats", '"ready":true', secs=300)
    get("http://127.0.0.1:18180/api/seckill/42")
    rows = [("bare axum", *measure(bare.pid, bare_dump, 18181, "/api/seckill/200100", "bare"))]
    for name, path in [("bloomgate /api/ping", "/api/ping"),
                       ("bloomgate filter rejection", "/api/seckill/200100"),
                       ("bloomgate L1 hit", "/api/seckill/42")]:
        rows.append((name, *measure(svc.pid, svc_dump, 18180, path, name.split()[-1])))
    base = rows[0][1]
    print(f"\nUser-space instructions per request (callgrind; wrk -t1 -c4, {DURATION}s each)")
    print("| target | requests | instructions/request | × bare axum | added |")
    print("|---|---|---|---|---|")
    for name, per, _, n in rows:
        print(f"| {name} | {n:,} | {per:,.0f} | {per / base:.3f} | {per - base:+,.0f} |")
    if TOP:
        for name, _, own, _ in rows[1:]:
            print(f"\n{name}: own instructions per request, most grown over bare axum")
            grown = sorted(own, key=lambda k: -(own[k] - rows[0][2].get(k, 0)))[:TOP]
            for k in grown:
                print(f"{rows[0][2].get(k, 0):8.0f} {own[k]:8.0f} {own[k] - rows[0][2].get(k, 0):+8.0f}  {k}")


run(main, PROCS, TMP, grace=20)
