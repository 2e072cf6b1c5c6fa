"""The TUI's screen: what the service said at the last poll (``Snapshot``) and ``render()``,
a pure function of it (snapshot -> renderable; tests call it directly)."""

# The columns give way on a narrow terminal and the lists shorten on a short one, so that
# the screen fits whatever the terminal's size; tui.py draws it and reads the keys.
# One piece: every part of the screen shares the widths the terminal leaves it.

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.layout import Layout
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..terminal import printable

DETAIL_JOBS = 4  # running jobs whose per-processor progress is fetched
RECENT = 5  # rows in "failed" and in "recently finished"

Job = dict[str, Any]

STATUS_STYLE = {
    "processing": "bold cyan",
    "running": "cyan",
    "pending": "white",
    "retrying": "yellow",
    "completed": "green",
    "skipped": "green",
    "partial": "yellow",
    "failed": "bold red",
    "cancelled": "bright_black",
}
# "q quit" first: a narrow terminal cuts the end of the line.
KEY_HELP = (
    "q quit · ↑/↓ select · Enter detail · c cancel · r retry · t top · p pause/resume · +/- max"
)
DETAIL_HELP = "Enter/Esc/q back · ↑/↓ another job · c cancel · r retry · t top"


@dataclass(frozen=True)
class Snapshot:
    """What the service said at the last poll (and why the latest poll failed, if it did)."""

    url: str
    status: dict[str, Any] | None = None  # GET /api/v1/queue/status
    details: dict[str, Job] = field(default_factory=dict)  # task_id -> GET /api/v1/jobs/{job}
    failed: list[Job] = field(default_factory=list)  # newest failed/partial jobs
    finished: list[Job] = field(default_factory=list)  # newest completed/cancelled jobs
    errors: dict[str, str] = field(default_factory=dict)  # task_id -> error of a failed job
    error: str | None = None  # why the latest poll failed; None when it worked
    fetched_at: float | None = None  # wall-clock time of the last poll that worked


# -- rendering: pure functions of the snapshot ----------------------------------------------------


def render(
    snap: Snapshot,
    selected: str | None = None,
    message: str = "",
    height: int = 40,
    now: float | None = None,
    width: int | None = None,
    opened: str | None = None,
) -> RenderableType:
    """The whole screen for one snapshot; ``height`` and ``width`` are the terminal's
    (``width`` None: every column), ``now`` a Unix time; with ``opened`` (a task id) that
    job's detail in place of the lists."""
    if now is None:
        now = snap.fetched_at or 0.0
    header = _header(snap, width)
    if opened is not None:
        footer = _footer(snap, message, DETAIL_HELP)
        layout = Layout()
        layout.split_column(
            Layout(header, size=_lines(header)),
            Layout(_detail(snap, opened, now)),
            Layout(footer, size=_lines(footer)),
        )
        return layout
    nodes = _nodes(snap.status, now)
    footer = _footer(snap, message)
    # The lists below the queue give it room on a short screen: 2 rows each at 24 lines.
    shown = max(1, min(RECENT, (height - 14) // 4))
    lists = [
        part
        for part in (_failed(snap, selected, width, shown), _finished(snap, selected, width, shown))
        if part
    ]
    # The queue gets what the other parts leave; its title and column header take two lines.
    room = height - _lines(header, nodes, footer, *lists) - 2
    body = Group(_queue(snap, selected, room, now, width), *lists)
    parts = [header, nodes, body, footer]
    layout = Layout()
    # Fixed-size header and footer: the key help stays visible however long the queue is.
    layout.split_column(
        *(Layout(part, size=None if part is body else _lines(part)) for part in parts if part)
    )
    return layout


def _lines(*parts: RenderableType | None) -> int:
    # The parts below are built with a known number of lines: Text lines or table rows.
    total = 0
    for part in parts:
        if isinstance(part, Table):
            total += part.row_count + (1 if part.show_header else 0) + (1 if part.title else 0)
        elif isinstance(part, Text):
            total += len(part.plain.splitlines()) or 1
        elif isinstance(part, Group):
            total += _lines(*part.renderables)
    return total


WIDE = 110  # columns from which the header says everything in words


def _header(snap: Snapshot, width: int | None = None) -> Group:
    status = snap.status
    wide = width is None or width >= WIDE
    # One line each, cut rather than wrapped: the header has a fixed height. On a narrow
    # terminal the badge and the counts come first, the address last (cut first).
    title = Text("momentry-edge ", style="bold", no_wrap=True, overflow="ellipsis")
    if wide:
        title.append(f"{snap.url}  ", style="bright_black")
    if status is None:
        title.append("connecting…" if snap.error is None else "not connected", style="yellow")
        return Group(title, Text(""))
    blocked = status.get("blocked_reason")
    if snap.error:  # the last answer stays on screen, but it is not the service's state now
        title.append(" UNREACHABLE ", style="bold white on red")
    elif status["paused"]:
        title.append(" PAUSED ", style="bold black on yellow")
    elif blocked:
        title.append(" BLOCKED ", style="bold white on red")
    else:
        title.append(" RUNNING ", style="bold black on green")
    if status.get("drained") and not snap.error:
        title.append(" DRAINED ", style="bold black on yellow")
    if wide:
        title.append(
            f"   active {status['active_count']} / effective {status['effective_concurrency']}"
            f" / max {status['max_concurrent']}"
            f" (dynamic {'on' if status.get('dynamic_concurrency') else 'off'})"
        )
        title.append(f"   updated {_clock(snap.fetched_at)}", style="bright_black")
    else:
        title.append(
            f" active {status['active_count']}/{status['effective_concurrency']}"
            f" · max {status['max_concurrent']}"
        )
        title.append(f" · {_clock(snap.fetched_at)} · {snap.url}", style="bright_black")
    why = []
    if blocked:  # else a full disk looks like a queue that just waits
        said = printable(f"nothing starts: {blocked}")
        why = [Text(said, style="red", no_wrap=True, overflow="ellipsis")]
    for warning in status.get("warnings") or []:  # e.g. a watched folder that is not there
        why.append(Text(f"⚠ {warning}", style="yellow", no_wrap=True, overflow="ellipsis"))
    return Group(title, *why, _gauges(status, wide), *_models(status))


def _models(status: dict[str, Any]) -> list[Text]:
    """One line while models are pulled at start (or a pull failed); none otherwise."""
    pulls = [p for p in status.get("models") or [] if p.get("state") != "ready"]
    if not pulls:
        return []
    parts = []
    for pull in pulls:
        if pull["state"] == "pulling":
            done = f" {pull['percent']} %" if pull.get("percent") is not None else ""
            parts.append(f"pulling {pull['model']}{done}")
        elif pull["state"] == "failed":
            parts.append(f"{pull['model']} FAILED: {pull.get('error') or ''}")
        else:
            parts.append(f"{pull['model']} next")
    line = Text("models ", style="bold", no_wrap=True, overflow="ellipsis")
    line.append(" · ".join(parts), style="yellow")
    return [line]


def _gauges(status: dict[str, Any], wide: bool = True) -> Text:
    """One line: the machine's load as bars, then the totals (cut first)."""
    line = Text(no_wrap=True, overflow="ellipsis")
    resources = status.get("resources") or {}
    for label, key in (("CPU", "cpu_percent"), ("MEM", "memory_percent"), ("GPU", "gpu_percent")):
        value = resources.get(key)
        if value is None and not wide:
            continue  # a narrow screen shows what there is
        line.append(f"{label} ", style="bold")
        if value is None:
            line.append("n/a ", style="bright_black")
        else:
            line.append_text(_bar(value, 10 if wide else 6))
            line.append(f" {value:3.0f}% ")
    stats = status.get("statistics") or {}
    average = stats.get("average_time")
    totals = (
        f" processed {stats.get('total_processed', 0)} · failed {stats.get('total_failed', 0)}"
        f" · partial {stats.get('total_partial', 0)}"
        f" · cancelled {stats.get('total_cancelled', 0)}"
        + (f" · {average:.1f} s/job" if average is not None else "")
    )
    line.append(totals, style="bright_black")
    return line


def _bar(percent: float, width: int) -> Text:
    filled = round(width * min(max(percent, 0), 100) / 100)
    return Text.assemble(("━" * filled, "magenta"), ("━" * (width - filled), "bright_black"))


def _nodes(status: dict[str, Any] | None, now: float) -> Table | None:
    nodes = (status or {}).get("nodes") or []
    if len(nodes) < 2:  # one node is this service; the header already says it all
        return None
    needs = {"node": 12, "host": 12, "active": 7, "processors": 14, "last seen": 12}
    table = _table(needs, title="nodes")
    for node in nodes:
        online = node.get("online", True)
        table.add_row(
            Text(str(node["id"])),
            Text(str(node.get("host", ""))),
            Text(f"{node.get('active', 0)} / {node.get('max_concurrent', '?')}")
            if online
            else Text("OFFLINE", style="bold red"),
            Text(_takes(node)),
            Text(_ago(node.get("last_seen"), now)),
        )
    return table


def _takes(node: dict[str, Any]) -> str:
    """What a node takes on: its processors, or that it runs no jobs or is drained."""
    if node.get("worker") == "off":
        return "runs no jobs"
    listed = ",".join(node.get("processors", []))
    return f"drained; {listed}" if node.get("worker") == "drained" else listed


# Each list's columns with the width each takes (the file name: at least), and those that
# give way on a narrow terminal, first to last: the selection marker, the position, the
# file name and the progress stay (80 columns keep the status and the estimate too).
QUEUE_COLUMNS = {
    "": 1,
    "#": 5,
    "file": 22,
    "prio": 6,
    "status": 10,
    "progress": 15,
    "processors": 14,
    "when": 17,
}
QUEUE_DROPS = ("processors", "prio", "when", "progress")
# The error needs 40: on 80 columns it is worth more than the processors' names (which it
# says too); Enter shows it whole.
FAILED_COLUMNS = {"": 1, "file": 22, "status": 7, "error": 40, "failed": 10, "task": 17}
FAILED_DROPS = ("task", "failed", "error")
FINISHED_COLUMNS = {"": 1, "file": 22, "status": 9, "processors": 14, "task": 17}
FINISHED_DROPS = ("task", "processors")
# The columns that take the room left, and their shares of it: a wide screen gives the
# estimate ("ends in 1m 59s on studio-b") and the error room too, not the file name all.
GROW = {"file": 3, "error": 3, "when": 1, "processors": 1}
ROOMY = {"when": 40, "processors": 30}  # the most these take; the file name gets the rest


def _fitting(needs: dict[str, int], drops: tuple[str, ...], width: int | None) -> list[str]:
    """The columns of ``needs`` that fit in ``width``, dropping those in ``drops`` in turn."""
    names = list(needs)
    for name in drops:
        if width is None or _used(needs, names) <= width:
            break
        names.remove(name)
    return names


def _used(needs: dict[str, int], names: list[str]) -> int:
    # Two spaces between columns (the table's padding), none at its edges.
    return sum(needs[n] for n in names) + 2 * (len(names) - 1)


def _widths(needs: dict[str, int], names: list[str], width: int | None) -> dict[str, int]:
    """Each column's width: what it needs, and the growing ones share what is left."""
    widths = {n: needs[n] for n in names}
    if width is None:
        return widths
    spare = width - _used(needs, names)
    # Too narrow even so: only the file name and the error are made shorter.
    growing = [n for n in names if n in GROW and (spare >= 0 or n in ("file", "error"))]
    shares = sum(GROW[n] for n in growing)
    given = 0
    for i, name in enumerate(growing):
        # The last takes what rounding left over, so the columns fill the width exactly.
        share = spare - given if i == len(growing) - 1 else spare * GROW[name] // shares
        given += share
        widths[name] = max(widths[name] + share, 10)  # a very narrow screen: shorter names
    for name in set(growing) & set(ROOMY):
        if (over := widths[name] - ROOMY[name]) > 0 and growing[0] not in ROOMY:
            widths[name] -= over
            widths[growing[0]] += over
    if not growing and names:  # nothing grows: the last column may not go past the edge
        widths[names[-1]] = max(widths[names[-1]] - max(_used(needs, names) - width, 0), 1)
    return widths


def _shorten(text: str, width: int | None) -> str:
    """Cut in the middle: names alike at the start (a camera's, a client's) differ at the end."""
    if width is None or len(text) <= width:
        return text
    if width < 8:
        return text[: width - 1] + "…"
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + "…" + text[-tail:]


def _queue(
    snap: Snapshot, selected: str | None, room: int, now: float, width: int | None = None
) -> RenderableType:
    status = snap.status
    if status is None:
        return Text("")
    entries = status.get("queue", [])
    waiting = status["pending_count"] + (status.get("retrying_count") or 0)
    listed = sum(job["status"] != "processing" for job in entries)
    title = f"queue: {status['active_count']} running, {status['pending_count']} pending" + (
        f", {status['retrying_count']} retrying" if status.get("retrying_count") else ""
    )
    columns = _fitting(QUEUE_COLUMNS, QUEUE_DROPS, width)
    widths = _widths(QUEUE_COLUMNS, columns, width)
    shown = _window(entries, selected, room)
    if waiting > listed or sum(j["status"] != "processing" for j in shown) < listed:
        title += f" (the first {sum(j['status'] != 'processing' for j in shown)} shown)"
    table = _table(widths, title=title)
    for job in shown:
        cells = _job_cells(job, selected, now, widths if width is not None else None)
        table.add_row(*_pick(cells, columns))
        for name, run in (snap.details.get(job["task_id"], {}).get("processors") or {}).items():
            table.add_row(*_pick(_processor_cells(name, run), columns))
    if not entries:
        empty = {"file": Text("nothing running or waiting", style="bright_black")}
        table.add_row(*_pick(empty, columns))
    return table


def _pick(cells: Mapping[str, RenderableType], columns: list[str]) -> list[RenderableType]:
    return [cells.get(name, Text("")) for name in columns]


def _window(entries: list[Job], selected: str | None, room: int) -> list[Job]:
    # Keep the selected job on screen: scroll just far enough. Each running job also takes
    # one line per processor; keep a little slack for them.
    room = max(room - 2 * sum(j["status"] == "processing" for j in entries[:DETAIL_JOBS]), 3)
    ids = [job["task_id"] for job in entries]
    index = ids.index(selected) if selected in ids else 0
    start = max(0, index - room + 1)
    return entries[start : start + room]


def _job_cells(
    job: Job, selected: str | None, now: float, widths: dict[str, int] | None = None
) -> dict[str, RenderableType]:
    status = job["status"]
    if status == "processing":
        when = _fit(_running_when(job, now), (widths or {}).get("when"))
    elif status == "retrying":
        when = f"retry {_until(job.get('next_attempt_at'), now)}"
    elif job.get("stranded"):
        when = "NO NODE CAN RUN IT"  # the reason whole in the detail view (Enter)
    else:
        when = f"starts {_until(job.get('estimated_start'), now)}"
    processors = ",".join(job.get("processors", []))
    if job.get("error"):
        processors += f"  {job['error']}"
    name = _shorten(job["file_name"], (widths or {}).get("file"))
    return {
        "": _marker(job, selected),
        "#": Text(str(job.get("position") or "")),
        "file": Text(name, style="reverse" if job["task_id"] == selected else ""),
        "prio": Text(job.get("priority", "")),
        "status": Text(status, style=STATUS_STYLE.get(status, "")),
        "progress": _progress(job.get("progress")) if status == "processing" else Text(""),
        "processors": Text(processors),
        "when": Text(
            when, style="bold red" if job.get("stalled") or job.get("stranded") else "bright_black"
        ),
    }


def _running_when(job: Job, now: float) -> list[str]:
    """What a running job's estimate column says, the whole first, then shorter forms."""
    on = f" on {job['node']}" if job.get("node") else ""
    if job.get("stalled"):
        ago = _ago(job.get("progress_at"), now)
        span = ago.removesuffix(" ago")
        return [f"STALLED: no progress {ago}", f"STALLED {span}"]
    if job.get("estimated_end"):
        until = _until(job["estimated_end"], now)
        return [f"ends {until}{on}", f"ends {until}", until]
    ago = _ago(job.get("started_at"), now)
    return [f"started {ago}{on}", f"started {ago}", ago]


def _fit(forms: list[str], width: int | None) -> str:
    """The first of ``forms`` that fits ``width`` whole (a cut "ends in 1m 59s o…" says
    less than "ends in 1m 59s"); the last, cut, when none does."""
    return next((form for form in forms if width is None or len(form) <= width), forms[-1])


def _processor_cells(name: str, run: dict[str, Any]) -> dict[str, RenderableType]:
    status = run.get("status", "")
    counts = f"{run['current']}/{run['total']}" if run.get("total") else ""
    note = run.get("error") or run.get("reason") or counts
    progress = run.get("progress")
    return {
        "file": Text(f"  └ {name}", style="bright_black"),
        "status": Text(status, style=STATUS_STYLE.get(status, "")),
        "progress": _progress(progress) if progress is not None else Text(""),
        "processors": Text(note, style="bright_black"),
    }


def _failed(
    snap: Snapshot, selected: str | None, width: int | None = None, rows: int = RECENT
) -> Table | None:
    if not snap.failed:
        return None
    columns = _fitting(FAILED_COLUMNS, FAILED_DROPS, width)
    widths = _widths(FAILED_COLUMNS, columns, width)
    table = _table(widths, title=_list_title("failed", len(snap.failed), rows))
    for job in snap.failed[:rows]:
        cells = _listed_cells(job, selected, widths) | {
            "failed": Text(",".join(job.get("failed", []))),
            "error": Text(snap.errors.get(job["task_id"], ""), style="red"),
        }
        table.add_row(*_pick(cells, columns))
    return table


def _list_title(title: str, count: int, rows: int) -> str:
    return title if count <= rows else f"{title} (newest {rows})"


def _listed_cells(
    job: Job, selected: str | None, widths: dict[str, int] | None = None
) -> dict[str, RenderableType]:
    """The cells a job has in every list below the queue."""
    name = _shorten(job["file_name"], (widths or {}).get("file"))
    return {
        "": _marker(job, selected),
        "file": Text(name, style="reverse" if job["task_id"] == selected else ""),
        "status": Text(job["status"], style=STATUS_STYLE.get(job["status"], "")),
        "task": Text(job["task_id"], style="bright_black"),
    }


def _finished(
    snap: Snapshot, selected: str | None, width: int | None = None, rows: int = RECENT
) -> Table | None:
    if not snap.finished:
        return None
    columns = _fitting(FINISHED_COLUMNS, FINISHED_DROPS, width)
    widths = _widths(FINISHED_COLUMNS, columns, width)
    table = _table(widths, title=_list_title("recently finished", len(snap.finished), rows))
    for job in snap.finished[:rows]:
        cells = _listed_cells(job, selected, widths)
        cells["processors"] = Text(",".join(job.get("processors", [])))
        table.add_row(*_pick(cells, columns))
    return table


def _detail(snap: Snapshot, task_id: str, now: float) -> Group:
    """One job whole, its words wrapped, never cut: what the lists' columns only begin."""
    listed = next((j for j in _all_listed(snap) if j["task_id"] == task_id), {})
    job = {**listed, **snap.details.get(task_id, {})}
    if not job:
        return Group(Text(f"{task_id}: reading…", style="bright_black"))
    status = job.get("status", "")
    title = Text(f"{job.get('file_name', '')}  ", style="bold")
    title.append(status, style=STATUS_STYLE.get(status, ""))
    lines = [title, Text(f"task {task_id} · priority {job.get('priority', '?')}")]
    when = [
        f"{label} {_clock(at)}"
        for label, key in (("created", "created_at"), ("started", "started_at"))
        if (at := _parse(job.get(key))) is not None
    ]
    if job.get("node"):
        when.append(f"on {job['node']}")
    if job.get("progress_at") and status == "processing":
        stalled = " (STALLED)" if job.get("stalled") else ""
        when.append(f"last progress {_ago(job['progress_at'], now)}{stalled}")
    if job.get("position") and job.get("stranded"):
        when.append(f"#{job['position']}")
    elif job.get("position"):
        when.append(f"#{job['position']}, starts {_until(job.get('estimated_start'), now)}")
    if (end := _parse(job.get("completed_at"))) is not None:
        when.append(f"ended {_clock(end)}")
    if when:
        lines.append(Text(" · ".join(when), style="bright_black"))
    runs = snap.details.get(task_id, {}).get("processors") or {}  # a list's entry has names
    # The processors' errors are on their own lines below: the job's own is said once.
    error = job.get("error_message") or (None if runs else snap.errors.get(task_id))
    if error:
        lines.append(Text(f"error: {error}", style="red"))
    if job.get("stranded") and status == "pending":
        lines.append(Text(job["stranded"], style="bold red"))
    for name, run in runs.items():
        said = run.get("error") or run.get("reason") or run.get("output_path") or ""
        counts = f" {run['current']}/{run['total']}" if run.get("total") else ""
        row = Text(f"  {name:<6} ")
        row.append(
            f"{run.get('status', '')}{counts}", style=STATUS_STYLE.get(run.get("status"), "")
        )
        if said:
            row.append(f"  {said}", style="red" if run.get("error") else "bright_black")
        lines.append(row)
    return Group(*lines)


def _all_listed(snap: Snapshot) -> list[Job]:
    return [*(snap.status or {}).get("queue", []), *snap.failed, *snap.finished]


def _footer(snap: Snapshot, message: str, keys: str = KEY_HELP) -> Group:
    # One line each, cut rather than wrapped, so the key help is never pushed off screen.
    cut: dict[str, Any] = {"no_wrap": True, "overflow": "ellipsis"}
    if snap.error:
        since = f", last answer {_clock(snap.fetched_at)}" if snap.fetched_at else ""
        line = Text(f"⚠ retrying every second{since}: {snap.error}", style="bold red", **cut)
    else:
        line = Text(message or " ", style="yellow", **cut)
    return Group(line, Text(keys, style="bright_black", **cut))


def _table(widths: dict[str, int], title: str) -> Table:
    table = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=title,
        title_justify="left",
        title_style="bold underline",
        expand=True,
    )
    for name, width in widths.items():
        # Widths chosen to fit (see _widths): what is longer is cut, never wrapped.
        growing = name in GROW
        table.add_column(
            name,
            justify="right" if name == "#" else "left",
            no_wrap=True,
            overflow="ellipsis",
            ratio=width if growing else None,  # in proportion to the widths chosen
            width=None if growing else width,
            min_width=width if growing else None,
        )
    return table


def _marker(job: Job, selected: str | None) -> Text:
    return Text("›", style="bold") if job["task_id"] == selected else Text(" ")


def _progress(percent: float | None) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        ProgressBar(total=100, completed=percent or 0, width=10), Text(f"{percent or 0:3.0f}%")
    )
    return grid


def _parse(stamp: str | None) -> float | None:
    if not stamp:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(stamp).timestamp()
    return None


def _span(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _until(stamp: str | None, now: float) -> str:
    at = _parse(stamp)
    if at is None:
        return "—"
    return "now" if at <= now else f"in {_span(at - now)}"


def _ago(stamp: str | None, now: float) -> str:
    at = _parse(stamp)
    return "—" if at is None else f"{_span(max(now - at, 0))} ago"


def _clock(at: float | None) -> str:
    # The terminal's local time, labelled with its zone (the CLI's commands and the logs
    # say UTC, labelled so: docs/console.md, Times).
    return "—" if at is None else time.strftime("%H:%M:%S %Z", time.localtime(at))
