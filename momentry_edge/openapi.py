"""The OpenAPI 3 document of the HTTP API."""

from __future__ import annotations

from typing import Any


def openapi_document(version: str) -> dict[str, Any]:
    return {"openapi": "3.0.3", "info": {"title": "momentry-edge", "version": version}, "paths": {}}
