"""What the local commands (`models`, `doctor`) print; the library modules return data.

Imported by the CLI only when one of these commands runs: it pulls in the model catalog,
the processors and rich's progress bars, which the client commands do not need.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import weights
from ..config import Config
from ..processors import Registry
from ..terminal import printable
from . import checks, doctor


def console() -> Console:
    # No highlighting: names and ids print as they are. Piped output is not squeezed to
    # 80 columns, so one row stays on one line for grep and awk.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 500)


def say(out: Console, text: object, style: str = "") -> None:
    """One line of text from outside (a path, an error): never markup, never raw controls."""
    out.print(Text(printable(text), style=style))


# -- momentry-edge models list|pull|verify --------------------------------------------------------


def models_command(config: Config, args: argparse.Namespace) -> int:
    """``momentry-edge models ACTION``; returns the exit code."""
    out = console()
    models_dir = (
        Path(args.models_dir).expanduser() if args.models_dir else config.data_dir / "models"
    )
    weights.use_models_dir(models_dir)  # where the processors that `needed` asks look
    try:
        catalog = weights.load_catalog()
        if args.action == "list":
            return _list(out, catalog, models_dir, args.json)
        specs = [catalog.get(n) for n in args.names] if args.names else None
        if args.action == "pull":
            if specs is None:  # each where its processor looks, unless told where
                wanted = weights.needed(_registry(config), catalog)
                if args.models_dir:
                    wanted = list({s.name: (s, models_dir) for s, _ in wanted}.values())
            else:
                wanted = [(spec, models_dir) for spec in specs]
            keep_free = int(config.queue.min_free_disk_mb * weights.MB)
            return _pull(out, wanted, args.source, keep_free)
        return _verify(out, catalog, specs, models_dir)
    except (weights.ModelError, OSError) as e:
        out.print(Text.assemble(("error:", "red"), " ", printable(e, multiline=True)))
        return 1


def _registry(config: Config) -> Registry:
    """The configured processors; a plugin that does not load, or settings the service
    would refuse, are a ModelError: which models are needed cannot be told without them."""
    plugins, broken = doctor.check_plugins(config.service.plugins)
    if broken:
        raise weights.ModelError(f"service.plugins: {next(iter(broken.values()))}")
    registry = Registry(plugins, config.processors)
    # A processor's model the catalog does not have for it (the service refuses it too).
    for name, problem in registry.settings_problems().items():
        raise weights.ModelError(f"processors.{name}: {problem}")
    return registry


def _list(out: Console, catalog: weights.Catalog, models_dir: Path, as_json: bool) -> int:
    listing = weights.listing(catalog, models_dir)
    if as_json:
        print(json.dumps(listing, indent=2))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("name", "backend", "processors", "size", "status", "sources"):
        table.add_column(column, no_wrap=column != "status", overflow="fold")
    for row in listing["models"]:
        size = f"{row['size'] / 1e6:.0f} MB" if row["size"] else "?"
        status = row["status"] + ("" if row["pinned"] else " (sha256 not pinned)")
        kinds = ", ".join(dict.fromkeys(s.split(":")[0] for s in row["sources"]))
        cells = [row["name"], row["backend"], ",".join(row["processors"]), size, status, kinds]
        table.add_row(*[Text(printable(c)) for c in cells])
    say(out, f"models in {models_dir}")
    out.print(table)
    return 0


def _pull(
    out: Console,
    wanted: list[tuple[weights.ModelSpec, Path]],
    source: str | None,
    keep_free: int,
) -> int:
    if not wanted:
        out.print("nothing to pull: no configured processor uses a catalog model")
        return 0
    failed = 0
    for spec, models_dir in wanted:
        with _bars() as bars:
            try:
                folder = weights.pull(
                    spec,
                    models_dir,
                    source=source,
                    progress=RichProgress(bars),
                    keep_free=keep_free,
                    on_busy=_Waiting(bars, spec.name),
                )
            except weights.ModelError as e:
                bars.stop()
                # One source's reason a line (not "\x0a"), each still shown literally.
                out.print(Text(printable(f"{spec.name}: {e}", multiline=True), style="red"))
                failed += 1
                continue
        say(out, f"{spec.name}: ready in {folder}")
    return 1 if failed else 0


def _verify(
    out: Console,
    catalog: weights.Catalog,
    specs: list[weights.ModelSpec] | None,
    models_dir: Path,
) -> int:
    if specs is None:  # every model that has anything on disk
        specs = [s for s in catalog if weights.state(s, models_dir).present]
        if not specs:
            say(out, f"no models in {models_dir}")
            return 0
    bad = 0
    for spec in specs:
        with _bars() as bars:
            problems = weights.verify(spec, models_dir, RichProgress(bars))
        wrong = {path: p for path, p in problems.items() if p}
        if wrong:
            bad += 1
            for path, problem in wrong.items():
                say(out, f"{spec.name}/{path}: {problem}", style="red")
            say(out, f"  fix: `{weights.pull_command(spec, models_dir)}`")
        else:
            say(out, f"{spec.name}: {len(problems)} files verified")
    return 1 if bad else 0


class _Waiting:
    """``weights.pull``'s ``on_busy``: another process (the service's own pull at start,
    another `models pull`) is pulling the model; this one waits and then checks it."""

    def __init__(self, bars: Any, name: str) -> None:
        self.bars = bars
        self.name = name
        self.said = False

    def __call__(self) -> None:
        if not self.said:
            self.said = True
            said = f"{self.name}: another process is pulling it (the service, or another"
            self.bars.console.print(
                Text(printable(said + " `models pull`): waiting for it")), soft_wrap=True
            )
        time.sleep(0.5)


class RichProgress:
    """models.Progress as one rich progress bar per file (bytes, speed, time left)."""

    def __init__(self, bars: Any) -> None:
        self.bars = bars
        self.task: Any = None
        self.label = ""

    def start(self, label: str, total: int | None, done: int = 0) -> None:
        self.label = printable(label)
        self.task = self.bars.add_task(self.label, total=total, completed=done)

    def advance(self, n: int) -> None:
        self.bars.advance(self.task, n)

    def finish(self, note: str = "") -> None:
        label = Text(self.label)
        if note:
            label.append(f" {printable(note)}", style="dim")
        self.bars.update(self.task, description=label)


def _bars() -> Any:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        # The description is shown as it is: file names are not markup.
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )


# -- momentry-edge doctor -------------------------------------------------------------------------


def doctor_command(config: Config, args: argparse.Namespace) -> int:
    """``momentry-edge doctor``: exit 0 when every processor is ready and no check of the
    machine finds a problem (warnings do not count), else 1."""
    report = doctor.diagnose(
        config, Path(args.models_dir).expanduser() if args.models_dir else None
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_doctor(report)
    ready = all(p["ready"] for p in report["processors"].values())
    return 0 if ready and not checks.problems(report["checks"]) else 1


def render_doctor(report: dict[str, Any]) -> None:
    out = console()
    p = report["platform"]
    silicon = "Apple silicon" if p["apple_silicon"] else "not Apple silicon"
    say(out, f"platform: {p['system']} {p['machine']} ({silicon}), Python {p['python']}")
    for check in report["checks"]:
        mark = {"ok": ("ok  ", "green"), "warning": ("!   ", "yellow")}.get(
            check["level"], ("no  ", "red")
        )
        out.print(Text.assemble(mark, (f"{check['check']}: ", "bold"), printable(check["detail"])))
    say(out, f"models:   {report['models_dir']}")
    if report["catalog_error"]:
        say(out, f"catalog:  {report['catalog_error']}", style="red")
    for warning in report.get("watch_warnings", []):
        say(out, f"warning:  {warning}", style="yellow")
    for name, proc in report["processors"].items():
        ready = Text("ok  ", style="green") if proc["ready"] else Text("no  ", style="red")
        line = Text.assemble(ready, (printable(name), "bold"), f": {printable(proc['backend'])}")
        if proc["model"]:
            line.append(f", model {printable(proc['model'])}")
        out.print(line)
        if proc["reason"]:
            say(out, f"      {proc['reason']}", style="yellow")
        for b in proc["backends"]:
            chosen = "*" if b["chosen"] else " "
            where = "" if b["platform_ok"] else " (needs Apple silicon)"
            packages = ", ".join(f"{m} {v}" for m, v in b["packages"].items())
            say(out, f"    {chosen} {b['name']}{where}: {packages}")
        files = proc["model_files"]
        if files:
            pinned = "" if files["pinned"] else ", sha256 not pinned in the catalog"
            where = files["path"] if files["status"] == "verified" else ""
            say(out, f"      model {files['name']}: {files['status']}{pinned} {where}")
