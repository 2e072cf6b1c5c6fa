"""The HTTP API: the bottle app and its routes, OpenAPI, /metrics and the waitress server."""
