"""Libraries imported without the optional parts they load at import and a process here
seldom uses. peewee and Huey import the PostgreSQL and Redis drivers whenever they are
installed, and httpx its own command line (click, rich, pygments): together about a
third of what a service's or a CLI command's start costs, for a node on SQLite without a
Redis mirror, or a command that only asks the service. While such a library's module
runs, those parts look uninstalled to it; the drivers are imported where a URL asks for
them (store.connection, the Redis mirror), after it."""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# library module -> the modules it is imported without (unless already imported)
HIDDEN: dict[str, tuple[str, ...]] = {
    "peewee": ("psycopg",),  # store.connection hands its adapter the driver
    "playhouse.postgres_ext": ("psycopg",),  # through playhouse.migrate; its hstore unused
    "huey.storage": ("psycopg", "redis"),  # only its MemoryStorage is used (worker.wakeups)
    "httpx": ("httpx._main",),  # httpx's command line: its __init__ falls back without it
}


class _Finder:  # a meta path finder (importlib.abc's would import importlib.resources)
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in HIDDEN:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Without(spec.loader, HIDDEN[name])  # type: ignore[assignment]
        return spec


class _Without:
    """A loader that runs a module with ``hidden`` looking uninstalled."""

    def __init__(self, loader: Any, hidden: tuple[str, ...]) -> None:
        self._loader = loader
        self._hidden = hidden

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        hidden = [name for name in self._hidden if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
        try:
            self._loader.exec_module(module)
        finally:
            for name in hidden:
                if name in sys.modules and sys.modules[name] is None:
                    del sys.modules[name]

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...
        return getattr(self._loader, name)


def install() -> None:
    """Have the libraries above imported so from now on (once a process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
