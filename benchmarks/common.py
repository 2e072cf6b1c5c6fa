"""What the benchmarks share: the tests' helpers (media, scratch databases) and an
in-process service."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from databases import PG_ADMIN_URL, scratch_postgres

from momentry_edge import config as config_module
from momentry_edge.events import bus
from momentry_edge.service import Service

__all__ = ["PG_ADMIN_URL", "running_service", "scratch_postgres"]


@contextlib.contextmanager
def running_service(cfg: config_module.Config) -> Iterator[Service]:
    """An in-process Service with its housekeeping loop in a thread, as `run` has it.

    The service logs at its configured level (info) to its log file as usual; its
    stderr handler goes to /dev/null so that the table stays readable. What a
    Service leaves behind in the process (log handlers, event-bus listeners) is
    removed afterwards, so that the next Service measured starts clean.
    """
    root = logging.getLogger()
    handlers, listeners = list(root.handlers), list(bus._listeners)
    with open(os.devnull, "w") as devnull:
        service = Service(cfg)
        with contextlib.redirect_stderr(devnull):
            service.start()
        loop = threading.Thread(target=service.run_forever, name="housekeeping", daemon=True)
        loop.start()
        try:
            yield service
        finally:
            service.stopping.set()
            loop.join()
            service.stop()
            bus._listeners[:] = listeners  # Service.start adds listeners; stop removes none
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
