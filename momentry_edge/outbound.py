"""One POST to someone else's server (a job callback, an operator alert), bounded in time.

httpx's timeouts bound each connect, send and read on its own, so a server that
answers a byte at a time (each within the read timeout) could hold the sending
thread forever. Here the whole exchange, up to the status line and headers, gets
``deadline`` seconds: then its socket is shut down, which wakes the blocked read.
The reply's body is never read: the status is the answer, and a huge or endless
body must neither hold the thread nor fill its memory.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import httpx


class TooSlow(Exception):
    """The server took longer than the deadline to answer."""


def client(timeout: float) -> httpx.Client:
    """A client whose connections are never kept: each POST's socket is its own, so the
    deadline of one cuts no other."""
    return httpx.Client(
        timeout=timeout,
        follow_redirects=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def post(http: httpx.Client, url: str, deadline: float, **request: Any) -> int:
    """POST and return the reply's status; TooSlow past ``deadline`` seconds, else
    whatever httpx raises."""
    sockets: list[socket.socket] = []
    cut = threading.Event()

    def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                sockets.append(sock)

    def shut() -> None:
        cut.set()
        for sock in sockets:
            with contextlib.suppress(OSError):  # closed already: the POST has ended
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(deadline, shut)
    timer.daemon = True
    timer.start()
    try:
        with http.stream("POST", url, extensions={"trace": trace}, **request) as reply:
            return reply.status_code
    except Exception:
        if cut.is_set():
            raise TooSlow(f"no whole answer within {deadline:g} s") from None
        raise
    finally:
        timer.cancel()
