"""The HTTP server (waitress), set up so that slow or idle clients cannot starve the API.

waitress reads requests on one asynchronous loop and hands a worker thread only a request
that has fully arrived, so a client trickling its headers costs a socket, not a thread.
A thread is held only while a request runs, or for as long as an event stream stays open.
Requests that never wait on the database (/healthz, the event streams: APART_PATHS) have
a pool of threads of their own, so however many requests wait on a locked or unreachable
database, and however long, these are not queued behind them. Threads start as requests
need them and end after IDLE_THREAD_SECONDS without one, so an idle service holds none.
Each response chunk is sent as soon as it is written, so event streams are live.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
from typing import Any

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask, ThreadedTaskDispatcher

from .api import MAX_BODY, MAX_EVENT_STREAMS

API_THREADS = 16  # threads for ordinary requests, never taken by event streams
# Paths whose requests do not use the database (docs/api.md says so of /healthz); each
# event stream holds its thread while open (at most MAX_EVENT_STREAMS), and the threads
# beyond those answer health checks and the refusal of a stream too many.
APART_PATHS = frozenset({"/healthz", "/api/v1/events"})
APART_THREADS = MAX_EVENT_STREAMS + 4
CONNECTION_LIMIT = 1000  # open connections at once; more wait in the listen backlog
REQUEST_DEADLINE = 30.0  # seconds a client has to send one whole request (headers + body)
IDLE_TIMEOUT = 60  # seconds a connection may stay silent between requests
IDLE_THREAD_SECONDS = 10.0  # a request thread without a request this long ends


class _JsonErrorTask(ErrorTask):
    """waitress's own refusals (bad framing, headers too large) in API.md's error shape."""

    def execute(self) -> None:
        error = self.request.error
        # A request the server cannot parse is the client's mistake: never a 5xx for it.
        status = error.code if error.code < 500 else 400
        code = "payload_too_large" if status == 413 else "bad_request"
        message = f"{error.reason}: {error.body}"
        if status == 413:  # waitress's limit has room for chunk framing: say the API's
            message = f"request body is larger than {MAX_BODY} bytes"
        body = json.dumps({"success": False, "error": {"code": code, "message": message}})
        self.status = f"{status} {error.reason if status == error.code else 'Bad Request'}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body.encode())


class _Channel(HTTPChannel):
    """One client connection; closed when its request trickles in past REQUEST_DEADLINE."""

    error_task_class = _JsonErrorTask
    request_began = 0.0

    def received(self, data: bytes) -> bool:
        now = time.monotonic()
        if self.request is None:
            self.request_began = now
        elif now - self.request_began > REQUEST_DEADLINE:
            self.will_close = True
            return False
        return super().received(data)


class _ThreadsOnDemand(ThreadedTaskDispatcher):
    """waitress's pool of request threads, each started when a request finds none waiting
    (up to ``most``), each ending after IDLE_THREAD_SECONDS without a request.

    An idle thread ends by its own timed wait, under the pool's lock, never by the pool's
    stop count: that count ends whichever threads look next, busy ones included, which
    could leave a request queued with no thread to take it."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most
        self.waiting = 0  # threads waiting for a request

    def set_thread_count(self, count: int) -> None:
        """Only to stop (shutdown sets 0): threads are started by add_task."""
        if count == 0:
            super().set_thread_count(0)

    def add_task(self, task: Any) -> None:
        with self.lock:
            self.queue.append(task)
            self.queue_cv.notify()
            if len(self.queue) > self.waiting and len(self.threads) < self.most:
                number = min(set(range(len(self.threads) + 1)) - self.threads)
                self.threads.add(number)
                self.active_count += 1  # as the base class counts a thread it starts
                self.start_new_thread(self.handler_thread, number)

    def handler_thread(self, thread_no: int) -> None:
        while True:
            with self.lock:
                while not self.queue and self.stop_count == 0:
                    self.active_count -= 1
                    self.waiting += 1
                    woken = self.queue_cv.wait(IDLE_THREAD_SECONDS)
                    self.waiting -= 1
                    self.active_count += 1
                    if not woken and not self.queue and self.stop_count == 0:
                        self.active_count -= 1
                        self.threads.discard(thread_no)
                        return
                if self.stop_count > 0:  # the server is stopping
                    self.active_count -= 1
                    self.stop_count -= 1
                    self.threads.discard(thread_no)
                    self.thread_exit_cv.notify()
                    return
                task = self.queue.popleft()
            try:
                task.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", task)


class _TwoPools:
    """The request threads: APART_PATHS' requests on a pool of their own, the rest on one of
    API_THREADS. Routed one request at a time: waitress serves a connection's requests
    in order, each as a task of its own (``channel.requests[0]`` is the one it serves)."""

    def __init__(self) -> None:
        self.ordinary = _ThreadsOnDemand(API_THREADS)
        self.apart = _ThreadsOnDemand(APART_THREADS)

    def add_task(self, channel: HTTPChannel) -> None:
        request = channel.requests[0]
        apart = request.error is None and getattr(request, "path", None) in APART_PATHS
        (self.apart if apart else self.ordinary).add_task(channel)

    def set_thread_count(self, count: int) -> None:
        for pool in (self.ordinary, self.apart):
            pool.set_thread_count(count)

    def shutdown(self, cancel_pending: bool = True, timeout: float = 5) -> bool:
        deadline = time.monotonic() + timeout
        self.set_thread_count(0)  # both pools stop at once; then wait for each
        return all(
            [
                pool.shutdown(cancel_pending, max(0.0, deadline - time.monotonic()))
                for pool in (self.ordinary, self.apart)
            ]
        )


def start_server(app: Any, host: str, port: int) -> tuple[BaseWSGIServer, int]:
    """Bind now (a port in use fails start-up loudly); returns the server and its port.

    Call ``server.run()`` in a thread to serve and ``stop_server`` to stop.
    """
    _allow_open_files(CONNECTION_LIMIT + 256)  # + the database, logs and media files
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.create_server(address[:2], family=family)
    server = create_server(
        app,
        sockets=[sock],
        threads=API_THREADS + APART_THREADS,
        # create_server's own pool would start all of its threads at once.
        _dispatcher=_TwoPools(),
        connection_limit=CONNECTION_LIMIT,
        channel_timeout=IDLE_TIMEOUT,
        # The API answers 413 itself past MAX_BODY, in JSON. Waitress counts a chunked
        # body's framing too: room for it, so a body of MAX_BODY in small chunks is read.
        max_request_body_size=2 * MAX_BODY,
        ident="momentry-edge",
    )
    server.channel_class = _Channel
    return server, sock.getsockname()[1]


def stop_server(server: BaseWSGIServer, loop: threading.Thread | None = None) -> None:
    """Stop accepting, let running requests finish (up to 5 s), then close every connection.

    ``loop``: the thread running ``server.run()``. Nothing is closed while it may still be
    selecting on it (that select would fail with EBADF): the sockets leave its map first,
    the trigger wakes it, and its loop ends on the empty map before they are closed."""
    server.del_channel()  # no more accepting; the socket stays open until the loop ends
    server.pull_trigger()
    server.task_dispatcher.shutdown(timeout=5)  # the loop still sends their answers
    connections = dict(server._map)
    server._map.clear()
    server.pull_trigger()
    if loop is not None:
        loop.join(timeout=2)
    server.close()  # the listening socket and the trigger
    wasyncore.close_all(connections)  # EBADF (the trigger, closed already) is ignored


def _allow_open_files(wanted: int) -> None:
    """Raise the soft open-file limit (256 under launchd) so many clients fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    with contextlib.suppress(OSError, ValueError):  # else keep the limit the system gave
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
