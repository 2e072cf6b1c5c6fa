"""The HTTP API (bottle): the app, its guards and route groups (routes_*.py). Routes parse,
call one core function, render; client mistakes raise errors.ClientError anywhere below, and
``json_api`` turns them, and bottle's own 404/405, into API.md's error shape in one place."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import bottle
from bottle import request, response

from .. import store
from ..errors import ClientError
from . import (
    console,
    guards,
    routes_files,
    routes_jobs,
    routes_queue,
    routes_search,
    routes_service,
)
from .core import Core
from .openapi import OPERATIONS
from .parsing import (
    check_query,
    error,
    media_file,
    operation_key,
)

log = logging.getLogger(__name__)


def make_app(service: Core) -> bottle.Bottle:
    app = bottle.Bottle(catchall=True)
    app.config["json.enable"] = True
    # Strict JSON answers: NaN or Infinity would be an error, not an answer no parser reads.
    app.uninstall("json")
    app.install(bottle.JSONPlugin(lambda value: json.dumps(value, allow_nan=False)))

    guards.install(app, service.config, service.token)

    def json_api(callback: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                if (names := query_names.get(request.route)) is not None:
                    check_query(names)
                return callback(*args, **kwargs)
            except ClientError as exc:
                return error(exc.status, exc.code, exc.message)
            except store.OUTAGE_ERRORS as exc:
                # The database busy past its timeout, or unreachable: not the client's
                # mistake, and worth asking again shortly.
                log.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
                response.set_header("Retry-After", "5")
                store.after_outage()
                return error(503, "unavailable", f"the queue database is unavailable: {exc}")
            finally:
                store.release_connection()

        return wrapper

    app.install(json_api)

    for status, code in (
        (400, "bad_request"),
        (404, "not_found"),
        (405, "method_not_allowed"),
        (413, "payload_too_large"),
    ):
        app.error(status)(
            lambda err, status=status, code=code: error(
                status, code, err.body or "no such endpoint"
            )
        )

    @app.error(500)
    def internal(err: bottle.HTTPError) -> str:
        log.error("%s %s failed:\n%s", request.method, request.path, err.traceback)
        return error(500, "internal", "internal error; see the service log")

    # The web console: before the routes below (see console.add_routes).
    console.add_routes(app, service, media_file)

    routes_service.add(app, service)
    routes_queue.add(app, service)
    routes_jobs.add(app, service)
    routes_files.add(app, service)
    routes_search.add(app, service)

    # The query parameters each /api/ route takes, as its OpenAPI operation names them: any
    # other is refused, as a misspelt filter would widen what a request lists or clears.
    query_names = {
        route: frozenset(OPERATIONS[operation_key(route)]["parameters"])
        for route in app.routes
        if route.rule.startswith("/api/")
    }
    # A path that is a route of its own for some methods (POST /api/v1/files/register)
    # also matches a pattern of others (GET /api/v1/files/<file_uuid>): those get 405.
    literal_methods: dict[str, set[str]] = {}
    for route in app.routes:
        if "<" not in route.rule:
            literal_methods.setdefault(route.rule, set()).add(route.method)

    @app.hook("before_request")
    def method_of_literal_path() -> None:
        allowed = literal_methods.get(request.path)
        method = "GET" if request.method == "HEAD" else request.method
        if allowed and method not in allowed:
            raise bottle.HTTPError(405, "Method not allowed.", Allow=", ".join(sorted(allowed)))

    return app
