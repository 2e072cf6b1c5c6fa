"""The processors this service knows: built-in ones and configured plugins."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from .. import store
from ..errors import Invalid
from .base import PROCESSOR_NAMES, PermanentError, Processor, Readiness

BUILTIN = {
    "asr": "momentry_edge.processors.asr:AsrProcessor",
    "asrx": "momentry_edge.processors.asr:AsrxProcessor",
    "cut": "momentry_edge.processors.cut:CutProcessor",
    "yolo": "momentry_edge.processors.yolo:YoloProcessor",
    "ocr": "momentry_edge.processors.ocr:OcrProcessor",
    "face": "momentry_edge.processors.face:FaceProcessor",
    "pose": "momentry_edge.processors.pose:PoseProcessor",
}


class Unavailable(Processor):
    """A known processor with no backend on this machine: it says so instead of running."""

    backend = "none"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__({})
        self.name = name  # type: ignore[misc]
        self._reason = reason

    def readiness(self) -> Readiness:
        return Readiness(False, self._reason)

    def run(self, ctx: Any) -> dict[str, Any]:
        raise PermanentError(self._reason)


def load_class(spec: str) -> type[Processor]:
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load processor {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Processor)):
        raise ValueError(f"{spec!r} is not a Processor subclass")
    return cls


class Registry:
    def __init__(self, plugins: Iterable[str], settings: Mapping[str, Mapping[str, Any]]) -> None:
        self._settings = settings
        self._classes: dict[str, type[Processor] | str] = {}
        for name in PROCESSOR_NAMES:
            spec = BUILTIN.get(name)
            if spec is None:
                self._classes[name] = f"no backend for {name} is installed in this build"
                continue
            try:
                self._classes[name] = load_class(spec)
            except ValueError as exc:
                self._classes[name] = str(exc)
        for spec in plugins:
            cls = load_class(spec)
            if len(cls.name) > _width("processor"):
                raise ValueError(
                    f"{spec!r}: a processor's name is at most {_width('processor')} characters"
                )
            self._classes[cls.name] = cls

    @property
    def names(self) -> list[str]:
        return list(self._classes)

    def validate(self, names: Any) -> list[str]:
        """The requested processor names, checked, in the order given, without repeats."""
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise Invalid("processors must be a non-empty list of names")
        unknown = [n for n in names if n not in self._classes]
        if unknown:
            raise Invalid(f"unknown processor {unknown[0]!r}; known: {', '.join(self.names)}")
        return list(dict.fromkeys(names))

    def create(self, name: str) -> Processor:
        cls = self._classes.get(name, f"processor {name!r} is not installed on this node")
        if isinstance(cls, str):
            return Unavailable(name, cls)
        return cls(self._settings.get(name, {}))

    def settings_problems(self) -> dict[str, str]:
        """processor name -> what is wrong with its settings, for each processor given
        settings (one whose backend is not installed here cannot tell)."""
        found = {}
        for name in self._settings:
            if name in self._classes and (problem := _settings_problem(self.create(name))):
                found[name] = problem
        return found

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: self.create(name).describe() for name in self._classes}


def _width(column: str) -> int:
    """How many characters the queue's processor_run table holds in ``column``."""
    return getattr(store.ProcessorRun, column).max_length


def _settings_problem(processor: Processor) -> str | None:
    # Each run records them: a longer one than the table holds fails every run's write
    # (said first: no catalog or library has such a name either).
    for column in ("backend", "model"):
        if len(str(getattr(processor, column) or "")) > _width(column):
            return f"a {column} name is at most {_width(column)} characters"
    return processor.settings_problem()
