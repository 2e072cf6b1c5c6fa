"""A small client of the service's HTTP API (API.md), shared by the CLI commands.

Each method is one API call and returns the decoded JSON reply. The API's error
shape becomes ApiError; a service that cannot be reached becomes
ServiceUnreachable, so callers tell "it said no" from "nobody answered".
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import httpx

from .config import Config

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


class ApiClient:
    def __init__(self, base_url: str, token: str = "", timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- queue ----------------------------------------------------------------------------------

    def queue_status(self) -> dict[str, Any]:
        return self._call("GET", "/api/v1/queue/status")

    def pause(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/queue/pause")

    def resume(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/queue/resume")

    def clear(self) -> dict[str, Any]:
        return self._call("POST", "/api/v1/queue/clear")

    def rescan(self) -> dict[str, Any]:
        # New files are probed one by one: a first rescan of a full folder takes a while.
        return self._call("POST", "/api/v1/files/rescan", timeout=600)

    def set_concurrency(
        self, max_concurrent: int | None = None, dynamic: bool | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if max_concurrent is not None:
            body["max_concurrent"] = max_concurrent
        if dynamic is not None:
            body["dynamic_concurrency"] = dynamic
        return self._call("PUT", "/api/v1/queue/concurrency", json=body)

    def prioritize(self, file_uuid: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/queue/prioritize/{_seg(file_uuid)}")

    def set_priority(self, task_id: str, priority: str) -> dict[str, Any]:
        path = f"/api/v1/queue/task/{_seg(task_id)}/priority"
        return self._call("PUT", path, json={"priority": priority})

    # -- jobs -----------------------------------------------------------------------------------

    def jobs(
        self, statuses: list[str] | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if statuses:
            params["status"] = ",".join(statuses)
        return self._call("GET", "/api/v1/jobs", params=params)

    def job(self, ref: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/jobs/{_seg(ref)}")

    def retry(self, ref: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/jobs/{_seg(ref)}/retry")

    def cancel(self, ref: str) -> dict[str, Any]:
        return self._call("POST", f"/api/v1/jobs/{_seg(ref)}/cancel")

    # -- files ----------------------------------------------------------------------------------

    def register(
        self, path: str, processors: list[str] | None = None, priority: str = "normal"
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"path": path, "priority": priority}
        if processors:
            body["processors"] = processors
        return self._call("POST", "/api/v1/files/register", json=body)

    # -- plumbing -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            reply = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServiceUnreachable(self.base_url, "no answer in time") from None
        except httpx.TransportError as exc:
            raise ServiceUnreachable(self.base_url, str(exc) or type(exc).__name__) from None
        try:
            data = reply.json()
        except ValueError:
            data = None
        if reply.is_success and isinstance(data, dict):
            return data
        raise _api_error(reply, data)


def _api_error(reply: httpx.Response, data: Any) -> ApiError:
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and "message" in error:
        return ApiError(reply.status_code, str(error.get("code", "")), str(error["message"]))
    # Not the API's error shape: e.g. a proxy in front, or a different server on that port.
    text = reply.text.strip()[:200] or reply.reason_phrase
    return ApiError(reply.status_code, "http_error", f"HTTP {reply.status_code}: {text}")


def _seg(value: str) -> str:
    # Job refs and uuids are plain tokens, but a typo must not turn into another route.
    return quote(str(value), safe="")


def default_url(cfg: Config) -> str:
    """The local service's URL: from its run file while it runs, else from the config.

    The run file matters when the port is 0 (chosen at start-up) or was changed
    by an environment variable the client does not see.
    """
    try:
        info = json.loads((cfg.data_dir / "run.json").read_text(encoding="utf-8"))
        os.kill(int(info["pid"]), 0)
        return str(info["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return cfg.url
