"""Guards before every request: the bearer token (and wrong ones, logged and slowed), DNS
rebinding (a request addressed to another name), and pages of other origins in a browser;
after every request, the answers behind the token kept out of caches."""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections import OrderedDict
from urllib.parse import urlsplit

import bottle
from bottle import request, response

from .. import apitoken, outbound
from ..config import Config
from .parsing import (
    error,
)

log = logging.getLogger(__name__)

# A client that sent this many missing or wrong tokens within FAILURE_WINDOW seconds waits
# FAILURE_DELAY seconds for each further refusal; at most DELAYED_AT_ONCE requests wait at
# once, so that wrong tokens sent in parallel cannot hold every request thread.
FAILURE_WINDOW = 60.0
FAILURES_BEFORE_DELAY = 10
FAILURE_DELAY = 1.0
DELAYED_AT_ONCE = 4
CLIENTS_REMEMBERED = 1024  # addresses counted at once; the longest quiet is forgotten
LINES_PER_WINDOW = 10  # lines about wrong tokens per FAILURE_WINDOW, all addresses together


def needs_token(path: str) -> bool:
    """What answers with queue or result data: every /api/ route (the event stream,
    results, thumbnails, subtitles) and /metrics. The console's page and files, /healthz
    and /openapi.json hold none."""
    return path.startswith("/api/") or path == "/metrics"


def install(app: bottle.Bottle, config: Config, token: str) -> None:
    """Refuse, before routing, requests the service must not serve. ``token``: the one
    every request for data must carry ("" with service.auth = false)."""
    # A token as long as a remote service needs is beyond guessing: slowing its wrong
    # guesses would only slow a client that lost it (and every test of refusals).
    wrong = WrongTokens(slow=len(token) < apitoken.MIN_REMOTE_LENGTH)

    @app.hook("before_request")
    def authenticate() -> None:
        # Before routing: without the token, a known and an unknown /api/ path look alike.
        given = request.get_header("Authorization", "")
        if token and needs_token(request.path) and not bearer_matches(given, token):
            # The peer's address, not X-Forwarded-For: a client names itself there at will.
            wrong.refused(request.environ.get("REMOTE_ADDR") or "unknown", bool(given))
            raise bottle.HTTPResponse(
                error(401, "unauthorized", "missing or wrong bearer token"),
                401,
                {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"},
            )

    @app.hook("after_request")
    def not_kept() -> None:
        # A browser (or a proxy) must not keep answers that needed the token: a page or
        # account reading its cache later would see them without it.
        if needs_token(request.path):
            response.set_header("Cache-Control", "no-store")
            response.set_header("Pragma", "no-cache")

    @app.hook("before_request")
    def addressed_here() -> None:
        # DNS rebinding: a web page whose own name its DNS now points at 127.0.0.1 reaches
        # this port as its own origin (Origin matching Host), free to read and change the
        # queue. Without a token, only requests addressed to a name of this machine are
        # served; such a page's requests carry its name. With one, the token guards.
        if token:
            return
        host = request.get_header("Host")
        if host is None or names_this_machine(host, config.service.host):
            return
        raise bottle.HTTPResponse(
            error(403, "forbidden", f"refused: addressed to host {host[:200]!r}, not this one"),
            403,
            {"Content-Type": "application/json"},
        )

    @app.hook("before_request")
    def same_origin() -> None:
        # Any web page open in a browser on this machine could send a form or a fetch here
        # (to pause or clear the queue, with no token set). Browsers name the page's
        # origin on such a request; other clients (the CLI, curl, SFTPGo) send none.
        origin = request.get_header("Origin")
        safe = request.method in ("GET", "HEAD", "OPTIONS")
        if safe and not needs_token(request.path):
            return  # the page and its files: a link from anywhere may open them
        # Without a token, a page of another site (under names such as a.localhost and
        # b.localhost, each with connections of its own) could hold every event-stream slot
        # or have the queue read for it: browsers name where a request comes from
        # (Sec-Fetch-Site; Origin on a stream's, and on every POST, PUT or DELETE).
        if not token and request.get_header("Sec-Fetch-Site") in ("cross-site", "same-site"):
            raise bottle.HTTPResponse(
                error(403, "forbidden", "refused: sent by a web page of another site"),
                403,
                {"Content-Type": "application/json"},
            )
        if origin is None:
            return
        if urlsplit(origin).netloc.lower() != request.get_header("Host", "").lower():
            raise bottle.HTTPResponse(
                error(403, "forbidden", f"refused: sent by the web page at {origin[:200]!r}"),
                403,
                {"Content-Type": "application/json"},
            )


def bearer_matches(header: str, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme in any case (RFC 7235), in constant time."""
    scheme, _, given = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def names_this_machine(host_header: str, bound: str) -> bool:
    """Whether a request's ``Host`` names this machine: localhost (or a name under it), one
    of its own addresses, the configured service.host, or its host name, at any port."""
    try:
        name = (urlsplit(f"//{host_header}").hostname or "").rstrip(".")
    except ValueError:  # an unclosed [ or the like
        return False
    if not name:
        return False
    return (
        name in ("localhost", bound.lower(), socket.gethostname().lower())
        or name.endswith(".localhost")  # resolved to loopback by browsers (RFC 6761)
        or outbound.own_address(name)
    )


class WrongTokens:
    """Requests refused for a missing or wrong token, counted per client address: logged
    once a minute per address (with the count), and with ``slow`` slowed past a few."""

    def __init__(self, slow: bool = True) -> None:
        self._slow = slow
        self._lock = threading.Lock()
        # address -> [window start, refusals in it, refusals not yet logged, last logged]
        self._clients: OrderedDict[str, list[float]] = OrderedDict()
        self._delayed = threading.BoundedSemaphore(DELAYED_AT_ONCE)
        self._lines = (float("-inf"), 0)  # this window's start, lines said in it

    def refused(self, address: str, wrong: bool) -> None:
        """Count a refusal (``wrong``: a token was sent; else none was); log, then wait if
        this address sent too many."""
        now = time.monotonic()
        with self._lock:
            entry = self._clients.pop(address, None) or [now, 0, 0, float("-inf")]
            self._clients[address] = entry  # the most recent last
            while len(self._clients) > CLIENTS_REMEMBERED:
                self._clients.popitem(last=False)
            if now - entry[0] > FAILURE_WINDOW:
                entry[0], entry[1] = now, 0
            entry[1] += 1
            if wrong:
                entry[2] += 1
            unsaid = int(entry[2])
            if now - self._lines[0] > FAILURE_WINDOW:
                self._lines = (now, 0)
            # Many addresses (a network's worth) get no more lines than a few: the counts
            # wait for each address's next line.
            say = wrong and now - entry[3] >= FAILURE_WINDOW and self._lines[1] < LINES_PER_WINDOW
            if say:
                entry[2], entry[3] = 0, now
                self._lines = (self._lines[0], self._lines[1] + 1)
            slow = self._slow and entry[1] > FAILURES_BEFORE_DELAY
        if say:
            log.warning(
                "wrong API token from %s: %d refused since last said (said at most once a "
                "minute per address)",
                address,
                unsaid,
            )
        if slow and self._delayed.acquire(blocking=False):
            try:
                time.sleep(FAILURE_DELAY)
            finally:
                self._delayed.release()
