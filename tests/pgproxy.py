"""A loopback TCP proxy in front of the test PostgreSQL server that can end a connection
just after a transaction has begun on it, or just after the server committed one but
before its answer got back, as a server restart or failover landing at that moment
would; or stall every connection (open, but no answer), as a frozen server or network
path does. The service reaches the server only through it."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

# libpq asks for TLS or GSSAPI first unless told not to; plain messages are read here.
PLAIN_ENV = {"PGSSLMODE": "disable", "PGGSSENCMODE": "disable"}


class CuttingProxy:
    def __init__(self, server_url: str) -> None:
        url = urlparse(server_url)
        self._server = (url.hostname or "127.0.0.1", url.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self.url = url._replace(netloc=f"{url.username or 'postgres'}@127.0.0.1:{port}").geturl()
        self.cut_after_begin = threading.Event()
        self.cuts = 0
        self._lose_commit_after: bytes | None = None
        self.commit_answers_lost = 0
        # Cleared: the server's answers are held (connections stay open), until set again.
        self.answering = threading.Event()
        self.answering.set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def lose_commit_answer(self, statement: bytes) -> None:
        """Once: the next transaction that runs a query containing ``statement`` (or the
        query alone, outside a transaction) is committed by the server, and the
        connection ends before the client hears so."""
        self._lose_commit_after = statement

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._server)
                for sock in (client, server):  # one small message after another, unbatched
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                begun = threading.Event()  # the client's last query began a transaction
                trapped = threading.Event()  # its transaction's commit is to go unanswered
                threading.Thread(
                    target=self._upstream, args=(client, server, begun, trapped), daemon=True
                ).start()
                threading.Thread(
                    target=self._downstream, args=(server, client, begun, trapped), daemon=True
                ).start()

    def _upstream(
        self,
        client: socket.socket,
        server: socket.socket,
        begun: threading.Event,
        trapped: threading.Event,
    ) -> None:
        prepared: dict[bytes, bytes] = {}  # the client's parsed statements, by name
        with contextlib.suppress(OSError):
            (length,) = struct.unpack("!I", _read(client, 4))
            server.sendall(struct.pack("!I", length) + _read(client, length - 4))  # startup
            for kind, body in _messages(client):
                query = None
                if kind == b"Q":  # a simple query
                    query = body.split(b"\0", 1)[0]
                elif kind == b"P":  # a parsed one, perhaps named to be run again
                    name, statement, _ = body.split(b"\0", 2)
                    prepared[name] = statement
                elif kind == b"B":  # a parsed one run
                    query = prepared.get(body.split(b"\0", 2)[1])
                if query is not None:
                    command = query.lstrip().upper()
                    if command.startswith(b"BEGIN"):
                        begun.set()
                    elif command.startswith(b"ROLLBACK"):
                        trapped.clear()
                    with self._lock:
                        if self._lose_commit_after and self._lose_commit_after in query:
                            self._lose_commit_after = None
                            trapped.set()
                server.sendall(kind + struct.pack("!I", len(body) + 4) + body)
        _end(client, server)

    def _downstream(
        self,
        server: socket.socket,
        client: socket.socket,
        begun: threading.Event,
        trapped: threading.Event,
    ) -> None:
        held: list[bytes] = []  # the answers of a trapped transaction, up to its end
        with contextlib.suppress(OSError):
            for kind, body in _messages(server):
                message = kind + struct.pack("!I", len(body) + 4) + body
                self.answering.wait()
                if trapped.is_set():
                    held.append(message)
                    if kind != b"Z":  # ReadyForQuery: the answer is whole
                        continue
                    failed = any(m[:1] == b"E" for m in held)  # an ErrorResponse
                    if body == b"I" and not failed:  # committed, by COMMIT or autocommit
                        with self._lock:
                            self.commit_answers_lost += 1
                        break
                    if failed:
                        trapped.clear()
                    client.sendall(b"".join(held))
                    held.clear()
                    continue
                client.sendall(message)
                # ReadyForQuery "in a transaction" right after a BEGIN: end it here.
                if kind == b"Z" and body == b"T" and begun.is_set():
                    begun.clear()
                    if self.cut_after_begin.is_set():
                        with self._lock:
                            self.cuts += 1
                        break
        _end(client, server)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _messages(sock: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    while True:
        kind = _read(sock, 1)
        (length,) = struct.unpack("!I", _read(sock, 4))
        yield kind, _read(sock, length - 4)


def _end(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
