"""The HTTP server (waitress), set up so that slow or idle clients cannot starve the API."""

# waitress reads requests on one asynchronous loop and hands a worker thread only a request
# that has fully arrived, so a client trickling its headers costs a socket, not a thread.
# A thread is held only while a request runs, or for as long as an event stream stays open.
# Requests that never wait on the database (/healthz, the event streams: APART_PATHS) have
# a pool of threads of their own, so however many requests wait on a locked or unreachable
# database, and however long, these are not queued behind them. Threads start as requests
# need them and end after IDLE_THREAD_SECONDS without one, so an idle service holds none.
# Each response chunk is sent as soon as it is written, so event streams are live.
# Connections are capped below the open-file limit (a reserve stays for the database, logs
# and media); at the cap the longest idle connection makes room, and while no descriptor is
# free accepting pauses (http_limits.py), so a health check still gets an answer.

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time
from typing import Any

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher

from .. import afresh
from . import limits as http_limits
from .parsing import MAX_BODY
from .routes_service import MAX_EVENT_STREAMS

log = logging.getLogger(__name__)

API_THREADS = 16  # threads for ordinary requests, never taken by event streams
# Paths whose requests do not use the database (docs/api.md says so of /healthz); each
# event stream holds its thread while open (at most MAX_EVENT_STREAMS), and the threads
# beyond those answer health checks and the refusal of a stream too many.
APART_PATHS = frozenset({"/healthz", "/api/v1/events"})
APART_THREADS = MAX_EVENT_STREAMS + 4
CONNECTION_LIMIT = 1000  # open connections at once at most; more wait in the listen backlog
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

    def readable(self) -> bool:
        # Once its client has closed its side (read ahead while a request runs), there is
        # nothing more to read: polling it again would return at once, again and again.
        return bool(self.connected) and super().readable()


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


class _Server(TcpWSGIServer):
    """waitress's server, holding on when descriptors run out (http_limits.Accepting)."""

    channel_class = _Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.guard = http_limits.Accepting()
        super().__init__(*args, **kwargs)

    def readable(self) -> bool:
        """waitress's, without its two log lines each time the limit is reached and left
        (at every connection under a flood): room is made instead."""
        now = time.time()
        if now >= self.next_channel_cleanup:  # type: ignore[has-type]  # waitress's
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        self.guard.refill()
        if not self.accepting or self.guard.paused():
            return False
        if len(self._map) < self.adj.connection_limit:
            return True
        self.guard.make_room(self.active_channels.values(), len(self.active_channels))
        return False

    def handle_accept(self) -> None:
        for _ in range(2):  # the second with the spare descriptor given up
            try:
                accepted = self.accept()
                if accepted is None:
                    return
                conn, addr = accepted
                break
            except OSError as exc:
                if not http_limits.out_of_files(exc):
                    log.warning("accept failed: %s", exc)  # as waitress: the loop goes on
                    return
                open_now = len(self.active_channels)
                self.guard.make_room(self.active_channels.values(), open_now, say=False)
                if not self.guard.give_up_spare():
                    self.guard.pause(exc, open_now)
                    return
        self.guard.accepted()
        try:
            self.set_socket_options(conn)
        except OSError as exc:  # closed by its client already (macOS)
            log.warning("accept failed: %s", exc)
            conn.close()
            return
        self.channel_class(self, conn, self.fix_addr(addr), self.adj, map=self._map)

    def run(self) -> None:
        """waitress's loop, kept going when poll() refuses to watch more descriptors than
        the open-file limit (lowered while the service runs): idle connections are
        closed down to it."""
        while self._map:
            try:
                wasyncore.loop(timeout=self.adj.asyncore_loop_timeout, map=self._map, use_poll=True)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.guard.shed(self.active_channels.values(), len(self._map))
            except (SystemExit, KeyboardInterrupt):
                self.task_dispatcher.shutdown()
                return

    def close(self) -> None:
        super().close()
        self.guard.close()


def start_server(app: Any, host: str, port: int) -> tuple[BaseWSGIServer, int]:
    """Bind now (a port in use fails start-up loudly); returns the server and its port.

    Call ``server.run()`` in a thread to serve and ``stop_server`` to stop.
    """
    limit = http_limits.connection_limit(CONNECTION_LIMIT)
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    # A new image of this process (afresh.py) goes on with the socket the old one bound.
    sock = afresh.inherited_listener(address[:2]) or socket.create_server(
        address[:2], family=family
    )
    adjustments = Adjustments(
        sockets=[sock],
        threads=API_THREADS + APART_THREADS,
        connection_limit=limit.connections,
        channel_timeout=IDLE_TIMEOUT,
        # poll, not select: select cannot watch a descriptor numbered past 1023.
        asyncore_use_poll=True,
        # The API answers 413 itself past MAX_BODY, in JSON. Waitress counts a chunked
        # body's framing too: room for it, so a body of MAX_BODY in small chunks is read.
        max_request_body_size=2 * MAX_BODY,
        # Read a connection while its request runs: a reader that closes its event stream
        # is noticed at once (the stream ends within GONE_CHECK), not only when a second
        # keep-alive fails to be sent (~10 s). A request sent meanwhile waits its turn.
        channel_request_lookahead=1,
        ident="momentry-edge",
    )
    server = _Server(
        app,
        {},
        True,
        sock,
        # create_server's own pool would start all of its threads at once.
        dispatcher=_TwoPools(),
        adj=adjustments,
        bind_socket=False,
        sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()),
    )
    log.info("%s", limit.said())
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
