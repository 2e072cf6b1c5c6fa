"""A reader of the service's event stream, as a front end would use it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx


class EventReader(threading.Thread):
    """Reads /api/v1/events in the background, as a front end would, until ``until(event)``."""

    def __init__(self, url: str, until: Callable[[dict[str, Any]], bool], token: str = "") -> None:
        super().__init__(daemon=True)
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.until = until
        self.events: list[dict[str, Any]] = []
        self.content_type = ""
        self.connected = threading.Event()

    def run(self) -> None:
        with httpx.stream(
            "GET", f"{self.url}/api/v1/events", headers=self.headers, timeout=30
        ) as reply:
            self.content_type = reply.headers["content-type"]
            for line in reply.iter_lines():
                if line.startswith(": connected"):
                    self.connected.set()
                elif line.startswith("data: "):
                    self.events.append(json.loads(line[len("data: ") :]))
                    if self.until(self.events[-1]):
                        return
