"""A real HTTP relay on a loopback port in front of the service: passes every request on
as it came, and may hold one until something has happened, as a slow network would."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "host",
    "content-length",
    "content-encoding",
}


class Relay:
    """Relays to ``target``; a request whose path ends with a key of ``holds`` waits for
    that key's callable to return before it is passed on. ``seen``: (method, path)."""

    def __init__(self, target: str) -> None:
        self.holds: dict[str, Callable[[], object]] = {}
        self.seen: list[tuple[str, str]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                relay.seen.append((self.command, self.path))
                for ending, hold in relay.holds.items():
                    if self.path.split("?")[0].endswith(ending):
                        hold()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                reply = httpx.request(
                    self.command, target + self.path, headers=headers, content=body, timeout=30
                )
                self.send_response(reply.status_code)
                for name, value in reply.headers.items():
                    if name.lower() not in HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = do_PUT = do_DELETE = _relay

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    @contextlib.contextmanager
    def running(self) -> Iterator[Relay]:
        thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._http.shutdown()
            self._http.server_close()
            thread.join()
