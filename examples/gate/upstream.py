#!/usr/bin/env python3
"""A tiny API of "your own", in Python, for the HTTP gate's quickstart.

GET /api/profiles/{id} reads the SQLite `users` table and answers the row
as JSON, or 404. GET /api/cache/stats (the path `bloomgate attack` reads)
and GET /requests answer this server's own counters: how many profile
requests reached it, and how many found a row. Behind the gate, the
random ids of an attack never arrive: only real keys (and the filter's
rare false positives) do.

Usage: upstream.py DB_PATH [PORT]   (default port 9000)
"""

import json
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

DB = sys.argv[1]
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 9000
COUNTS = {"profile_requests": 0, "found": 0, "missing": 0}
LOCK = threading.Lock()
LOCAL = threading.local()


def db():
    if not hasattr(LOCAL, "conn"):
        LOCAL.conn = sqlite3.connect(DB, timeout=5)
    return LOCAL.conn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/requests", "/api/cache/stats"):
            with LOCK:
                return self.answer(200, {"upstream": dict(COUNTS)})
        prefix = "/api/profiles/"
        if not path.startswith(prefix):
            return self.answer(404, {"error": "no such route"})
        key = unquote(path[len(prefix):])
        row = db().execute("SELECT id, name FROM users WHERE id = ?", (key,)).fetchone()
        with LOCK:
            COUNTS["profile_requests"] += 1
            COUNTS["found" if row else "missing"] += 1
        if row:
            return self.answer(200, {"id": row[0], "name": row[1]})
        return self.answer(404, {"error": "not_found"})

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
