"""What the HTTP routes need of the service (the Core protocol)."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from ..config import Config
from ..jobs import order
from ..jobs.capacity import Here
from ..store import Job, MediaFile


class Core(Protocol):
    """What the routes need of the service (service.Service provides it), and no more: its
    settings and the steps that need its parts (the registry, the intake). What needs no
    more than the database, the routes ask of jobs/ and its views directly."""

    config: Config
    stopping: threading.Event  # set at shutdown: event streams end
    url: str  # where the API listens, http://host:port ("" until it does)
    token: str  # the token every request for data must carry; "" with service.auth = false
    node: str  # this node's id: its own concurrency settings

    @property
    def processor_names(self) -> tuple[str, ...]: ...

    def processors(self) -> dict[str, dict[str, Any]]: ...

    def effective_limit(self) -> int: ...

    def here(self) -> Here: ...

    def drain(self, drained: bool, via: str) -> int: ...

    def jobs_in_hand(self) -> set[int]: ...

    def queue_status(
        self, limit: int = 50, offset: int = 0, shown: order.Shown = order.EVERY_WAITING_JOB
    ) -> dict[str, Any]: ...

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
