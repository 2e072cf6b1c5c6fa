"""A real HTTP endpoint on a loopback port that keeps what the service POSTs to it
(job callbacks, operator alerts)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Post:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Answers 500 to the first ``failures`` POSTs, then 200; keeps every POST in ``posts``.

    A POST to a path in ``endless`` is answered 200 with a body that never ends, and one to
    a path in ``trickle`` with a status line whose headers never end (a byte every half
    second, each well within any read timeout), until the sender hangs up; ``hanging``
    holds the paths of those still going."""

    def __init__(self, failures: int = 0) -> None:
        self.posts: list[Post] = []
        self.failures = failures
        self.endless: set[str] = set()
        self.trickle: set[str] = set()
        self.hanging: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append(Post(self.path, dict(self.headers), body))
                if self.path in receiver.endless:
                    self._flood()
                    return
                if self.path in receiver.trickle:
                    self._trickle()
                    return
                self.send_response(500 if len(receiver.posts) <= receiver.failures else 200)
                self.end_headers()

            def _flood(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Connection", "close")  # no length: the body ends at close
                self.end_headers()
                chunk = b"x" * 65536
                try:
                    while True:
                        self.wfile.write(chunk)
                except OSError:
                    pass  # the sender stopped reading and closed the connection

            def _trickle(self) -> None:
                receiver.hanging.add(self.path)
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    for _ in range(600):  # five minutes at most, should the sender wait
                        self.wfile.write(b"a")
                        self.wfile.flush()
                        time.sleep(0.5)
                except OSError:
                    pass  # the sender gave up and closed the connection
                finally:
                    receiver.hanging.discard(self.path)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def receiving(failures: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(failures)
    try:
        yield receiver
    finally:
        receiver.close()
