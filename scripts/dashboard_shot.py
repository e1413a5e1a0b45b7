#!/usr/bin/env python3
"""Screenshot of /dashboard after it has run for a while in real time (the
the operations guide's picture, docs/operate.md). Chromium's --screenshot flag shoots at load time, so
this drives headless Chromium over the DevTools protocol instead.

Usage: scripts/dashboard_shot.py URL OUT.png [SECONDS]
Needs chromium (Debian) and websocket-client (PyPI).
"""
import base64
import json
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


def main():
    url, out = sys.argv[1], sys.argv[2]
    wait = float(sys.argv[3]) if len(sys.argv) > 3 else 15
    port = 9333
    with tempfile.TemporaryDirectory() as profile:
        chrome = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
             "--window-size=1280,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
                    break
                except OSError:
                    time.sleep(0.1)
            page = next(p for p in pages if p["type"] == "page")
            ws = websocket.create_connection(page["webSocketDebuggerUrl"])
            ids = iter(range(1, 1000))

            def call(method, **params):
                n = next(ids)
                ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while True:
                    msg = json.loads(ws.recv())
                    if msg.get("id") == n:
                        return msg.get("result", {})

            call("Page.enable")
            call("Emulation.setDeviceMetricsOverride", width=1280, height=1000,
                 deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            time.sleep(wait)
            shot = call("Page.captureScreenshot", format="png")
            with open(out, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            ws.close()
        finally:
            chrome.kill()
            chrome.wait()


if __name__ == "__main__":
    main()
