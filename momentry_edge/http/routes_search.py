"""The search route: moments and files found by what was said, shown and written."""

from __future__ import annotations

from typing import Any

import bottle
from bottle import response

from ..errors import Invalid
from ..search import query
from .core import Core
from .parsing import paging, text_query, timestamp


def add(app: bottle.Bottle, service: Core) -> None:
    @app.get("/api/v1/search")
    def search() -> dict[str, Any]:
        return query.search(text_query("q") or "", filters(), *paging())

    @app.get("/api/v1/search.csv")
    def search_csv() -> str:
        found = query.search(text_query("q") or "", filters(), *paging())
        response.content_type = "text/csv; charset=utf-8"
        response.set_header("Content-Disposition", 'attachment; filename="moments.csv"')
        return query.as_csv(found)


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
