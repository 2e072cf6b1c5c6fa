"""Routes about the service: health, OpenAPI, metrics, processors, the event stream."""

from __future__ import annotations

import getpass
import ipaddress
import json
import queue
from collections.abc import Callable, Iterator

import bottle
from bottle import request, response

from .. import __version__
from ..events import bus
from .core import Core
from .metrics import render_metrics
from .openapi import openapi_document
from .parsing import (
    Busy,
)

# How often a stream looks whether its reader has gone (waitress notices a closed
# connection while the stream runs: server.py reads ahead), and frees its slot then.
GONE_CHECK = 1.0
# Each open event stream holds a server thread; past this many, new ones are refused
# so that the API itself always has threads left.
MAX_EVENT_STREAMS = 16


def add(app: bottle.Bottle, service: Core) -> None:
    account = getpass.getuser()
    data_dir = str(service.config.data_dir)

    @app.get("/healthz")
    def healthz() -> dict:
        if not _loopback(request.environ.get("REMOTE_ADDR")):
            return {"status": "ok", "version": __version__}
        # Whose service this is, for the CLI of another account on this machine, which
        # would take it for its own (a fresh account's default port is taken): `ps` shows
        # every local account the same (the process's owner and command line).
        return {"status": "ok", "version": __version__, "account": account, "data_dir": data_dir}

    @app.get("/openapi.json")
    def openapi() -> dict:
        return openapi_document(__version__)

    @app.get("/metrics")
    def metrics() -> bytes:
        body, content_type = render_metrics(service.effective_limit)
        response.content_type = content_type
        return body

    @app.get("/api/v1/processors")
    def processors() -> dict:
        return {"processors": service.processors()}

    @app.get("/api/v1/events")
    def events() -> Iterator[str]:
        if bus.subscriber_count >= MAX_EVENT_STREAMS:
            raise Busy(f"{MAX_EVENT_STREAMS} event streams are open already; try again later")
        response.content_type = "text/event-stream"
        response.set_header("Cache-Control", "no-cache")
        response.set_header("X-Accel-Buffering", "no")
        gone = request.environ.get("waitress.client_disconnected", lambda: False)
        return event_stream(service, gone)


def event_stream(service: Core, gone: Callable[[], bool]) -> Iterator[str]:
    with bus.subscribe() as events:
        yield ": connected\n\n"
        keepalive = service.config.service.event_keepalive
        wait = min(GONE_CHECK, keepalive)
        quiet = 0.0
        while not service.stopping.is_set() and not gone():
            try:
                event = events.get(timeout=wait)
            except queue.Empty:
                quiet += wait
                if quiet >= keepalive:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
                continue
            quiet = 0.0
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def _loopback(address: str | None) -> bool:
    try:
        ip = ipaddress.ip_address((address or "").split("%")[0])
    except ValueError:
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback
