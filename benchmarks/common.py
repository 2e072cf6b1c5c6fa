"""What the benchmarks share: the tests' helpers (media, scratch databases), an
in-process service and a real `momentry-edge run` process."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from databases import PG_ADMIN_URL, scratch_postgres

from momentry_edge import config as config_module
from momentry_edge.events import bus
from momentry_edge.service import Service

ROOT = Path(__file__).resolve().parent.parent  # this checkout
# The services measured ask no API token: its check (one constant-time compare a request)
# is not what these benchmarks measure, and their clients stay plain.
NO_TOKEN = "auth = false\n"

__all__ = ["PG_ADMIN_URL", "ROOT", "running_service", "scratch_postgres", "service_process"]


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
    if not cfg.service.token:  # see NO_TOKEN
        cfg = dataclasses.replace(cfg, service=dataclasses.replace(cfg.service, auth=False))
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


@contextlib.contextmanager
def service_process(
    root: Path, extra_config: str = "", checkout: Path = ROOT, wait: float = 60
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real `momentry-edge run` of ``checkout`` (this one unless told) on a free loopback
    port, with its data in ``root``/data and watching ``root``/drop; yields its URL and
    process. ``wait``: seconds it may take to start, and to stop.

    ``extra_config`` is TOML appended to the config file (after its [service] table).
    The process gets SIGTERM at the end.
    """
    (root / "drop").mkdir(parents=True, exist_ok=True)
    config = root / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{root / "data"}"\nwatch = ["{root / "drop"}"]\nport = 0\n'
        + NO_TOKEN
        + extra_config,
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), "run"],
        env=env,
        cwd=checkout,  # `-m` looks in the working directory first
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_file = root / "data" / "run.json"
        deadline = time.monotonic() + wait
        while True:
            with contextlib.suppress(OSError, ValueError):
                info = json.loads(run_file.read_text())
                if info["pid"] == proc.pid:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the service did not start")
            time.sleep(0.1)
        yield info["url"], proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=wait)
