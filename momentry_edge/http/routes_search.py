"""The search route: moments and files found by what was said, shown and written."""

from __future__ import annotations

from typing import Any

import bottle
from bottle import response

from ..errors import Invalid
from ..search import meaning, query
from .core import Core
from .parsing import paging, text_query, timestamp


def add(app: bottle.Bottle, service: Core) -> None:
    @app.get("/api/v1/search")
    def search() -> dict[str, Any]:
        return run()

    @app.get("/api/v1/search.csv")
    def search_csv() -> str:
        found = run()
        response.content_type = "text/csv; charset=utf-8"
        response.set_header("Content-Disposition", 'attachment; filename="moments.csv"')
        return query.as_csv(found)


MODES = ("words", "meaning")


def run() -> dict[str, Any]:
    """The search the request asks for: by words (the default) or by meaning."""
    mode = text_query("mode") or "words"
    if mode not in MODES:
        raise Invalid(f"unknown mode {mode[:100]!r}; one of {', '.join(MODES)}")
    find = meaning.search if mode == "meaning" else query.search
    return find(text_query("q") or "", filters(), *paging()) | {"mode": mode}


def filters() -> query.Filters:
    """The search's filters, from the request's query."""
    source = text_query("source")
    if source is not None and source not in query.PROCESSORS:
        raise Invalid(f"unknown source {source[:100]!r}; one of {', '.join(query.PROCESSORS)}")
    since, until = text_query("since"), text_query("until")
    return query.Filters(
        folder=text_query("folder") or None,
        processor=source,
        file_uuid=text_query("file") or None,
        since=timestamp("since", since) if since else None,
        until=timestamp("until", until) if until else None,
    )
