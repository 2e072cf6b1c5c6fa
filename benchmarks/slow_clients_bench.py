"""API latency under hostile clients: slow sockets plus open event streams, against idle.

    .venv/bin/python benchmarks/slow_clients_bench.py [--slow 64] [--streams 16] [--fuzz]

Starts a real ``momentry-edge run`` process (SQLite, loopback), measures ``/healthz`` and
``/api/v1/queue/status`` (a new connection per request), then opens ``--streams`` event
streams and ``--slow`` connections that send ``GET /healthz`` one byte a second (reconnecting
when the server drops them), and measures again. ``--fuzz`` also runs tests/http/test_api_fuzz.py
(SQLite) and prints its figures. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from common import ROOT, service_process

ENDPOINTS = ("/healthz", "/api/v1/queue/status")
SAMPLES = 40
TIMEOUT = 10.0  # a request slower than this counts as timed out
GIVE_UP = 3  # timeouts after which an endpoint counts as frozen
SLOW_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Pad: " + b"a" * 600 + b"\r\n"


def latencies(url: str) -> dict[str, tuple[list[float], int]]:
    """Per endpoint: the latency of each answered request and how many timed out."""
    result = {}
    for path in ENDPOINTS:
        took, timed_out = [], 0
        for _ in range(SAMPLES):
            started = time.perf_counter()
            try:
                httpx.get(url + path, timeout=TIMEOUT).raise_for_status()
                took.append(time.perf_counter() - started)
            except httpx.TimeoutException:
                timed_out += 1
                if timed_out == GIVE_UP:
                    break  # frozen: no need to wait out every sample
        result[path] = (took, timed_out)
    return result


class Hostile:
    """``slow`` trickling connections and ``streams`` open event streams, until stop()."""

    def __init__(self, url: str, slow: int, streams: int) -> None:
        parsed = httpx.URL(url)
        self.address = (parsed.host, parsed.port)
        self.stopping = threading.Event()
        self.reconnects = 0
        self.refused = ""
        opened = [self._stream() for _ in range(streams)]
        self.streams = [sock for sock in opened if sock is not None]
        self.slow = [socket.create_connection(self.address) for _ in range(slow)]
        self.threads = [
            threading.Thread(target=self._trickle, daemon=True),
            threading.Thread(target=self._drain, daemon=True),
        ]
        for thread in self.threads:
            thread.start()
        self.refused = self._one_more(url)

    @staticmethod
    def _one_more(url: str) -> str:
        """How the server answers one stream more. Under its limit it accepts it, and an
        accepted stream never ends (a keep-alive comes sooner than any read timeout):
        only the status is read, then the stream is closed."""
        try:
            with httpx.stream("GET", url + "/api/v1/events", timeout=TIMEOUT) as reply:
                if reply.status_code == 200:
                    return "200, accepted (under the server's limit)"
                reply.read()
                return f"{reply.status_code} {reply.json()['error']['code']}"
        except httpx.TimeoutException:
            return "timed out"

    def _stream(self) -> socket.socket | None:
        """An open event stream, or None when the server refuses it (over its limit)."""
        sock = socket.create_connection(self.address, timeout=TIMEOUT)
        # The service answers only requests addressed to it (a Host of another name is 403).
        host = f"{self.address[0]}:{self.address[1]}".encode()
        sock.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        seen = b""
        while b": connected" not in seen:
            if b"\r\n" in seen and not seen.startswith(b"HTTP/1.1 200"):
                sock.close()
                return None
            if not (received := sock.recv(4096)):
                sock.close()  # closed without a word
                return None
            seen += received
        sock.setblocking(False)
        return sock

    def _drain(self) -> None:
        while not self.stopping.wait(0.5):
            for sock in self.streams:
                with contextlib.suppress(BlockingIOError):
                    sock.recv(65536)

    def _trickle(self) -> None:
        position = 0
        while not self.stopping.wait(1.0):
            byte = SLOW_REQUEST[position % len(SLOW_REQUEST) : position % len(SLOW_REQUEST) + 1]
            position += 1
            for i, sock in enumerate(self.slow):
                try:
                    sock.send(byte)
                except OSError:  # dropped by the server: come back, as an attacker would
                    sock.close()
                    self.slow[i] = socket.create_connection(self.address)
                    self.reconnects += 1

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()
        for sock in self.slow + self.streams:
            sock.close()


def describe(took: list[float]) -> tuple[float, float]:
    return (statistics.median(took) * 1000, max(took) * 1000) if took else (float("nan"),) * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=64, help="slow connections")
    parser.add_argument("--streams", type=int, default=16, help="open event streams")
    parser.add_argument("--fuzz", action="store_true", help="also run the fuzzing test")
    args = parser.parse_args()
    print(
        f"# {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.2f}; {SAMPLES} requests per endpoint, new connection each"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        service_process(Path(tmp), "[ingest]\nprocessors = []\n") as (url, _),
    ):
        idle = latencies(url)
        hostile = Hostile(url, args.slow, args.streams)
        try:
            time.sleep(2)  # every slow connection has sent its first bytes
            loaded = latencies(url)
        finally:
            hostile.stop()
    print(
        f"{'endpoint':<22} {'idle median/max ms':>20} "
        f"{f'{args.slow} slow + {args.streams} streams':>26} {'ratio median/max':>18}  timeouts"
    )
    for path in ENDPOINTS:
        (i_med, i_max), (l_med, l_max) = describe(idle[path][0]), describe(loaded[path][0])
        print(
            f"{path:<22} {i_med:9.1f} / {i_max:7.1f} {l_med:15.1f} / {l_max:8.1f} "
            f"{l_med / i_med:9.2f} / {l_max / i_max:6.2f}  {loaded[path][1]}/{SAMPLES}"
        )
    print(
        f"event streams opened: {len(hostile.streams)} of {args.streams}; "
        f"stream {args.streams + 1} answered: {hostile.refused}; "
        f"slow connections dropped by the server and reopened: {hostile.reconnects}"
    )
    if args.fuzz:
        test = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "tests/http/test_api_fuzz.py",
            "-k",
            "sqlite",
        ]
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        }
        out = subprocess.run(test, cwd=ROOT, env=env, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("fuzzing:") or " passed" in line or " failed" in line:
                print(line)


if __name__ == "__main__":
    main()
