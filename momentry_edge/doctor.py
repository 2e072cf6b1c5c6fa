"""`momentry-edge doctor`: what can run on this machine, and why not.

For every processor: the platform, each backend it knows (can it run on this
platform, do its Python packages import, which one was chosen) and its model
(in the catalog, pulled, verified). Packages are really imported here, unlike
the cheap check the service makes, so a broken install shows up with its error.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
from pathlib import Path
from typing import Any

from . import models
from .processors import Registry
from .processors.backends import this_platform


def diagnose(config: Any, models_dir: Path | None = None) -> dict[str, Any]:
    """Everything ``doctor`` prints, as JSON-able data."""
    models_dir = models_dir or config.data_dir / "models"
    models.use_models_dir(models_dir)
    here = this_platform()
    try:
        catalog: models.Catalog | None = models.load_catalog()
        catalog_error = None
    except models.ModelError as e:
        catalog, catalog_error = None, str(e)
    registry = Registry(config.service.plugins, config.processors)
    imports: dict[str, str | None] = {}  # module -> None when it imports, else why not
    report = {}
    for name in registry.names:
        processor = registry.create(name)
        state = processor.readiness()
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
        report[name] = {
            "backend": processor.backend,
            "model": processor.model,
            "ready": state.ready,
            "reason": state.reason,
            "backends": backends,
            "model_files": _model_files(processor, catalog, models_dir),
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


def _model_files(
    processor: Any, catalog: models.Catalog | None, models_dir: Path
) -> dict[str, Any] | None:
    spec = getattr(processor, "spec", None)
    if spec is None and catalog is not None and processor.model:
        spec = catalog.find(processor.model, processor.backend)
    if spec is None:
        return None
    found = models.state(spec, models_dir)
    return {
        "name": spec.name,
        "path": str(models.model_dir(spec, models_dir)),
        "status": "verified" if found.ready else "unverified" if found.present else "not pulled",
        "pinned": spec.pinned,
        "fix": None if found.ready else f"`{models.pull_command(spec, models_dir)}`",
    }


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 500)
    p = report["platform"]
    silicon = "Apple silicon" if p["apple_silicon"] else "not Apple silicon"
    console.print(f"platform: {p['system']} {p['machine']} ({silicon}), Python {p['python']}")
    console.print(f"models:   {report['models_dir']}")
    if report["catalog_error"]:
        console.print(Text(f"catalog:  {report['catalog_error']}", style="red"))
    for name, proc in report["processors"].items():
        mark = Text("ok  ", style="green") if proc["ready"] else Text("no  ", style="red")
        line = Text.assemble(mark, (name, "bold"), f": {proc['backend']}")
        if proc["model"]:
            line.append(f", model {proc['model']}")
        console.print(line)
        if proc["reason"]:
            console.print(Text(f"      {proc['reason']}", style="yellow"))
        for b in proc["backends"]:
            chosen = "*" if b["chosen"] else " "
            where = "" if b["platform_ok"] else " (needs Apple silicon)"
            packages = ", ".join(f"{m} {v}" for m, v in b["packages"].items())
            console.print(Text(f"    {chosen} {b['name']}{where}: {packages}"))
        files = proc["model_files"]
        if files:
            pinned = "" if files["pinned"] else ", sha256 not pinned in the catalog"
            where = files["path"] if files["status"] == "verified" else ""
            console.print(Text(f"      model {files['name']}: {files['status']}{pinned} {where}"))


def command(config: Any, args: Any) -> int:
    """``momentry-edge doctor``: exit 0 when every processor is ready, else 1."""
    import json

    report = diagnose(config, Path(args.models_dir).expanduser() if args.models_dir else None)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0 if all(p["ready"] for p in report["processors"].values()) else 1
