"""`momentry-edge doctor`: what can run on this machine, and why not."""

# For every processor: the platform, each backend it knows (can it run on this
# platform, do its Python packages import, which one was chosen) and its model
# (in the catalog, pulled, verified). Packages are really imported here, unlike
# the cheap check the service makes, so a broken install shows up with its error.

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import watch_folders, weights
from ..processors import Registry, load_class
from ..processors.backends import this_platform
from ..processors.base import Readiness
from . import checks


def diagnose(config: Any, models_dir: Path | None = None) -> dict[str, Any]:
    """Everything ``doctor`` prints, as JSON-able data."""
    models_dir = models_dir or config.data_dir / "models"
    weights.use_models_dir(models_dir)
    here = this_platform()
    try:
        catalog: weights.Catalog | None = weights.load_catalog()
        catalog_error = None
    except weights.ModelError as e:
        catalog, catalog_error = None, str(e)
    plugins, broken = check_plugins(config.service.plugins)
    registry = Registry(plugins, config.processors)
    imports: dict[str, str | None] = {}  # module -> None when it imports, else why not
    report: dict[str, Any] = {spec: _broken_plugin(reason) for spec, reason in broken.items()}
    for name in registry.names:
        processor = registry.create(name)
        state = processor.readiness()
        if problem := processor.settings_problem():  # the service would not start
            state = Readiness(False, f"processors.{name}: {problem}")
        backends = []
        for backend in getattr(sys.modules.get(type(processor).__module__), "BACKENDS", ()):
            for module in backend.modules:
                if module not in imports:
                    imports[module] = _try_import(module)
            backends.append(
                {
                    "name": backend.name,
                    "chosen": backend.name == processor.backend,
                    "platform_ok": backend.runs_on(
                        here, str(processor.settings.get("backend", "auto"))
                    ),
                    "packages": {m: imports[m] or _version(m) for m in backend.modules},
                    "packages_ok": all(imports[m] is None for m in backend.modules),
                }
            )
        files = _model_files(processor, catalog)
        reason = state.reason
        if files and files["status"] != "verified" and _service_pulls(config):
            # Not the operator's job: the service pulls what its processors need.
            files["fix"] = "the service pulls it when it starts (models.auto_pull = true)"
            reason = f"model {files['name']} is {files['status']}; {files['fix']}"
        report[name] = {
            "backend": processor.backend,
            "model": processor.model,
            "ready": state.ready,
            "reason": reason,
            "backends": backends,
            "model_files": files,
        }
    return {
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "apple_silicon": here.apple_silicon,
            "python": platform.python_version(),
        },
        "models_dir": str(models_dir),
        "catalog": str(catalog.path) if catalog else None,
        "catalog_error": catalog_error,
        "processors": report,
        "checks": checks.machine(config),  # watched folders: those that are fine
        "watch_warnings": watch_folders.problems(config.service.watch),
    }


def _service_pulls(config: Any) -> bool:
    return bool(config.models.auto_pull and config.queue.worker_enabled)


def check_plugins(specs: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The plugins that load, and each one that does not with why not."""
    loaded, broken = [], {}
    for spec in specs:
        try:
            load_class(spec)
        except ValueError as e:
            broken[spec] = str(e)
        except Exception as e:  # the plugin's own import fails: a syntax error, a bug, ...
            broken[spec] = f"cannot load processor {spec!r}: {type(e).__name__}: {e}"
        else:
            loaded.append(spec)
    return loaded, broken


def _broken_plugin(reason: str) -> dict[str, Any]:
    # Shaped as a processor that is not ready, so --json readers need no special case.
    return {
        "backend": "none",
        "model": None,
        "ready": False,
        "reason": f"service.plugins: {reason}",
        "backends": [],
        "model_files": None,
    }


def _try_import(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        return "not installed" if e.name == module else f"import fails: {e}"
    except Exception as e:  # a broken native library, a bad version mix, ...
        return f"import fails: {type(e).__name__}: {e}"
    return None


def _version(module: str) -> str:
    try:
        return importlib.metadata.version(module.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get(module), "__version__", "installed"))


def _model_files(processor: Any, catalog: weights.Catalog | None) -> dict[str, Any] | None:
    if processor.settings.get("model_path"):
        return None  # a file of its own, not a catalog model
    spec = getattr(processor, "spec", None)
    if spec is None and catalog is not None and processor.model:
        spec = catalog.find(processor.model, processor.backend, processor.name)
    if spec is None:
        return None
    models_dir = weights.looks_in(processor)  # its own models_dir, else the doctor's
    found = weights.state(spec, models_dir)
    return {
        "name": spec.name,
        "path": str(weights.model_dir(spec, models_dir)),
        "status": "verified" if found.ready else "unverified" if found.present else "not pulled",
        "pinned": spec.pinned,
        "fix": None if found.ready else f"`{weights.pull_command(spec, models_dir)}`",
    }
