"""Which backend a processor runs on this machine, and where its model file is."""

# ``choose`` is a pure function of the platform, the importable packages and the
# configured backend, so the choice made on a Mac can be tested on Linux by
# passing a ``Platform``. Each processor lists its backends fastest first; the
# Apple ones only count on Apple silicon, except that one which also runs
# elsewhere (MLX has a CPU backend on Linux) is used there when configured by
# name. Whatever runs, the result JSON has the same shape and names the backend.

from __future__ import annotations

import importlib.util
import platform as _platform
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import weights
from .base import PermanentError

ML_HINT = "pip install 'momentry-edge[ml]' (scripts/setup does it)"
APPLE_HINT = "pip install 'momentry-edge[apple]'"
MLX_HINT = f"{APPLE_HINT} (on Linux x86_64: 'momentry-edge[mlx-cpu]')"


@dataclass(frozen=True)
class Platform:
    system: str  # sys.platform: "darwin", "linux", ...
    machine: str  # platform.machine(): "arm64", "x86_64", ...

    @property
    def apple_silicon(self) -> bool:
        return self.system == "darwin" and self.machine in ("arm64", "aarch64")


def this_platform() -> Platform:
    return Platform(sys.platform, _platform.machine().lower())


@dataclass(frozen=True)
class Backend:
    name: str
    modules: tuple[str, ...]  # top-level packages it imports
    apple_only: bool = False  # `auto` picks it only on Apple silicon
    runs_elsewhere: bool = False  # configured by name, an apple_only backend runs anywhere
    hint: str = ML_HINT  # how to install what it needs

    def runs_on(self, platform: Platform, configured: str) -> bool:
        if not self.apple_only or platform.apple_silicon:
            return True
        return self.runs_elsewhere and configured == self.name


@dataclass(frozen=True)
class Choice:
    backend: Backend | None
    reason: str | None = None  # why there is none

    @property
    def name(self) -> str:
        return self.backend.name if self.backend else "none"


def importable(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it (cheap, no side effects)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def import_apart(name: str) -> ModuleType:
    """``import name``, the first time on a short-lived thread of its own: whatever frames
    a library's import keeps (a stored exception's traceback) then reach none of the
    caller's, whose objects would live as long as the library."""
    if (module := sys.modules.get(name)) is not None:
        return module
    done: list[BaseException | ModuleType] = []

    def load() -> None:
        try:
            done.append(importlib.import_module(name))
        except BaseException as exc:  # handed to the caller
            done.append(exc.with_traceback(None))

    thread = threading.Thread(target=load, name=f"import-{name}", daemon=True)
    thread.start()
    thread.join()
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def choose(
    options: Sequence[Backend],
    configured: str = "auto",
    *,
    platform: Platform,
    can_import: Callable[[str], bool] = importable,
) -> Choice:
    """The backend to use: with ``auto`` the first of ``options`` that can run here;
    with a name, that backend if it can run here (never a silent substitute). An
    Apple backend that runs elsewhere too is never picked by ``auto`` off Apple silicon."""
    known = {b.name for b in options}
    if configured != "auto" and configured not in known:
        return Choice(None, f"unknown backend {configured!r}; known: auto, {', '.join(known)}")
    reasons = []
    for backend in options:
        if configured not in ("auto", backend.name):
            continue
        if not backend.runs_on(platform, configured):
            reasons.append(f"{backend.name} needs Apple silicon")
            continue
        missing = [m for m in backend.modules if not can_import(m)]
        if missing:
            reasons.append(f"{backend.name} needs {', '.join(missing)}: {backend.hint}")
            continue
        return Choice(backend)
    return Choice(None, "; ".join(reasons))


def resolve_model(
    processor: str, model: str, backend: str, suffix: str, settings: Mapping[str, Any]
) -> Path:
    """The local path of the model file ``backend`` loads; raises ``PermanentError``
    saying how to get it. ``processors.<name>.model_path`` wins over the catalog.
    Models are never downloaded here."""
    explicit = settings.get("model_path")
    if explicit:
        path = Path(str(explicit)).expanduser()
        if not path.is_file():
            raise PermanentError(f"processors.{processor}.model_path {path} does not exist")
        return path
    models_dir = settings.get("models_dir")
    try:
        return weights.locate(
            model,
            backend,
            suffix,
            Path(str(models_dir)).expanduser() if models_dir else None,
            processor,
        )
    except weights.ModelError as exc:
        raise PermanentError(f"{exc}; or set processors.{processor}.model_path") from None
