"""One POST to someone else's server (a job callback, an operator alert), bounded in time."""

# httpx's timeouts bound each connect, send and read on its own, so a server that
# answers a byte at a time (each within the read timeout) could hold the sending
# thread forever, and none of them bounds the host name's lookup, which the system
# resolver may take far longer over. Here the whole exchange, from the lookup up to
# the status line and headers, gets ``deadline`` seconds: it runs on a thread of its
# own, and at the deadline the caller gets TooSlow while the exchange's socket is
# shut down, which wakes a blocked read; a lookup that answers late connects no more.
# The reply's body is never read: the status is the answer, and a huge or endless
# body must neither hold the thread nor fill its memory.

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

MAX_URL = 2048  # characters of a URL posted to: more is a mistake, and fills logs


def url_problem(url: str) -> str | None:
    """What keeps ``url`` from being POSTed to (said after its name: "callback_url is not
    a valid URL: ..."), or None. Checked when it is given (a callback URL) or at start
    (alerts.url): found at the first POST instead, it would only fail every attempt."""
    if len(url) > MAX_URL:
        return f"is longer than {MAX_URL} characters"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "must not contain spaces or control characters"
    import httpx  # here: loading the config need not load an HTTP client

    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        return f"is not a valid URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "must be an http:// or https:// URL with a host"
    if port is not None and not 1 <= port <= 65535:
        return f"has port {port}; ports are 1 to 65535"
    return None


class TooSlow(Exception):
    """The server took longer than the deadline to answer."""


class Refused(Exception):
    """The connection went where this POST must not go (see ``post``'s ``refuse``)."""


def own_address(host: str) -> bool:
    """Whether ``host``, an IP address in any spelling the resolver takes (127.1,
    2130706433, ::ffff:127.0.0.1), is this machine's own; False for a name."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return True
    # One of this machine's interfaces: only an own address can be bound.
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def client(timeout: float) -> httpx.Client:
    """A client whose connections are never kept: each POST's socket is its own, so the
    deadline of one cuts no other."""
    import httpx  # here: a service that never posts never loads it

    return httpx.Client(
        timeout=timeout,
        follow_redirects=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def post(
    http: httpx.Client,
    url: str,
    deadline: float,
    refuse: Callable[[str, int], str | None] | None = None,
    **request: Any,
) -> int:
    """POST and return the reply's status; TooSlow past ``deadline`` seconds, else
    whatever httpx raises. ``refuse``, given the address and port connected to, says why
    nothing is to be sent there (Refused), whatever name led there."""
    sockets: list[socket.socket] = []
    cut = threading.Event()
    lock = threading.Lock()  # a socket is kept, or shut, never neither
    outcome: list[int | BaseException] = []

    def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            sock = info["return_value"].get_extra_info("socket")
            with lock:
                if sock is not None:
                    sockets.append(sock)
                if cut.is_set():
                    _shut(sockets)
            if event == "connection.connect_tcp.complete" and refuse and sock is not None:
                peer = sock.getpeername()
                if reason := refuse(peer[0], peer[1]):
                    raise Refused(reason)
        if cut.is_set():  # past the deadline: nothing more is sent (a late lookup's connect)
            raise TooSlow("the deadline passed")

    def exchange() -> None:
        try:
            with http.stream("POST", url, extensions={"trace": trace}, **request) as reply:
                outcome.append(reply.status_code)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=exchange, name="outbound-post", daemon=True)
    thread.start()
    thread.join(deadline)
    with lock:
        if not outcome:  # still looking up the host, connecting, or waiting for the answer
            cut.set()
            _shut(sockets)
    # The thread ends by itself: at once on a shut socket, after a lookup once the
    # resolver answers or gives up.
    if cut.is_set():
        raise TooSlow(f"no whole answer within {deadline:g} s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _shut(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):  # closed already: the POST has ended
            sock.shutdown(socket.SHUT_RDWR)
