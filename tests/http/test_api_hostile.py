"""Hostile clients: slow sockets, odd ids, huge numbers, deep or chunked bodies, no token.

None of them freezes the API or gets anything but a JSON 4xx for its mistake.
"""

from __future__ import annotations

import json
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

import httpx
import psutil
import pytest
from conftest import wait_for
from test_api_errors import assert_error

from momentry_edge.http import server as http_server
from momentry_edge.http.routes_service import MAX_EVENT_STREAMS

SLOW_SOCKETS = 48


def _address(svc) -> tuple[str, int]:
    url = httpx.URL(svc.url)
    return url.host, url.port


@contextmanager
def slow_clients(svc, count: int) -> Iterator[None]:
    """``count`` connections sending ``GET /healthz`` one byte a second, until the block ends."""
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 600 + b"\r\n\r\n"
    stop = threading.Event()
    socks = [socket.create_connection(_address(svc), timeout=5) for _ in range(count)]

    def trickle() -> None:
        for byte in request[:-4]:  # never finishes the request
            for sock in socks:
                # The server may close a client this slow; that is its right.
                with suppress(OSError):
                    sock.send(bytes([byte]))
            if stop.wait(1.0):
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        for sock in socks:
            sock.close()


class EventStream:
    """A raw-socket reader of /api/v1/events."""

    def __init__(self, svc, token: str | None = None) -> None:
        self.sock = socket.create_connection(_address(svc), timeout=15)
        token = svc.token if token is None else token
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n".encode())
        self.buffer = b""

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"stream closed before {marker!r}; got {self.buffer!r}")
            self.buffer += chunk
        return self.buffer

    def close(self) -> None:
        self.sock.close()


def test_slow_clients_and_open_event_streams_do_not_starve_the_api(start_service):
    svc = start_service(service={"event_keepalive": 0.1})
    quick = httpx.Client(base_url=svc.url, timeout=10, headers=svc.client.headers)
    with ExitStack() as stack:
        streams = []
        for _ in range(MAX_EVENT_STREAMS):
            stream = EventStream(svc)
            stack.callback(stream.close)
            stream.read_until(b": connected")
            streams.append(stream)
        stack.enter_context(slow_clients(svc, SLOW_SOCKETS))

        # Every slot for streams is taken and dozens of clients trickle their headers:
        # the API still answers everyone else, and refuses one stream too many in JSON.
        for _ in range(3):
            assert quick.get("/healthz").json()["status"] == "ok"
            assert quick.get("/api/v1/queue/status").json()["paused"] is False
        assert_error(quick.get("/api/v1/events"), 503, "busy", "event streams")

        # The open streams are live: a change reaches every one of them.
        assert svc.call("POST", "/api/v1/queue/pause")["paused"] is True
        for stream in streams:
            assert b'"type": "queue.paused"' in stream.read_until(b"queue.paused")
            assert b"Transfer-Encoding: chunked" in stream.buffer

    # Readers that went away give their slots back (at their stream's next keep-alive).
    def stream_accepted() -> bool:
        with quick.stream("GET", "/api/v1/events") as reply:
            return reply.status_code == 200

    wait_for(stream_accepted, timeout=60, interval=1)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the server, not storage
def test_a_reader_that_leaves_frees_its_stream_without_waiting_for_a_keep_alive(start_service):
    svc = start_service()

    def streams() -> int:
        for line in svc.client.get("/metrics").text.splitlines():
            if line.startswith("momentry_event_streams "):
                return int(float(line.split()[1]))
        raise AssertionError("no momentry_event_streams in /metrics")

    stream = EventStream(svc)
    try:
        stream.read_until(b": connected")
        assert streams() == 1
        # The reader is gone (its side closed). Writes to it still went through, so the
        # stream was found out only when one failed: it kept its slot, sending
        # keep-alives, for as long as the socket took them. It ends now, and says so.
        stream.sock.shutdown(socket.SHUT_WR)
        stream.sock.settimeout(30)
        wait_for(lambda: (got := stream.sock.recv(65536)) == b"" or got.endswith(b"0\r\n\r\n"), 30)
    finally:
        stream.close()
    wait_for(lambda: streams() == 0)


# Digits outside ASCII ("²".isdigit() is true), NUL bytes (PostgreSQL text cannot hold them).
ODD_IDS = ("²", "١٢", "task_²", "task_" + "0" * 11 + "%00", "%00" * 32, "0" * 31 + "%00")


def test_odd_job_and_file_ids_are_not_found(start_service):
    svc = start_service()
    c = svc.client
    for ref in ODD_IDS:
        for method, path in (
            ("GET", f"/api/v1/jobs/{ref}"),
            ("POST", f"/api/v1/jobs/{ref}/retry"),
            ("POST", f"/api/v1/jobs/{ref}/cancel"),
            ("DELETE", f"/api/v1/queue/task/{ref}"),
            ("POST", f"/api/v1/queue/prioritize/{ref}"),
            ("POST", f"/api/v1/file/{ref}/deep-scan"),
            ("GET", f"/api/v1/files/{ref}"),
            ("GET", f"/api/v1/files/{ref}/results/noop"),
        ):
            assert_error(c.request(method, path), 404, "not_found")
        reply = c.put(f"/api/v1/queue/task/{ref}/priority", json={"priority": "high"})
        assert_error(reply, 404, "not_found")


def test_hostile_values_and_bodies_get_json_4xx(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    queued = svc.submit("a.mp4", ["noop"])
    c = svc.client
    scan = f"/api/v1/file/{queued['file_uuid']}/deep-scan"
    priority = f"/api/v1/queue/task/{queued['task_id']}/priority"

    # Numbers past what the database holds.
    for path in ("/api/v1/jobs", "/api/v1/files"):
        assert_error(c.get(path, params={"offset": 2**63}), 400, "bad_request", "offset")
        assert_error(c.get(path, params={"limit": "9" * 5000}), 400, "bad_request", "limit")
        key = path.rsplit("/", 1)[1]
        assert svc.get(path, params={"offset": 2**63 - 1})[key] == []

    # Values of the wrong type where a name is expected.
    for value in (["high"], {}, {"high": 1}, 3.5, True, None):
        body = {"processors": ["noop"], "priority": value}
        assert_error(c.post(scan, json=body), 400, "bad_request", "priority")
        assert_error(c.put(priority, json={"priority": value}), 400, "bad_request", "priority")
    assert_error(c.put(priority, json={}), 400, "bad_request", "priority")

    # Bodies no parser should recurse through, and text no path or column can hold.
    deep = b'{"priority": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_error(c.post(scan, content=deep), 400, "bad_request", "nested")
    assert_error(c.put(priority, content=deep), 400, "bad_request")
    for path in ("bad\x00name.mp4", "\ud800.mp4"):
        body = json.dumps({"path": path}).encode()  # \u escapes: valid JSON
        assert_error(c.post("/api/v1/files/register", content=body), 400, "bad_request")

    # A chunked body is read like any other; broken chunking is a JSON 400.
    def chunks() -> Iterator[bytes]:
        yield b'{"priority":'
        yield b' "high"}'

    reply = c.put(priority, content=chunks())
    assert reply.status_code == 200, reply.text
    assert svc.job(queued["task_id"])["priority"] == "high"
    # Up to 1 MiB, however it is cut into chunks (their framing is not the body).
    padded = json.dumps({"priority": "low", "pad": "x" * ((1 << 20) - 40)}).encode()
    assert len(padded) <= 1 << 20
    pieces = [padded[i : i + 1000] for i in range(0, len(padded), 1000)]
    reply = c.put(priority, content=iter(pieces))
    assert reply.status_code == 200, reply.text
    too_big = iter([padded, b" " * 100])
    assert_error(c.put(priority, content=too_big), 413, "payload_too_large", "1048576 bytes")
    far_too_big = iter([b" " * (1 << 20)] * 3)  # refused by the server before the API
    assert_error(c.put(priority, content=far_too_big), 413, "payload_too_large", "1048576 bytes")
    raw = (
        f"PUT {priority} HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\n{}\r\n0\r\n\r\n"
    )
    status, headers, body = _raw(svc, raw.encode())
    assert status == 400 and "application/json" in headers, (status, headers, body)
    assert json.loads(body)["error"]["code"] == "bad_request"

    # Huge headers, long paths, methods no route has.
    assert_error(c.get("/healthz", headers={"X-Big": "a" * 300_000}), 431, "bad_request")
    assert_error(c.get("/api/v1/" + "a" * 60_000), 404, "not_found")
    assert_error(c.options("/api/v1/jobs"), 405, "method_not_allowed")
    assert c.head("/healthz").status_code == 200

    # None of this hurt the service or the job.
    assert svc.get("/healthz")["status"] == "ok"
    assert svc.status()["pending_count"] == 1


def _raw(svc, data: bytes) -> tuple[int, str, str]:
    """Send ``data`` as is; the status, the headers and the body of the reply."""
    with socket.create_connection(_address(svc), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.decode("latin-1").partition("\r\n\r\n")
    return int(head.split()[1]), head.lower(), body


def test_without_the_token_every_api_path_is_401(start_service):
    svc = start_service(service={"token": "s3cret"})
    anonymous = httpx.Client(base_url=svc.url, timeout=10)
    for method, path in (
        ("GET", "/api/v1/no/such/route"),
        ("GET", "/api/v2/queue/status"),
        ("PATCH", "/api/v1/queue/status"),
        ("POST", "/api/v1/jobs/1/retry"),
    ):
        reply = anonymous.request(method, path)
        assert_error(reply, 401, "unauthorized")
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        reply = anonymous.request(method, path, headers={"Authorization": "Basic s3cret"})
        assert_error(reply, 401, "unauthorized")
    # With the token, the usual answers; the scheme's name is case-insensitive.
    for scheme in ("Bearer", "bearer", "BEARER"):
        authorized = {"Authorization": f"{scheme} s3cret"}
        reply = anonymous.get("/api/v1/no/such/route", headers=authorized)
        assert_error(reply, 404, "not_found")
        assert anonymous.get("/api/v1/queue/status", headers=authorized).status_code == 200
    assert anonymous.get("/healthz").status_code == 200  # probes need no token


def test_a_web_page_of_another_origin_cannot_change_the_queue(start_service):
    svc = start_service()
    host = svc.url.removeprefix("http://")
    # What a page's form sends: text/plain or form-encoded, no preflight, its origin named.
    for origin in ("http://evil.example", "null", f"http://{host}.evil.example"):
        headers = {"Origin": origin, "Content-Type": "text/plain"}
        for path in ("/api/v1/queue/pause", "/api/v1/queue/clear"):
            reply = svc.client.post(path, content="x", headers=headers)
            assert_error(reply, 403, "forbidden")
            assert origin in reply.json()["error"]["message"]
    assert svc.status()["paused"] is False
    # Nor reading (a stream held open, say); a page served from the service's own origin is
    # served.
    reply = svc.client.get("/api/v1/queue/status", headers={"Origin": "http://x"})
    assert_error(reply, 403, "forbidden")
    assert svc.client.get("/api/v1/queue/status", headers={"Origin": svc.url}).is_success
    same = svc.client.post("/api/v1/queue/pause", headers={"Origin": svc.url})
    assert same.status_code == 200 and svc.status()["paused"] is True


def test_a_page_rebound_to_the_service_by_its_dns_cannot_use_it(start_service):
    # The page's own name now resolves to 127.0.0.1: its requests come with that name as
    # Host and as Origin, which agree. With a token that page has none: without one (the
    # service's own made off), only names of this machine are served.
    svc = start_service(service={"auth": False})
    port = httpx.URL(svc.url).port
    page = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    for path in ("/api/v1/queue/pause", "/api/v1/queue/clear"):
        assert_error(svc.client.post(path, headers=page), 403, "forbidden")
    for path in ("/api/v1/queue/status", "/api/v1/files", "/metrics", "/healthz"):
        reply = svc.client.get(path, headers={"Host": page["Host"]})
        assert_error(reply, 403, "forbidden")
        assert "evil.example" in reply.json()["error"]["message"]
    for host in ("", "[::1", f"127.0.0.1.evil.example:{port}", "localhost.evil.example"):
        assert_error(svc.client.get("/healthz", headers={"Host": host}), 403, "forbidden")
    assert svc.status()["paused"] is False
    # Names and addresses of this machine, in any spelling, at any port, are served.
    for host in (f"localhost:{port}", "LOCALHOST.", "app.localhost", "127.0.0.1", "[::1]:80"):
        assert svc.client.get("/api/v1/queue/status", headers={"Host": host}).is_success
    assert svc.client.get("/healthz", headers={"Host": socket.gethostname()}).is_success
    same = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    assert svc.client.post("/api/v1/queue/pause", headers=same).status_code == 200
    assert svc.status()["paused"] is True


def test_with_a_token_any_host_name_is_served(start_service):
    # Behind a reverse proxy under a public name: the token, not the name, guards.
    svc = start_service(service={"token": "s3cret"})
    reply = svc.client.post("/api/v1/queue/pause", headers={"Host": "edge.example.com"})
    assert reply.status_code == 200 and svc.status()["paused"] is True
    anonymous = httpx.Client(base_url=svc.url, headers={"Host": "edge.example.com"})
    with anonymous:
        assert_error(anonymous.get("/api/v1/queue/status"), 401, "unauthorized")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # threads, not storage
def test_request_threads_start_as_clients_need_them_and_end_once_idle(start_service):
    svc = start_service(service={"event_keepalive": 0.1})  # gone readers found soon
    process = psutil.Process(svc.proc.pid)
    idle = process.num_threads()
    with ExitStack() as stack:
        for _ in range(MAX_EVENT_STREAMS):
            stream = EventStream(svc)
            stack.callback(stream.close)
            stream.read_until(b": connected")
        # Each open stream holds a thread of its own, started for it: none waited idle before.
        assert process.num_threads() >= idle + MAX_EVENT_STREAMS
        assert httpx.get(f"{svc.url}/healthz", timeout=10).json()["status"] == "ok"
    # Their readers gone, the streams end at their next keep-alive, and their threads once
    # idle for IDLE_THREAD_SECONDS.
    wait_for(lambda: process.num_threads() <= idle, timeout=90, interval=0.5)
    assert svc.client.get("/api/v1/queue/status", timeout=10).status_code == 200


class _Request:
    def __init__(self) -> None:
        self.served = threading.Event()

    def service(self) -> None:
        time.sleep(random.uniform(0, 0.002))
        self.served.set()

    def cancel(self) -> None:
        pass


def test_every_request_is_served_while_request_threads_come_and_go(monkeypatch):
    # Threads ending idle at the moment requests arrive: each request is still taken at
    # once by a thread waiting, or one started for it.
    monkeypatch.setattr(http_server, "IDLE_THREAD_SECONDS", 0.005)
    pool = http_server._ThreadsOnDemand(most=8)
    late: list[_Request] = []

    def client() -> None:
        for _ in range(300):
            request = _Request()
            pool.add_task(request)
            if not request.served.wait(5):
                late.append(request)
            time.sleep(random.choice((0, 0.004, 0.005, 0.006)))

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert late == []
    assert pool.shutdown(timeout=5) and not pool.threads


HELD = 60.0  # seconds a write waits for the SQLite lock in the test below


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # a lock on the file
def test_healthz_and_event_streams_answer_while_many_requests_wait_on_the_database(
    start_service,
):
    svc = start_service(service={"database_timeout": HELD})
    process = psutil.Process(svc.proc.pid)
    idle = process.num_threads()
    waiting = 2 * (http_server.API_THREADS + MAX_EVENT_STREAMS)  # more than every thread
    conn = sqlite3.connect(svc.data_dir / "momentry.db", isolation_level=None, timeout=30)
    conn.execute("BEGIN EXCLUSIVE")  # another process holds the database's lock
    answers: list[int] = []

    def pause() -> None:
        with httpx.Client(
            base_url=svc.url, timeout=10 * HELD, headers=svc.client.headers
        ) as client:
            answers.append(client.post("/api/v1/queue/pause").status_code)

    clients = [threading.Thread(target=pause) for _ in range(waiting)]
    try:
        for thread in clients:
            thread.start()
        # Every request has arrived and the request threads are all waiting on the lock.
        port = httpx.URL(svc.url).port
        wait_for(
            lambda: (
                len([c for c in process.net_connections() if c.laddr.port == port and c.raddr])
                >= waiting
            )
        )
        wait_for(lambda: process.num_threads() >= idle + http_server.API_THREADS)

        # Well above a normal answer's time, well under the time the others are held.
        reply = httpx.get(f"{svc.url}/healthz", timeout=HELD / 4)
        assert reply.json()["status"] == "ok"
        stream = EventStream(svc)
        stream.sock.settimeout(HELD / 4)
        assert b": connected" in stream.read_until(b": connected")
        stream.close()
        assert not answers  # the others were still waiting all along
    finally:
        conn.execute("ROLLBACK")
        conn.close()
        for thread in clients:
            thread.join(timeout=10 * HELD)
    assert answers == [200] * waiting
    assert svc.status()["paused"] is True
