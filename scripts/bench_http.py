"""What scripts/http_anchors.py and scripts/http_instructions.py share:
the machine header, polling a server until it answers, and stopping every
process a run started (imported from the scripts' own directory)."""

import re
import shutil
import subprocess
import sys
import time
import urllib.request


def machine_header():
    """lscpu's model name and cache sizes, the heading of every table."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if re.match(r"(Model name|L1d|L2|L3)", line):
            print(re.sub(r"\s+", " ", line))


def get(url, timeout=2):
    """The body at `url`, or an error's body, or "" when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except Exception as e:  # noqa: BLE001 - polled until it answers
        return e.read().decode() if hasattr(e, "read") else ""


def wait(url, needle, secs=120, every=0.2):
    """Polls `url` until its body holds `needle`; exits after `secs`."""
    until = time.time() + secs
    while time.time() < until:
        if needle in get(url, timeout=5):
            return
        time.sleep(every)
    sys.exit(f"{url} did not answer with {needle!r}")


def run(main, procs, tmp, grace=10):
    """Runs `main`, then stops every process in `procs` (terminate, then
    kill after `grace` seconds) and removes `tmp`, however `main` ended."""
    try:
        main()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
