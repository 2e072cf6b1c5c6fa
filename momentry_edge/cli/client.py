"""A small client of the service's HTTP API (API.md), shared by the CLI commands."""

# Each method is one API call and returns the decoded JSON reply. The API's error
# shape becomes ApiError; a service that cannot be reached becomes
# ServiceUnreachable, so callers tell "it said no" from "nobody answered". A 2xx
# reply that is not what API.md documents for that call (another server on the port, a
# broken proxy) becomes UnexpectedReply: it is never taken for a success.

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

from .. import apitoken, registry, runfile
from ..config import Config

if TYPE_CHECKING:
    import httpx

DEFAULT_TIMEOUT = 15.0


class ApiError(Exception):
    """The service answered with an error (``{"success": false, "error": {...}}``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class ServiceUnreachable(Exception):
    """No answer from the service: not running, wrong URL, or too slow."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach momentry-edge at {url} ({reason}); "
            "is the service running? Start it with `momentry-edge run`, or pass --url"
        )
        self.url = url


class UnexpectedReply(Exception):
    """A 2xx reply that is not the documented shape for its request."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"unexpected reply from {url}: {reason}")
        self.url = url


# The fields each reply must carry, with their JSON types: what callers read from it.
# ListOf(kind) is a list of that kind; Maybe(kind) a field that may be left out or null.
class ListOf(NamedTuple):
    item: Any  # a Kind (a NamedTuple of a recursive alias crashes mypy)


class Maybe(NamedTuple):
    kind: Any  # a Kind


Kind = type | tuple[type, ...] | ListOf | Maybe | Mapping[str, Any]
Shape = dict[str, Kind]
OPTIONAL_INT = (int, type(None))
NUMBER = (int, float)
DONE: Shape = {"success": bool}
PAUSED: Shape = {"success": bool, "paused": bool}
PLACED: Shape = {"success": bool, "task_id": str, "position": OPTIONAL_INT}
JOB: Shape = {"task_id": str, "status": str, "file_name": str}
# An entry of the queue (status) or of a job list: what `status` and `jobs` show of it.
LISTED: Shape = JOB | {
    "priority": str,
    "processors": ListOf(str),
    "failed": Maybe(ListOf(str)),
    "position": Maybe(int),
    "progress": Maybe(NUMBER),
    "node": Maybe(str),
    "created_at": Maybe(str),
}
NODE: Shape = {"id": str, "active": int, "max_concurrent": int}
STATISTICS: Shape = {
    "total_processed": Maybe(int),
    "total_failed": Maybe(int),
    "average_time": Maybe(NUMBER),
}
QUEUE_STATUS: Shape = {
    "paused": bool,
    "active_count": int,
    "effective_concurrency": int,
    "max_concurrent": int,
    "dynamic_concurrency": bool,
    "pending_count": int,
    "retrying_count": Maybe(int),
    "queue": ListOf(LISTED),
    "nodes": Maybe(ListOf(NODE)),
    "warnings": Maybe(ListOf(str)),
    "statistics": Maybe(STATISTICS),
}
CONCURRENCY: Shape = {
    "success": bool,
    "max_concurrent": int,
    "dynamic_concurrency": bool,
    "effective_concurrency": int,
}
RESCAN: Shape = {
    "success": bool,
    **dict.fromkeys(("new", "changed", "missing", "unchanged", "settling"), int),
}
JOBS: Shape = {"jobs": ListOf(LISTED), "total": int}
FILE_SUMMARY: Shape = {"file_uuid": str, "file_name": str, "path": str, "state": str}
FILES: Shape = {"files": ListOf(FILE_SUMMARY), "total": int}
SEARCH: Shape = {"hits": ListOf({"file": dict, "snippet": list}), "total": int}
FILE: Shape = FILE_SUMMARY | {"jobs": ListOf({"task_id": str, "status": str})}
# An entry of the dead list: each failed processor's error by name.
DEAD: Shape = {
    "jobs": ListOf(JOB | {"processors": ListOf(str), "error_message": Maybe(str), "failed": dict}),
    "total": int,
}
JOB_LOG: Shape = {"task_id": str, "lines": ListOf(str)}
CANCELLED: Shape = {"success": bool, "message": str, "status": str}
FORGOTTEN: Shape = {
    "success": bool,
    "file_uuid": str,
    "jobs": ListOf(str),
    "results_removed": ListOf(str),
    "source_removed": bool,
    "backups": ListOf(str),
}
REGISTERED: Shape = {
    "success": bool,
    "file_uuid": str,
    "state": str,
    "task_id": (str, type(None)),
    "position": OPTIONAL_INT,
}


class BadToken(ValueError):
    """A token that an HTTP header cannot carry."""


def check_token(token: str) -> None:
    """Raise BadToken unless ``token`` is visible ASCII, all a bearer token may hold.

    Anything else either cannot be encoded into the header or splits it (a newline).
    """
    if not all("!" <= c <= "~" for c in token):
        raise BadToken(
            "cannot be sent in an HTTP header: a token is visible ASCII characters only "
            "(no spaces, control characters or letters such as ä)"
        )


class ApiClient:
    def __init__(self, base_url: str, token: str = "", timeout: float = DEFAULT_TIMEOUT) -> None:
        check_token(token)
        self.base_url = base_url.rstrip("/")
        # Which interface asks: the service's log names it beside what was cancelled.
        headers = {"X-Momentry-Via": "cli"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        import httpx  # here: `run` imports this module but makes no client

        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def speak_as(self, via: str) -> None:
        """Name another interface on the requests from now on ("tui")."""
        self._http.headers["X-Momentry-Via"] = via

    # -- queue ----------------------------------------------------------------------------------

    def queue_status(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """The running jobs and ``limit`` waiting ones from ``offset``, with the counts."""
        params = {"limit": limit, "offset": offset}
        return self._call("GET", "/api/v1/queue/status", QUEUE_STATUS, params=params)

    def pause(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/queue/pause", PAUSED)

    def resume(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/queue/resume", PAUSED)

    def clear(self, folder: str | None = None) -> dict[str, Any]:
        """Cancel the waiting jobs (those of ``folder`` and its subfolders, if given)."""
        body = {"json": {"folder": folder}} if folder is not None else {}
        return self._call("POST", "/api/v1/queue/clear", DONE | {"cleared": int}, **body)

    def drain(self, undo: bool = False) -> dict[str, Any]:
        """Drain the service's node (running jobs finish, none starts), or undo that."""
        shape = DONE | {"node": str, "drained": bool, "running": int}
        return self._call("DELETE" if undo else "POST", "/api/v1/node/drain", shape)

    def retry_failed(self, folder: str | None = None) -> dict[str, Any]:
        """Re-queue the failed and partial jobs (those of ``folder``, if given)."""
        body = {"json": {"folder": folder}} if folder is not None else {}
        shape = DONE | {"retried": int, "task_ids": ListOf(str), "refused": ListOf(dict)}
        return self._call("POST", "/api/v1/queue/retry", shape, **body)

    def rescan(self) -> dict[str, Any]:
        # New files are probed one by one: a first rescan of a full folder takes a while.
        return self._call("POST", "/api/v1/files/rescan", RESCAN, timeout=600)

    def set_concurrency(
        self, max_concurrent: int | None = None, dynamic: bool | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if max_concurrent is not None:
            body["max_concurrent"] = max_concurrent
        if dynamic is not None:
            body["dynamic_concurrency"] = dynamic
        return self._call("PUT", "/api/v1/queue/concurrency", CONCURRENCY, json=body)

    def prioritize(self, file_uuid: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/queue/prioritize/{_seg(file_uuid)}", PLACED)

    def prioritize_job(self, ref: str) -> dict[str, Any]:
        """Move the waiting job ``ref`` names (any id) to the top: the API takes its file's."""
        job = self._call("GET", f"/api/v1/jobs/{_seg(ref)}", JOB | {"file_uuid": str})
        return self.prioritize(job["file_uuid"])

    def set_priority(self, task_id: str, priority: str) -> dict[str, Any]:
        path = f"/api/v1/queue/task/{_seg(task_id)}/priority"
        return self._call("PUT", path, PLACED, json={"priority": priority})

    # -- jobs -----------------------------------------------------------------------------------

    def jobs(
        self,
        statuses: list[str] | None = None,
        limit: int = 50,
        offset: int = 0,
        folder: str | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if statuses:
            params["status"] = ",".join(statuses)
        if folder is not None:
            params["folder"] = folder
        return self._call("GET", "/api/v1/jobs", JOBS, params=params)

    def dead(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        """Failed and partial jobs that are still failures, newest first."""
        params = {"limit": limit, "offset": offset}
        return self._call("GET", "/api/v1/queue/dead", DEAD, params=params)

    def job(self, ref: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/jobs/{_seg(ref)}", JOB)

    def retry(self, ref: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/jobs/{_seg(ref)}/retry", PLACED)

    def health(self) -> dict[str, Any]:
        """Liveness, and (asked on loopback) the service's account and data dir."""
        return self._call("GET", "/healthz", {"status": str})

    def job_log(self, ref: str, limit: int) -> dict[str, Any]:
        """The job's log lines, the service's own and those other nodes kept."""
        params = {"limit": limit}
        return self._call("GET", f"/api/v1/jobs/{_seg(ref)}/log", JOB_LOG, params=params)

    def cancel(self, ref: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/jobs/{_seg(ref)}/cancel", CANCELLED)

    # -- files ----------------------------------------------------------------------------------

    def register(
        self,
        path: str,
        processors: list[str] | None = None,
        priority: str = "normal",
        force: bool = False,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"path": path, "priority": priority}
        if force:
            body["force"] = True
        if processors:
            body["processors"] = processors
        return self._call("POST", "/api/v1/files/register", REGISTERED, json=body)

    def file(self, file_uuid: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/files/{_seg(file_uuid)}", FILE)

    def forget(self, file_uuid: str, delete_source: bool = False) -> dict[str, Any]:
        body = {"delete_source": True} if delete_source else {}
        # It waits for a running job of the file to stop (up to 30 s).
        return self._call(
            "POST", f"/api/v1/files/{_seg(file_uuid)}/forget", FORGOTTEN, json=body, timeout=120
        )

    def files(self, limit: int = 1000, offset: int = 0, name: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if name:  # a part of the name (any case or accents)
            params["name"] = name
        return self._call("GET", "/api/v1/files", FILES, params=params)

    def search(self, q: str, limit: int = 20, **filters: str | None) -> dict[str, Any]:
        params = {"q": q, "limit": limit} | {k: v for k, v in filters.items() if v}
        return self._call("GET", "/api/v1/search", SEARCH, params=params)

    def result(self, file_uuid: str, processor: str) -> dict[str, Any]:
        path = f"/api/v1/files/{_seg(file_uuid)}/results/{_seg(processor)}"
        return self._call("GET", path, {})

    def job_detail(self, ref: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/jobs/{_seg(ref)}", JOB | {"processors": dict})

    # -- plumbing -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, shape: Shape, **kwargs: Any) -> dict[str, Any]:
        import httpx  # loaded by __init__ already

        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServiceUnreachable(self.base_url, "no answer in time") from None
        except httpx.DecodingError as exc:  # e.g. "Content-Encoding: gzip" on a plain body
            raise UnexpectedReply(self.base_url, f"cannot decode the body: {exc}") from None
        except httpx.TransportError as exc:
            raise ServiceUnreachable(self.base_url, str(exc) or type(exc).__name__) from None
        try:
            data = reply.json()
        except (ValueError, RecursionError):  # not JSON, or nested too deep to decode
            data = None
        if not reply.is_success:
            raise _api_error(self.base_url, reply, data)
        problem = _shape_problem(data, shape)
        if problem:
            raise UnexpectedReply(self.base_url, f"{method} {path}: {problem}")
        return data


def _shape_problem(data: Any, shape: Mapping[str, Kind]) -> str | None:
    """Why ``data`` is not a reply of ``shape`` (None when it is)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if "success" in data and data["success"] is not True:
        return f"success is {json.dumps(data['success'])[:40]}"
    for key, kind in shape.items():
        if isinstance(kind, Maybe):
            if data.get(key) is None:
                continue
            kind = kind.kind
        problem = _kind_problem(data.get(key), kind) if key in data else "missing"
        if problem:
            return f"{key!r}: {problem}"
    return None


def _kind_problem(value: Any, kind: Kind) -> str | None:
    if isinstance(kind, Mapping):
        return _shape_problem(value, kind)
    if isinstance(kind, ListOf):
        if not isinstance(value, list):
            return "not a list"
        for item in value:
            problem = _kind_problem(item, kind.item)
            if problem:
                return f"an entry: {problem}"
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON true is not a number here: a count of True is as wrong as a missing one.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        return f"not {_json_type(kinds)}"
    return None


def _json_type(kinds: tuple[type, ...]) -> str:
    names = {bool: "true/false", int: "a number", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object", type(None): "null"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def _api_error(url: str, reply: httpx.Response, data: Any) -> ApiError | UnexpectedReply:
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and "message" in error:
        return ApiError(reply.status_code, str(error.get("code", "")), str(error["message"]))
    # Not the API's error shape: e.g. a proxy in front, or a different server on that port,
    # whose page (HTML, say) is no message for a terminal.
    kind = reply.headers.get("Content-Type", "").split(";")[0].strip() or "no content type"
    return UnexpectedReply(
        url, f"HTTP {reply.status_code} {reply.reason_phrase} ({kind}), not an API error"
    )


def _seg(value: str) -> str:
    # Job refs and uuids are plain tokens, but a typo must not turn into another route.
    return quote(str(value), safe="")


class Found(NamedTuple):
    url: str
    how: str  # how it was found, as `status` says it
    entry: dict[str, Any] | None = None  # the service's registry entry, when found there


def find_service(cfg: Config) -> Found:
    """The local service: from its run file in the data dir while it runs; else, when the
    config names no host or port, the one this user's registry lists (registry.py, e.g. a
    service started by launchd with a config file of its own); else the config's URL.
    """
    info = runfile.holder(cfg.data_dir)
    url = info.get("url") if isinstance(info, dict) else None
    if isinstance(url, str):
        return Found(url, f"the run file in {cfg.data_dir}")
    if not {"service.host", "service.port"} & set(cfg.origins):
        for entry in registry.running():
            if isinstance(entry.get("url"), str):
                how = (
                    f"the registry in {registry.folder()} (pid {entry.get('pid')}, data dir "
                    f"{entry.get('data_dir')}, settings "
                    f"{entry.get('config') or 'defaults and environment'})"
                )
                return Found(entry["url"], how, entry)
    origins = {cfg.origin(k) for k in ("service.host", "service.port")} - {"default"}
    return Found(cfg.url, f"the settings ({', '.join(sorted(origins)) or 'defaults'})")


def default_url(cfg: Config) -> str:
    """The local service's URL (find_service)."""
    return find_service(cfg).url


class Token(NamedTuple):
    value: str
    source: str  # where it came from, for an error that names it
    owner: str = ""  # set when the service's token file is another account's: whose


TOKEN_VARIABLES = ("MOMENTRY_SERVICE_TOKEN", "MOMENTRY_API_TOKEN")  # the config's order


def find_token(cfg: Config, found: Found, given: str | None = None) -> Token:
    """The token to send to the service ``found``: ``given`` (--token); else the config's
    (its file or environment); else the one in that service's token file, read from its
    data dir as its URL was found (the run file, the registry). Only the service's own
    account can read that file: for another, ``owner`` names the service's."""
    if given is not None:
        return Token(given, "--token")
    if cfg.service.token:
        var = next((v for v in TOKEN_VARIABLES if v in os.environ), None)
        return Token(cfg.service.token, var or f"service.token in {cfg.source or 'the config'}")
    data_dir = _data_dir_of(cfg, found)
    mine = data_dir is not None
    data_dir = data_dir or cfg.data_dir
    try:
        value = apitoken.read(data_dir)
    except PermissionError:
        return Token("", str(apitoken.path(data_dir)), apitoken.owner(data_dir))
    except OSError:
        value = ""
    if not (value and mine):  # a token file of another service is never sent
        return Token("", "no token set or found")
    return Token(value, f"the token file {apitoken.path(data_dir)}")


def _data_dir_of(cfg: Config, found: Found) -> Path | None:
    """The data dir of the service ``found`` when it is one of this account's: the one
    its registry entry or run file names (for --url, the entry or run file of that URL)."""
    if found.entry is not None:
        data_dir = found.entry.get("data_dir")
        return Path(data_dir) if isinstance(data_dir, str) else None
    if found.how != "--url":
        return cfg.data_dir
    url = found.url.rstrip("/")
    for entry in registry.running():
        if str(entry.get("url", "")).rstrip("/") == url:
            return _data_dir_of(cfg, Found(url, "the registry", entry))
    local = find_service(cfg)
    if local.url.rstrip("/") == url:
        return _data_dir_of(cfg, local)
    return None


class Owner(NamedTuple):
    account: str  # the service's account, as the service says it ("" when it does not)
    data_dir: str

    @property
    def mine(self) -> bool:
        import getpass

        return not self.account or self.account == getpass.getuser()

    def said(self, url: str) -> str:
        """Whose service answers at ``url``, for a line of status or doctor."""
        import getpass

        if not self.account:
            return ""
        whose = "this account's" if self.mine else f"account {self.account}'s"
        text = f"{whose}, data dir {self.data_dir}"
        if not self.mine:
            text += (
                f"; not this account's ({getpass.getuser()}): this account's service is not"
                f" running, and another's holds {url} (start your own on another port:"
                " service.port)"
            )
        return text


def owner(api: ApiClient) -> Owner:
    """Whose the service behind ``api`` is (its /healthz says so to a loopback client);
    Owner("", "") when it does not say. ServiceUnreachable goes through: what was to be
    asked next would wait for it again."""
    try:
        health = api.health()
    except (ApiError, UnexpectedReply):
        return Owner("", "")
    account, data_dir = health.get("account"), health.get("data_dir")
    if not isinstance(account, str) or not isinstance(data_dir, str):
        return Owner("", "")
    return Owner(account, data_dir)


def refused_hint(token: Token) -> str:
    """What to do when the service refused ``token``."""
    if token.owner:
        import getpass

        return (
            f"this service belongs to account {token.owner}; its token ({token.source}) is "
            f"readable by that account only, not by {getpass.getuser()}: run the command as "
            f"{token.owner}, or pass --token"
        )
    return "pass --token or set MOMENTRY_API_TOKEN"
