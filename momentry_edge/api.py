"""The HTTP API (bottle): routes parse, call one core function, render.

Client mistakes raise errors.ClientError anywhere below; ``_json_api`` turns
them, and bottle's own 404/405, into API.md's error shape in one place.
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import re
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import bottle
import httpx
from bottle import request, response

from . import __version__, db, hooks, jobs, outbound, outputs, views
from .config import Config
from .db import FileState, Job, JobStatus, MediaFile
from .errors import ClientError, Invalid, NotFound
from .events import bus
from .metrics import render_metrics
from .openapi import DEEP_SCAN_KEYS, OPERATIONS, openapi_document

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
MAX_OFFSET = (1 << 63) - 1  # the largest OFFSET the databases take (a signed 64-bit integer)
FILE_UUID = re.compile(r"[0-9a-fA-F]{32}")
SSE_KEEPALIVE = 5.0  # also how soon a vanished reader's thread is freed
# Each open event stream holds a server thread; past this many, new ones are refused
# so that the API itself always has threads left.
MAX_EVENT_STREAMS = 16


def _error(status: int, code: str, message: str) -> str:
    response.status = status
    response.content_type = "application/json"
    return json.dumps({"success": False, "error": {"code": code, "message": message}})


class Core(Protocol):
    """What the routes need of the service (service.Service provides it), and no more."""

    config: Config
    stopping: threading.Event  # set at shutdown: event streams end
    url: str  # where the API listens, http://host:port ("" until it does)

    @property
    def processor_names(self) -> tuple[str, ...]: ...

    def processors(self) -> dict[str, dict[str, Any]]: ...

    def effective_limit(self) -> int: ...

    def queue_status(self) -> dict[str, Any]: ...

    def submit(
        self,
        record: MediaFile,
        processors: Any,
        priority: Any,
        options: dict[str, Any] | None = None,
    ) -> tuple[Job, bool]: ...

    def register(
        self,
        raw_path: str,
        *,
        upload_ok: bool = True,
        scan: bool = True,
        processors: Any = None,
        priority: Any = "normal",
        options: dict[str, Any] | None = None,
    ) -> tuple[MediaFile, Job | None, bool]: ...

    def rescan(self) -> dict[str, int]: ...


def make_app(service: Core) -> bottle.Bottle:
    app = bottle.Bottle(catchall=True)
    app.config["json.enable"] = True
    # Strict JSON answers: NaN or Infinity would be an error, not an answer no parser reads.
    app.uninstall("json")
    app.install(bottle.JSONPlugin(lambda value: json.dumps(value, allow_nan=False)))

    @app.hook("before_request")
    def authenticate() -> None:
        # Before routing: without the token, a known and an unknown /api/ path look alike.
        token = service.config.service.token
        given = request.get_header("Authorization", "")
        if token and request.path.startswith("/api/") and not _bearer_matches(given, token):
            raise bottle.HTTPResponse(
                _error(401, "unauthorized", "missing or wrong bearer token"),
                401,
                {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"},
            )

    @app.hook("before_request")
    def addressed_here() -> None:
        # DNS rebinding: a web page whose own name its DNS now points at 127.0.0.1 reaches
        # this port as its own origin (Origin matching Host), free to read and change the
        # queue. Without a token, only requests addressed to a name of this machine are
        # served; such a page's requests carry its name. With one, the token guards.
        if service.config.service.token:
            return
        host = request.get_header("Host")
        if host is None or _names_this_machine(host, service.config.service.host):
            return
        raise bottle.HTTPResponse(
            _error(403, "forbidden", f"refused: addressed to host {host[:200]!r}, not this one"),
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
                _error(403, "forbidden", f"refused: sent by the web page at {origin[:200]!r}"),
                403,
                {"Content-Type": "application/json"},
            )

    def json_api(callback: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                if (names := query_names.get(request.route)) is not None:
                    _check_query(names)
                return callback(*args, **kwargs)
            except ClientError as exc:
                return _error(exc.status, exc.code, exc.message)
            except db.OUTAGE_ERRORS as exc:
                # The database busy past its timeout, or unreachable: not the client's
                # mistake, and worth asking again shortly.
                log.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
                response.set_header("Retry-After", "5")
                db.after_outage()
                return _error(503, "unavailable", f"the queue database is unavailable: {exc}")
            finally:
                db.release_connection()

        return wrapper

    app.install(json_api)

    for status, code in (
        (400, "bad_request"),
        (404, "not_found"),
        (405, "method_not_allowed"),
        (413, "payload_too_large"),
    ):
        app.error(status)(
            lambda err, status=status, code=code: _error(
                status, code, err.body or "no such endpoint"
            )
        )

    @app.error(500)
    def internal(err: bottle.HTTPError) -> str:
        log.error("%s %s failed:\n%s", request.method, request.path, err.traceback)
        return _error(500, "internal", "internal error; see the service log")

    # -- service ------------------------------------------------------------------------------

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "version": __version__}

    @app.get("/openapi.json")
    def openapi() -> dict:
        return openapi_document(__version__)

    @app.get("/metrics")
    def metrics() -> str:
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
        return _event_stream(service)

    # -- queue ---------------------------------------------------------------------------------

    @app.post("/api/v1/file/<file_uuid>/deep-scan")
    def deep_scan(file_uuid: str) -> dict:
        body = _body()
        if unknown := sorted(set(body) - DEEP_SCAN_KEYS):
            # A misspelt key (say "priorty") would otherwise be queued as if not asked.
            raise Invalid(f"unknown key {unknown[0]!r}; known: {', '.join(sorted(DEEP_SCAN_KEYS))}")
        record = _file(file_uuid)
        if record.state != FileState.PRESENT:
            raise Invalid(f"file {file_uuid} is {record.state}: {record.reason or 'not on disk'}")
        job, created = service.submit(
            record,
            body.get("processors", list(service.config.ingest.processors)),
            body.get("priority", "normal"),
            options=_not_at(service.url, _scan_options(body)),
        )
        response.status = 202 if created else 200
        return _queued(job) | {"deduplicated": not created}

    @app.get("/api/v1/queue/status")
    def queue_status() -> dict:
        return service.queue_status()

    @app.post("/api/v1/queue/pause")
    def pause() -> dict:
        return {"success": True, "paused": jobs.set_paused(True).paused}

    @app.post("/api/v1/queue/resume")
    def resume() -> dict:
        state = jobs.set_paused(False)
        return {"success": True, "paused": state.paused}

    @app.post("/api/v1/queue/clear")
    def clear() -> dict:
        return {"success": True, "cleared": jobs.clear()}

    @app.post("/api/v1/queue/prioritize/<file_uuid>")
    def prioritize(file_uuid: str) -> dict:
        job = jobs.prioritize(jobs.waiting_job(_file(file_uuid).file_uuid))
        return {"success": True, "task_id": job.task_id, "position": jobs.position(job)}

    @app.put("/api/v1/queue/task/<task_id>/priority")
    def set_priority(task_id: str) -> dict:
        body = _body(required=True)
        job = jobs.set_priority(jobs.find_job(task_id), jobs.parse_priority(body.get("priority")))
        return {"success": True, "task_id": job.task_id, "position": jobs.position(job)}

    @app.delete("/api/v1/queue/task/<task_id>")
    def delete_task(task_id: str) -> dict:
        return _cancel(task_id)

    @app.put("/api/v1/queue/concurrency")
    def concurrency() -> dict:
        body = _body(required=True)
        if "max_concurrent" not in body and "dynamic_concurrency" not in body:
            raise Invalid("give max_concurrent and/or dynamic_concurrency")
        state = jobs.set_concurrency(
            body.get("max_concurrent"),
            body.get("dynamic_concurrency"),
            ceiling=service.config.queue.worker_threads,
            node=service.node,  # this node's: machines sharing a queue differ
        )
        return {
            "success": True,
            "max_concurrent": state.max_concurrent,
            "dynamic_concurrency": state.dynamic_concurrency,
            "effective_concurrency": service.effective_limit(),
        }

    @app.get("/api/v1/queue/dead")
    def dead() -> dict:
        limit, offset = _paging()
        return views.dead_jobs(limit, offset)

    # -- jobs ----------------------------------------------------------------------------------

    @app.get("/api/v1/jobs")
    def list_jobs() -> dict:
        statuses = _csv_query("status", {*db.FINAL_STATES, *db.ACTIVE_STATES})
        limit, offset = _paging()
        return views.list_jobs(statuses, limit, offset)

    @app.get("/api/v1/jobs/<job>")
    def job_detail(job: str) -> dict:
        return views.job_detail(jobs.find_job(job), service.effective_limit())

    @app.post("/api/v1/jobs/<job>/retry")
    def retry(job: str) -> dict:
        retried = jobs.retry(jobs.find_job(job))
        return {
            "success": True,
            "task_id": retried.task_id,
            "status": retried.status,
            "position": jobs.position(retried),
        }

    @app.post("/api/v1/jobs/<job>/cancel")
    def cancel(job: str) -> dict:
        return _cancel(job)

    # -- files ---------------------------------------------------------------------------------

    @app.post("/api/v1/files/register")
    def register() -> dict:
        body = _body(required=True)
        raw = body.get("path")
        if not isinstance(raw, str) or not raw:
            raise Invalid("path is required" if raw is None else "path must be a non-empty string")
        fields = _register_fields(body)
        _not_at(service.url, fields["options"])
        record, job, created = service.register(raw, **fields)
        response.status = 201 if created else 200
        reply = {
            "success": True,
            "file_uuid": record.file_uuid,
            "state": record.state,
            "reason": record.reason,
            "task_id": None,
            "position": None,
            # Not created: the same unchanged file was registered before; its job is returned.
            "deduplicated": job is not None and not created,
        }
        if job is not None:
            reply |= {"task_id": job.task_id, "position": jobs.position(job)}
        return reply

    @app.post("/api/v1/hooks/sftpgo")
    def sftpgo_hook() -> dict:
        upload = hooks.sftpgo_upload(_body(required=True), service.config.service.watch)
        if upload is None:
            return {"success": True, "ignored": True, "reason": "not an upload"}
        if not upload.ok and not upload.path.exists():
            # SFTPGo removes what a failed (e.g. over-quota) upload left: nothing to record.
            return {"success": True, "ignored": True, "reason": "the failed upload left no file"}
        if (kept := hooks.untouched(upload)) is not None:
            # SFTPGo's atomic upload mode: the failed one never replaced the file.
            reason = f"the failed upload left {kept.name} as it was registered: nothing changed"
            return {"success": True, "ignored": True, "reason": reason}
        record, job, created = service.register(str(upload.path), upload_ok=upload.ok)
        response.status = 201 if created else 200
        return {
            "success": True,
            "file_uuid": record.file_uuid,
            "state": record.state,
            "reason": record.reason,
            "task_id": job.task_id if job else None,
            "position": jobs.position(job) if job else None,
            "deduplicated": job is not None and not created,
        }

    @app.post("/api/v1/files/rescan")
    def rescan() -> dict:
        return {"success": True, **service.rescan()}

    @app.get("/api/v1/files")
    def list_files() -> dict:
        states = _csv_query("state", {FileState.PRESENT, FileState.MISSING, FileState.REJECTED})
        limit, offset = _paging()
        return views.list_files(states, limit, offset)

    @app.get("/api/v1/files/<file_uuid>")
    def file_detail(file_uuid: str) -> dict:
        return views.file_detail(_file(file_uuid))

    @app.get("/api/v1/files/<file_uuid>/results/<processor>")
    def results(file_uuid: str, processor: str) -> Any:
        record = _file(file_uuid)
        if processor not in service.processor_names:
            raise NotFound(f"unknown processor {processor!r}")
        folders = outputs.result_folders(service.config.data_dir, record)
        document = outputs.read_result(folders, processor)
        if document is None:
            raise NotFound(f"{processor} has no output for file {file_uuid} yet")
        response.content_type = "application/json"
        return document

    @app.get("/api/v1/files/<file_uuid>/thumbnails/<index>")
    def thumbnail(file_uuid: str, index: str) -> Any:
        record = _file(file_uuid)
        folders = outputs.result_folders(service.config.data_dir, record)
        picture = outputs.scene_thumbnail(folders, index)
        if picture is None:
            raise NotFound(f"file {file_uuid} has no thumbnail for scene {index!r}")
        response.content_type = "image/jpeg"
        return picture

    def _cancel(ref: str) -> dict:
        was = jobs.cancel(jobs.find_job(ref))
        # A running job stops at its next report; "status" tells the two cases apart.
        status = "cancelling" if was == JobStatus.PROCESSING else JobStatus.CANCELLED
        return {"success": True, "message": "Task cancelled", "status": status}

    # The query parameters each /api/ route takes, as its OpenAPI operation names them: any
    # other is refused, as a misspelt filter would widen what a request lists or clears.
    query_names = {
        route: frozenset(OPERATIONS[_operation_key(route)]["parameters"])
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

    def _queued(job: db.Job) -> dict:
        job, position, estimated_start = views.queue_place(job.id, service.effective_limit())
        return {
            "success": True,
            "task_id": job.task_id,
            "status": "queued" if job.status == JobStatus.PENDING else job.status,
            "position": position,
            "estimated_start": estimated_start,
        }

    return app


def _bearer_matches(header: str, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme in any case (RFC 7235), in constant time."""
    scheme, _, given = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


def _names_this_machine(host_header: str, bound: str) -> bool:
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


def _body(required: bool = False) -> dict[str, Any]:
    length = request.content_length
    if length > MAX_BODY:
        raise _TooLarge()
    raw = request.body.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise _TooLarge()
    if not raw.strip():
        if required:
            raise Invalid("a JSON object body is required")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Invalid(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise Invalid("body is nested too deeply") from None
    if not isinstance(body, dict):
        raise Invalid("body must be a JSON object")
    _check_text(body)
    return body


def _check_text(value: Any) -> None:
    """Refuse strings that no path, URL or database column can hold: NUL, lone surrogates."""
    stack = [value]
    while stack:  # not recursive: the body may be nested as deep as the parser allows
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item, *item.values()]
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str):
            if "\x00" in item:
                raise Invalid(f"text in the body must not hold NUL characters: {item[:80]!r}")
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    raise Invalid(f"text in the body is not valid Unicode: {item[:80]!r}") from None


class Busy(ClientError):
    code, status = "busy", 503


class _TooLarge(ClientError):
    code, status = "payload_too_large", 413

    def __init__(self) -> None:
        super().__init__(f"request body is larger than {MAX_BODY} bytes")


MAX_RETRIES = 100
MAX_TASK_TIMEOUT = 7 * 86400.0


def _scan_options(body: dict[str, Any]) -> dict[str, Any]:
    """The job settings a deep-scan or register body may carry, checked (Invalid if not)."""
    options: dict[str, Any] = {}
    for key in ("force", "retry_on_failure"):
        if body.get(key) is not None:
            if not isinstance(body[key], bool):
                raise Invalid(f"{key} must be true or false")
            options[key] = body[key]
    if body.get("callback_url") is not None:
        options["callback_url"] = _callback_url(body["callback_url"])
    if body.get("max_retries") is not None:
        value = body["max_retries"]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
            raise Invalid(f"max_retries must be a whole number from 0 to {MAX_RETRIES}")
        options["max_retries"] = value
    if body.get("task_timeout") is not None:
        value = body["task_timeout"]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 1 <= value <= MAX_TASK_TIMEOUT
        ):
            raise Invalid(f"task_timeout must be seconds from 1 to {MAX_TASK_TIMEOUT:g}")
        options["task_timeout"] = float(value)
    if body.get("not_before") is not None:
        options["not_before"] = _timestamp("not_before", body["not_before"])
    return options


def _callback_url(value: Any) -> str:
    """A URL the callback sender can POST to: http(s), with a host, of a sane length."""
    if not isinstance(value, str):
        raise Invalid("callback_url must be a string")
    if problem := outbound.url_problem(value):
        raise Invalid(f"callback_url {problem}")
    return value


def _not_at(own: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options``, unless their callback_url is this service's own API (on a loopback
    address or its own host name, at its port): POSTed there when the job ends, the
    summary would act on the queue (pause it, clear it, retry the job), not tell anyone."""
    url = options.get("callback_url")
    if not url or not own:
        return options
    target, me = httpx.URL(url), httpx.URL(own)
    port = target.port or (443 if target.scheme == "https" else 80)
    host = target.host.lower().rstrip(".")
    local = outbound.own_address(host) or host in ("localhost", socket.gethostname().lower())
    if port == me.port and (local or host == me.host.lower()):
        raise Invalid(
            f"callback_url {url[:200]!r} is this service's own API: the job's summary "
            "would be sent to it as a request"
        )
    return options


def _timestamp(key: str, value: Any) -> float:
    """An ISO 8601 time as Unix seconds; one without a zone is taken as UTC."""
    if not isinstance(value, str):
        raise Invalid(f"{key} must be an ISO 8601 time string, e.g. 2026-10-07T10:05:00Z")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Invalid(
            f"{key} is not an ISO 8601 time: {value[:100]!r} (e.g. 2026-10-07T10:05:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)  # a time that cannot be shown in UTC (past the year 9999)
    except OverflowError:
        raise Invalid(f"{key} is out of range: {value[:100]!r}") from None
    return moment.timestamp()


def _register_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The upload hook's fields, type-checked: a string "1" or "false" is not taken as a
    number or a boolean (it would silently mean something else)."""
    status = body.get("upload_status", 1)
    if isinstance(status, bool) or not isinstance(status, int):
        raise Invalid("upload_status must be an integer (1: the upload finished)")
    scan = body.get("scan", True)
    if not isinstance(scan, bool):
        raise Invalid("scan must be true or false")
    processors = body.get("processors")
    if processors is not None and (
        not isinstance(processors, list) or not all(isinstance(n, str) for n in processors)
    ):
        raise Invalid("processors must be a list of processor names")
    priority = body.get("priority", "normal")
    jobs.parse_priority(priority)
    return {
        "upload_ok": status == 1,
        "scan": scan,
        "processors": processors,
        "priority": priority,
        "options": _scan_options(body),
    }


def _file(file_uuid: str) -> MediaFile:
    record = None
    if FILE_UUID.fullmatch(file_uuid):
        found = db.fetch(
            MediaFile, "SELECT * FROM media_file WHERE file_uuid = ?", file_uuid.lower()
        )
        record = found[0] if found else None
    if record is None:
        raise NotFound(f"no file {file_uuid!r}")
    return record


def _operation_key(route: bottle.Route) -> str:
    """The route's key in openapi.OPERATIONS: "get /api/v1/jobs/{job}"."""
    path = re.sub(r"<(\w+)>", r"{\1}", route.rule)
    return f"{route.method.lower()} {path}"


def _check_query(names: frozenset[str]) -> None:
    if unknown := sorted(set(request.query) - names):
        takes = f"it takes {', '.join(sorted(names))}" if names else "it takes none"
        raise Invalid(f"unknown query parameter {unknown[0][:100]!r}; {takes}")


def _csv_query(name: str, allowed: set[str]) -> list[str]:
    # Repeated (?status=a&status=b) as well as comma-separated: each value counts.
    values = [v for given in request.query.getall(name) for v in given.split(",") if v]
    bad = [v for v in values if v not in allowed]
    if bad:
        raise Invalid(f"unknown {name} {bad[0]!r}; one of {', '.join(sorted(allowed))}")
    return values


PAGING = (("limit", 50), ("offset", 0))


def _whole(query: bottle.FormsDict, key: str, default: int) -> int:
    """A query's whole number: digits only (int() would take "1_0" and " 5"), at most once."""
    given = query.getall(key)
    if not given:
        return default
    if len(given) > 1 or not re.fullmatch(r"[0-9]{1,30}", given[0]):
        raise ValueError(key)
    return int(given[0])


def _paging() -> tuple[int, int]:
    try:
        limit, offset = (_whole(request.query, key, default) for key, default in PAGING)
    except ValueError:
        raise Invalid("limit and offset must be whole numbers, each given once") from None
    if not 1 <= limit <= 1000 or not 0 <= offset <= MAX_OFFSET:
        raise Invalid(f"limit must be 1..1000 and offset 0..{MAX_OFFSET}")
    return limit, offset


def _event_stream(service: Core) -> Iterator[str]:
    with bus.subscribe() as events:
        yield ": connected\n\n"
        while not service.stopping.is_set():
            try:
                event = events.get(timeout=SSE_KEEPALIVE)
            except queue.Empty:
                yield ": keep-alive\n\n"
                continue
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
