"""Reading requests: JSON bodies, query parameters and the settings a deep scan may carry;
errors.ClientError for what is wrong."""

from __future__ import annotations

import json
import re
import socket
from datetime import UTC, datetime
from typing import Any

import bottle
from bottle import request, response

from .. import jobs, outbound, store
from ..errors import ClientError, Invalid, NotFound
from ..store import MediaFile

MAX_BODY = 1 << 20
MAX_OFFSET = (1 << 63) - 1  # the largest OFFSET the databases take (a signed 64-bit integer)


def json_body(required: bool = False) -> dict[str, Any]:
    length = request.content_length
    if length > MAX_BODY:
        raise TooLarge()
    raw = request.body.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise TooLarge()
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
    check_text(body)
    return body


def check_text(value: Any) -> None:
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


class TooLarge(ClientError):
    code, status = "payload_too_large", 413

    def __init__(self) -> None:
        super().__init__(f"request body is larger than {MAX_BODY} bytes")


MAX_RETRIES = 100


MAX_TASK_TIMEOUT = 7 * 86400.0


def scan_options(body: dict[str, Any]) -> dict[str, Any]:
    """The job settings a deep-scan or register body may carry, checked (Invalid if not)."""
    options: dict[str, Any] = {}
    for key in ("force", "retry_on_failure"):
        if body.get(key) is not None:
            if not isinstance(body[key], bool):
                raise Invalid(f"{key} must be true or false")
            options[key] = body[key]
    if body.get("callback_url") is not None:
        options["callback_url"] = callback_url(body["callback_url"])
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
        options["not_before"] = timestamp("not_before", body["not_before"])
    return options


def callback_url(value: Any) -> str:
    """A URL the callback sender can POST to: http(s), with a host, of a sane length."""
    if not isinstance(value, str):
        raise Invalid("callback_url must be a string")
    if problem := outbound.url_problem(value):
        raise Invalid(f"callback_url {problem}")
    return value


def not_at(own: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options``, unless their callback_url is this service's own API (on a loopback
    address or its own host name, at its port): POSTed there when the job ends, the
    summary would act on the queue (pause it, clear it, retry the job), not tell anyone."""
    url = options.get("callback_url")
    if not url or not own:
        return options
    import httpx  # here: only a callback URL needs it

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


def timestamp(key: str, value: Any) -> float:
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


def register_fields(body: dict[str, Any]) -> dict[str, Any]:
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
        "options": scan_options(body),
    }


def media_file(file_uuid: str) -> MediaFile:
    record = None
    if canonical := jobs.file_uuid_of(file_uuid):
        found = store.fetch(MediaFile, "SELECT * FROM media_file WHERE file_uuid = ?", canonical)
        record = found[0] if found else None
    if record is None:
        raise NotFound(f"no file {file_uuid!r}")
    return record


def operation_key(route: bottle.Route) -> str:
    """The route's key in openapi.OPERATIONS: "get /api/v1/jobs/{job}"."""
    path = re.sub(r"<(\w+)>", r"{\1}", route.rule)
    return f"{route.method.lower()} {path}"


def check_query(names: frozenset[str]) -> None:
    if unknown := sorted(set(request.query) - names):
        takes = f"it takes {', '.join(sorted(names))}" if names else "it takes none"
        raise Invalid(f"unknown query parameter {unknown[0][:100]!r}; {takes}")


def text_query(key: str) -> str | None:
    """A query value as the client wrote it (bottle gives each byte as a character: "Día"
    would be "DÃ\xada"), given at most once; None when not given."""
    given = request.query.getall(key)
    if len(given) > 1:
        raise Invalid(f"{key} may be given once")
    if not given:
        return None
    try:
        return given[0].encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise Invalid(f"{key} is not UTF-8 text") from None


def csv_query(name: str, allowed: set[str]) -> list[str]:
    # Repeated (?status=a&status=b) as well as comma-separated: each value counts.
    values = [v for given in request.query.getall(name) for v in given.split(",") if v]
    bad = [v for v in values if v not in allowed]
    if bad:
        raise Invalid(f"unknown {name} {bad[0]!r}; one of {', '.join(sorted(allowed))}")
    return values


PAGING = (("limit", 50), ("offset", 0))


def whole(query: bottle.FormsDict, key: str, default: int) -> int:
    """A query's whole number: digits only (int() would take "1_0" and " 5"), at most once."""
    given = query.getall(key)
    if not given:
        return default
    if len(given) > 1 or not re.fullmatch(r"[0-9]{1,30}", given[0]):
        raise ValueError(key)
    return int(given[0])


def paging() -> tuple[int, int]:
    try:
        limit, offset = (whole(request.query, key, default) for key, default in PAGING)
    except ValueError:
        raise Invalid("limit and offset must be whole numbers, each given once") from None
    if not 1 <= limit <= 1000 or not 0 <= offset <= MAX_OFFSET:
        raise Invalid(f"limit must be 1..1000 and offset 0..{MAX_OFFSET}")
    return limit, offset


# The interfaces that name themselves on a request (header ``X-Momentry-Via``), for the
# log's word on who cancelled or cleared what; any other client is "the API".
INTERFACES = {"console": "the console", "cli": "the CLI", "tui": "the TUI"}


def interface() -> str:
    """Which interface sent this request, as the log says it: "the console", "the API"."""
    return INTERFACES.get(request.get_header("X-Momentry-Via", "").lower(), "the API")


def error(status: int, code: str, message: str) -> str:
    response.status = status
    response.content_type = "application/json"
    return json.dumps({"success": False, "error": {"code": code, "message": message}})
