"""A real HTTP server on a loopback port that answers every request with what a test
sets: a stand-in for a broken proxy or another program on the service's port."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BrokenServer:
    """Answers any path with ``status``, ``body`` and ``headers``, or a method with its
    own body (``answer(..., method="POST")``); a test may change them while it runs."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.headers: dict[str, str] = {}
        self.bodies: dict[str, bytes] = {}  # method -> its own body
        self.url = ""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = server.bodies.get(self.command, server.body)
                self.send_response(server.status)
                headers = {"Content-Type": "application/json"} | server.headers
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def answer(
        self, body: bytes, status: int = 200, method: str | None = None, **headers: str
    ) -> None:
        if method:
            self.bodies[method] = body
            return
        self.body, self.status = body, status
        self.headers = {name.replace("_", "-"): value for name, value in headers.items()}

    @contextlib.contextmanager
    def running(self) -> Iterator[BrokenServer]:
        thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._http.shutdown()
            self._http.server_close()
