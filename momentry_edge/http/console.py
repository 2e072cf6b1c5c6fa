"""The web console's routes: the page at ``/`` (static files in ``static/``, no build step,
nothing fetched from elsewhere), the subtitle files, and Dismiss. The page itself reads
and acts through the same /api/ routes as any client, with the same token and rules."""

from __future__ import annotations

import logging
import re
from importlib import resources
from typing import Any

import bottle
from bottle import response

from .. import jobs, outputs, stored_results
from ..errors import NotFound
from .parsing import interface

log = logging.getLogger(__name__)

# The page's own files: name -> content type. Nothing else is served from the folder.
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
SUBTITLES = {"srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}
# asr's or asrx's subtitles: all of them, or one source's (a track, or a channel of one).
SUBTITLE_NAME = re.compile(r"asrx?((?:\.track\d{1,3})(?:\.left|\.right)?)?")
# The page loads only its own files and talks only to this service; images of its own
# come as blob: URLs (fetched with the token, when one is set). Never framed.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


def _asset(name: str) -> bytes:
    return (resources.files("momentry_edge") / "static" / name).read_bytes()


def _page_headers(content_type: str) -> None:
    response.content_type = content_type
    response.set_header("Content-Security-Policy", POLICY)
    response.set_header("X-Content-Type-Options", "nosniff")
    response.set_header("Referrer-Policy", "no-referrer")
    response.set_header("Cache-Control", "no-cache")  # a new version is picked up at once


def add_routes(app: bottle.Bottle, service: Any, find_file: Any) -> None:
    """Add the console's routes to ``app``. Before the results route: ``asr.srt`` would
    otherwise be taken for a processor's name there."""

    @app.get("/")
    def page() -> bytes:
        _page_headers("text/html; charset=utf-8")
        html = _asset("index.html")
        if service.token:  # the page asks for it before any request
            html = html.replace(b'<html lang="en">', b'<html lang="en" data-token="required">', 1)
        return html

    @app.get("/console/static/<asset>")
    def asset(asset: str) -> bytes:
        if asset not in ASSETS:
            raise bottle.HTTPError(404, f"no console file {asset[:100]!r}")
        _page_headers(ASSETS[asset])
        return _asset(asset)

    @app.get("/api/v1/files/<file_uuid>/results/<processor>.<format>")
    def subtitles(file_uuid: str, processor: str, format: str) -> bytes:
        # ``processor`` may name one source's file: asr.track1, asr.track0.left
        record = find_file(file_uuid)
        found = SUBTITLE_NAME.fullmatch(processor)
        if format not in SUBTITLES or found is None:
            raise NotFound(
                f"no {processor[:100]}.{format[:20]}: subtitles are asr or asrx "
                "(or one track's: asr.track1, asr.track0.left), srt or vtt"
            )
        content = stored_results.read_sidecar(record, f"{processor}.{format}")
        if content is None:  # written before the database kept them
            folders = outputs.result_folders(service.config.data_dir, record)
            content = outputs.read_sidecar(folders, f"{processor}.{format}")
        if content is None:
            raise NotFound(f"{processor} has no {format} subtitles for file {file_uuid}")
        response.content_type = SUBTITLES[format]
        name = _safe_name(record.name.rsplit(".", 1)[0]) + (found.group(1) or "")
        response.set_header("Content-Disposition", f'attachment; filename="{name}.{format}"')
        return content

    @app.post("/api/v1/jobs/<job>/dismiss")
    def dismiss(job: str) -> dict:
        found = jobs.find_job(job)
        jobs.dismiss(found)
        log.info(
            "job %s (%s, %s) dismissed through %s",
            found.task_id,
            found.file.name,
            found.status,
            interface(),
            extra={"task_id": found.task_id},
        )
        return {"success": True, "task_id": found.task_id, "dismissed": True}


def _safe_name(name: str) -> str:
    """A file name for Content-Disposition: ASCII letters, digits, ``-_. `` only."""
    kept = "".join(c if c.isascii() and (c.isalnum() or c in "-_. ") else "_" for c in name)
    return kept.strip() or "subtitles"
