"""POST a job's summary to its ``callback_url`` when it ends, off the worker threads.

Deliveries are retried with doubling delays; a worker never waits on a client's
server. Pending deliveries live in memory: a restart drops them (the job's state
in the API is the lasting record).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from .events import Event

log = logging.getLogger(__name__)

# (url or None, payload) for a task id; None when the job asked for no callback.
Summarize = Callable[[str], tuple[str | None, dict[str, Any]]]


class CallbackSender:
    def __init__(
        self,
        summarize: Summarize,
        *,
        attempts: int = 6,
        first_delay: float = 1.0,
        timeout: float = 10.0,
    ) -> None:
        self._summarize = summarize
        self._attempts = attempts
        self._first_delay = first_delay
        self._timeout = timeout
        self._due: list[tuple[float, str, int]] = []  # (when, task_id, attempt)
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="callbacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()

    def on_event(self, event: Event) -> None:
        """Bus listener: queue a delivery for every job that ends."""
        if event["type"] == "job.finished":
            self._schedule(event["task_id"], attempt=1, delay=0.0)

    def _schedule(self, task_id: str, attempt: int, delay: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (time.monotonic() + delay, task_id, attempt))
            self._wake.notify()

    def _loop(self) -> None:
        with httpx.Client(timeout=self._timeout, follow_redirects=False) as client:
            while (item := self._next()) is not None:
                task_id, attempt = item
                try:
                    self._deliver(client, task_id, attempt)
                except Exception:  # a bad summary must not end deliveries for other jobs
                    log.exception("job %s: callback failed", task_id, extra={"task_id": task_id})

    def _next(self) -> tuple[str, int] | None:
        """Wait for the next due delivery; None once stopping."""
        with self._wake:
            while not self._stopping:
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    _, task_id, attempt = heapq.heappop(self._due)
                    return task_id, attempt
                self._wake.wait(self._due[0][0] - now if self._due else None)
        return None

    def _deliver(self, client: httpx.Client, task_id: str, attempt: int) -> None:
        url, payload = self._summarize(task_id)
        if not url:
            return
        extra = {"task_id": task_id}
        try:
            reply = client.post(url, json=payload)
            if reply.is_success:
                log.info("job %s: callback delivered to %s", task_id, url, extra=extra)
                return
            problem = f"HTTP {reply.status_code}"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if attempt >= self._attempts:
            log.error(
                "job %s: callback to %s gave up after %d attempts (%s)",
                task_id,
                url,
                attempt,
                problem,
                extra=extra,
            )
            return
        delay = self._first_delay * 2 ** (attempt - 1)
        log.warning(
            "job %s: callback to %s failed (%s); retrying in %.0f s",
            task_id,
            url,
            problem,
            delay,
            extra=extra,
        )
        self._schedule(task_id, attempt + 1, delay)
