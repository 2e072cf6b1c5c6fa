"""Guards before every request: the bearer token, DNS rebinding (a request addressed to
another name), and pages of other origins in a browser."""

from __future__ import annotations

import hmac
import socket
from urllib.parse import urlsplit

import bottle
from bottle import request

from .. import outbound
from ..config import Config
from .parsing import (
    error,
)


def install(app: bottle.Bottle, config: Config) -> None:
    """Refuse, before routing, requests the service must not serve."""

    @app.hook("before_request")
    def authenticate() -> None:
        # Before routing: without the token, a known and an unknown /api/ path look alike.
        token = config.service.token
        given = request.get_header("Authorization", "")
        if token and request.path.startswith("/api/") and not bearer_matches(given, token):
            raise bottle.HTTPResponse(
                error(401, "unauthorized", "missing or wrong bearer token"),
                401,
                {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"},
            )

    @app.hook("before_request")
    def addressed_here() -> None:
        # DNS rebinding: a web page whose own name its DNS now points at 127.0.0.1 reaches
        # this port as its own origin (Origin matching Host), free to read and change the
        # queue. Without a token, only requests addressed to a name of this machine are
        # served; such a page's requests carry its name. With one, the token guards.
        if config.service.token:
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
        if request.method in ("GET", "HEAD", "OPTIONS") or origin is None:
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
