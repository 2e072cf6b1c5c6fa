"""`momentry-edge tui`: a live terminal view of the queue, over the HTTP API."""

# Three small parts:
#
# - ``Feed``: the one thread that talks to the service. It polls about once a second
#   and runs the user's commands in between, so the screen never waits on the network.
# - ``render()`` (screen.py): a pure function, snapshot -> renderable.
# - ``run()``: the loop: draw, read keys, turn a key into a selection move or a command.
#
# The view only reads (STYLE.md: observers never change state); the only writes are
# the commands the user types.

from __future__ import annotations

import os
import queue
import select
import sys
import termios
import threading
import time
import tty
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.live import Live

from ..terminal import printable, scrub
from .client import ApiClient, ApiError, ServiceUnreachable, UnexpectedReply
from .screen import DETAIL_JOBS, RECENT, Job, Snapshot, render

POLL_SECONDS = 1.0  # API.md: the view refreshes at least once a second
TICK = 0.2  # how long a key may wait before it is acted on
MORE = "reading more of the line…"

Command = tuple[str, Any]


# -- talking to the service -----------------------------------------------------------------------


def fetch(
    api: ApiClient, previous: Snapshot, rows: int = 50, opened: str | None = None
) -> Snapshot:
    """Poll the API once (the running jobs and the first ``rows`` waiting, and the detail
    of the ``opened`` job); on failure keep the last data and say why.

    Every reply is scrubbed here, where it enters: file names and errors reach the screen."""
    try:
        status = scrub(api.queue_status(limit=max(rows, 1)))
        running = [j["task_id"] for j in status.get("queue", []) if j["status"] == "processing"]
        details = {t: d for t in running[:DETAIL_JOBS] if (d := _job_or_none(api, t))}
        if opened and opened not in details and (d := _job_or_none(api, opened)):
            details[opened] = d
        # The dead list: failures a later good run of the same file has not resolved.
        failed = scrub(api.dead(limit=RECENT)["jobs"])
        finished = scrub(api.jobs(["completed", "cancelled"], limit=RECENT)["jobs"])
        errors = {job["task_id"]: _error_of(job) for job in failed}
    except (ServiceUnreachable, ApiError, UnexpectedReply) as exc:
        return replace(previous, error=_reason(exc))
    return Snapshot(previous.url, status, details, failed, finished, errors, None, time.time())


def _job_or_none(api: ApiClient, ref: str) -> Job | None:
    try:
        return scrub(api.job(ref))
    except ApiError:  # gone between two requests (e.g. the retention sweep): skip it
        return None


def _error_of(job: Job) -> str:
    if job.get("error_message"):
        return str(job["error_message"])
    runs = (job.get("failed") or {}).items()
    return "; ".join(f"{name}: {run.get('error')}" for name, run in runs if run.get("error"))


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiError) and exc.code == "unauthorized":
        return printable(f"{exc.message} (pass --token or set MOMENTRY_API_TOKEN)")
    return printable(exc.message if isinstance(exc, ApiError) else exc)


class Feed:
    """Polls the service and runs commands, in one background thread."""

    def __init__(self, api: ApiClient, interval: float = POLL_SECONDS) -> None:
        self.api = api
        self.interval = interval
        self.rows = 50  # waiting jobs asked for: a screenful past the selected one
        self.opened: str | None = None  # the job whose detail view is open (Enter)
        # Replaced whole, never mutated: safe to read from the drawing thread.
        self.snapshot = Snapshot(printable(api.base_url))
        self.message = ""  # the outcome of the latest command, for the status line
        self._commands: queue.Queue[Command | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="tui-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._commands.put(None)
        # A request in flight may take up to the client's timeout; the thread is a daemon.
        self._thread.join(timeout=1.0)

    def send(self, command: Command) -> None:
        self._commands.put(command)

    def _loop(self) -> None:
        while True:
            try:
                self.snapshot = fetch(self.api, self.snapshot, self.rows, self.opened)
            except Exception as exc:  # an observer keeps observing: show the bug, don't freeze
                error = printable(f"{type(exc).__name__}: {exc}")
                self.snapshot = replace(self.snapshot, error=error)
            try:
                command = self._commands.get(timeout=self.interval)
            except queue.Empty:
                continue
            if command is None:
                return
            if command[0] == "refresh":  # read again now: the view asks for more
                continue
            try:
                outcome = execute(self.api, command, self.snapshot)
            except Exception as exc:  # a reply of a shape no check foresaw: say so, go on
                outcome = f"⚠ unexpected reply: {type(exc).__name__}: {exc}"
            self.message = printable(outcome)


def execute(api: ApiClient, command: Command, snap: Snapshot) -> str:
    """Run one user command; returns the line to show (the API's message when it refuses)."""
    name, job = command
    try:
        if job is None and snap.status is None:
            return "not connected to the service yet"
        return ACTIONS[name](api, job or snap.status)
    except ApiError as exc:
        return f"refused: {_reason(exc)}"
    except ServiceUnreachable as exc:
        return str(exc)
    except UnexpectedReply as exc:
        return f"⚠ {exc}"


def _toggle(api: ApiClient, status: dict[str, Any]) -> str:
    # Decided on the freshest status: the feed polls right after every command.
    if (api.resume() if status["paused"] else api.pause())["paused"]:
        return "queue paused: running jobs finish, nothing new starts"
    return "queue running"


def _concurrency(step: int) -> Any:
    def change(api: ApiClient, status: dict[str, Any]) -> str:
        wanted = status["max_concurrent"] + step
        if wanted < 1:
            return "max_concurrent is already 1"
        reply = api.set_concurrency(wanted)
        return (
            f"max_concurrent {reply['max_concurrent']}, effective {reply['effective_concurrency']}"
        )

    return change


def _cancel(api: ApiClient, job: Job) -> str:
    # Sent for a running job only once the operator said yes (see on_key).
    if api.cancel(job["task_id"]).get("status") == "cancelling":
        return f"{job['file_name']}: cancelling, it stops at its next checkpoint"
    return f"{job['file_name']}: cancelled"


def _retry(api: ApiClient, job: Job) -> str:
    reply = api.retry(job["task_id"])
    return f"{job['file_name']}: re-queued at position {reply.get('position')}"


def _top(api: ApiClient, job: Job) -> str:
    reply = api.prioritize(job["file_uuid"])
    return f"{job['file_name']}: moved to position {reply['position']}"


ACTIONS = {
    "toggle": _toggle,
    "more": _concurrency(+1),
    "fewer": _concurrency(-1),
    "cancel": _cancel,
    "retry": _retry,
    "top": _top,
}


# -- selection ------------------------------------------------------------------------------------


def selectable(snap: Snapshot) -> list[Job]:
    """Jobs the arrows move through, top to bottom as drawn: the queue, failed, finished."""
    queue_rows = (snap.status or {}).get("queue", [])
    seen: set[str] = set()
    rows = []
    for job in [*queue_rows, *snap.failed, *snap.finished]:
        # Two requests make a snapshot; a job may show up in both the queue and a list.
        if job["task_id"] not in seen:
            seen.add(job["task_id"])
            rows.append(job)
    return rows


@dataclass
class Asking:
    """A command waiting for the operator's yes (cancelling running work)."""

    command: Command | None = None


@dataclass
class Cursor:
    """The selected job: follows the job as it moves; if it vanishes, takes its place's."""

    task_id: str | None = None
    index: int = 0

    def pick(self, rows: list[Job]) -> Job | None:
        ids = [row["task_id"] for row in rows]
        if not rows:
            return None
        self.index = (
            ids.index(self.task_id) if self.task_id in ids else min(self.index, len(rows) - 1)
        )
        self.task_id = ids[self.index]
        return rows[self.index]

    def move(self, rows: list[Job], step: int) -> None:
        if self.pick(rows) is not None:
            self.index = max(0, min(self.index + step, len(rows) - 1))
            self.task_id = rows[self.index]["task_id"]


# -- keys -----------------------------------------------------------------------------------------

ARROWS = {"\x1b[A": "up", "\x1bOA": "up", "\x1b[B": "down", "\x1bOB": "down"}
NAMED = {"k": "up", "j": "down", "\r": "enter", "\n": "enter", "\x1b": "escape"}
JOB_COMMANDS = {"c": "cancel", "r": "retry", "t": "top"}
QUEUE_COMMANDS = {"p": "toggle", "+": "more", "=": "more", "-": "fewer"}


def parse_keys(chunk: str) -> list[str]:
    """Split what one read returned into keys: arrows (escape sequences) and characters."""
    keys = []
    while chunk:
        arrow = next((seq for seq in ARROWS if chunk.startswith(seq)), None)
        if arrow:
            keys.append(ARROWS[arrow])
            chunk = chunk[len(arrow) :]
        else:
            keys.append(NAMED.get(chunk[0], chunk[0]))
            chunk = chunk[1:]
    return keys


class KeyReader:
    """Keys from the terminal without waiting for Enter (cbreak), polled with select()."""

    def __init__(self, stream: Any = None) -> None:
        self.fd = (stream or sys.stdin).fileno()
        self._saved: list[Any] | None = None

    def __enter__(self) -> KeyReader:
        self._saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)  # ISIG stays on, so Ctrl-C still interrupts
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def read(self, timeout: float) -> list[str]:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        return parse_keys(os.read(self.fd, 64).decode(errors="ignore"))


# -- the loop -------------------------------------------------------------------------------------


def run(api: ApiClient, console: Console | None = None) -> int:
    """Show the live view until the user presses q (or Ctrl-C); returns the exit code."""
    if not sys.stdin.isatty():
        print("error: tui needs a terminal; use `momentry-edge status` in scripts", file=sys.stderr)
        return 2
    console = console or Console()
    feed, cursor, asking = Feed(api), Cursor(), Asking()
    feed.start()
    try:
        with KeyReader() as keys, Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                snap = feed.snapshot
                picked = cursor.pick(selectable(snap))
                selected = picked["task_id"] if picked else None
                # Every waiting job can be reached: the line is read a screenful past the
                # selected one (the API gives 1000 at most).
                feed.rows = min(console.height + waiting_index(snap, selected) + 1, 1000)
                if feed.opened and selected:
                    feed.opened = selected  # the detail view follows the selection
                _draw(live, snap, selected, feed.message, console.height, feed.opened)
                for key in keys.read(TICK):
                    if key == "q" and asking.command is None and feed.opened is None:
                        return 0
                    on_key(key, snap, cursor, feed, asking)
    except KeyboardInterrupt:
        return 0
    finally:
        feed.stop()


def _draw(
    live: Live,
    snap: Snapshot,
    selected: str | None,
    message: str,
    height: int,
    opened: str | None = None,
) -> None:
    """Show the screen; if the service's data cannot be drawn (a reply of a shape no check
    foresaw), the screen without it and a warning, until a later poll can be drawn."""
    try:
        view = render(snap, selected, message, height, time.time(), live.console.width, opened)
        live.update(view, refresh=True)
    except Exception as exc:
        error = printable(f"unexpected reply from {snap.url}: {type(exc).__name__}: {exc}")
        bare = Snapshot(snap.url, error=error, fetched_at=snap.fetched_at)
        view = render(bare, None, message, height, time.time(), live.console.width)
        live.update(view, refresh=True)


def waiting_index(snap: Snapshot, task_id: str | None) -> int:
    """Where ``task_id`` is among the waiting jobs read (0 the first); -1 if not there."""
    waiting = [j["task_id"] for j in (snap.status or {}).get("queue", []) if _waits(j)]
    return waiting.index(task_id) if task_id in waiting else -1


def _waits(job: Job) -> bool:
    return job["status"] != "processing"


def _more_waiting(snap: Snapshot, task_id: str | None) -> bool:
    """Whether ``task_id`` is the last waiting job read while more wait beyond it."""
    status = snap.status or {}
    read = sum(_waits(j) for j in status.get("queue", []))
    waiting = status.get("pending_count", 0) + (status.get("retrying_count") or 0)
    return read < waiting and waiting_index(snap, task_id) == read - 1


def on_key(key: str, snap: Snapshot, cursor: Cursor, feed: Feed, asking: Asking) -> None:
    rows = selectable(snap)
    if asking.command is not None:
        command, asking.command = asking.command, None
        if key == "y":
            feed.send(command)
        else:
            feed.message = f"{command[1]['file_name']}: left running"
        return
    if key == "enter":
        picked = cursor.pick(rows)
        feed.opened = None if feed.opened or picked is None else picked["task_id"]
        feed.send(("refresh", None))
    elif key in ("escape", "q"):
        feed.opened = None  # q quits from the list only (see run)
    elif key == "down" and _more_waiting(snap, cursor.task_id):
        # The next waiting job is past those read: they are read now (run asks for a
        # screenful past the selection), and Down goes on from there.
        feed.message = MORE
        feed.send(("refresh", None))
    elif key in ("up", "down"):
        cursor.move(rows, -1 if key == "up" else 1)
        if feed.message == MORE:
            feed.message = ""
        if feed.opened:
            feed.send(("refresh", None))
    elif key in QUEUE_COMMANDS:
        feed.send((QUEUE_COMMANDS[key], None))
    elif key in JOB_COMMANDS:
        job = cursor.pick(rows)
        if job is None:
            feed.message = "no job to act on"
        elif JOB_COMMANDS[key] == "cancel" and job["status"] == "processing":
            asking.command = ("cancel", job)
            feed.message = f"cancel {job['file_name']}, which is running? y: yes, any other key: no"
        else:
            feed.send((JOB_COMMANDS[key], job))
