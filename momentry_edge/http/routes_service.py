"""Routes about the service: health, OpenAPI, metrics, processors, the event stream."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator

import bottle
from bottle import response

from .. import __version__
from ..events import bus
from .core import Core
from .metrics import render_metrics
from .openapi import openapi_document
from .parsing import (
    Busy,
)

# Each open event stream holds a server thread; past this many, new ones are refused
# so that the API itself always has threads left.
MAX_EVENT_STREAMS = 16


def add(app: bottle.Bottle, service: Core) -> None:
    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "version": __version__}

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
        return event_stream(service)


def event_stream(service: Core) -> Iterator[str]:
    with bus.subscribe() as events:
        yield ": connected\n\n"
        while not service.stopping.is_set():
            try:
                event = events.get(timeout=service.config.service.event_keepalive)
            except queue.Empty:
                yield ": keep-alive\n\n"
                continue
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
