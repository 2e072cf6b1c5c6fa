"""Logging: JSON lines in <data_dir>/logs (rotated) and readable lines on stderr.

Every line logged while a worker runs a job carries that job's task_id, set
once per job through a context variable, so processors need not pass it along.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from .clock import iso
from .terminal import json_shielded, printable

_string = json.encoder.encode_basestring  # a str as a JSON string, as json.dumps gives it

current_task: ContextVar[str | None] = ContextVar("current_task", default=None)


def _task_id(record: logging.LogRecord) -> str | None:
    return getattr(record, "task_id", None) or current_task.get()


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and task_id and error when
    there are. Written out as json.dumps would give the object (the worker logs a few
    lines a job, and building and dumping a dict cost more than writing the line)."""

    def format(self, record: logging.LogRecord) -> str:
        text = (
            f'{{"time": "{iso(record.created)}", "level": {_string(record.levelname.lower())},'
            f' "logger": {_string(record.name)}, "message": {_string(record.getMessage())}'
        )
        if task_id := _task_id(record):
            text += f', "task_id": {_string(task_id)}'
        if record.exc_info:
            text += f', "error": {_string(self.formatException(record.exc_info))}'
        # File names in messages must not drive a tailing terminal.
        return json_shielded(text + "}")


class Readable(logging.Formatter):
    converter = staticmethod(time.gmtime)  # UTC, as the log file and `logs` say it

    def __init__(self) -> None:
        super().__init__("%(asctime)s UTC %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        # One line: messages quote file names, and a name with a line break in it must not
        # start a line of its own that reads as another message.
        return printable(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        task_id = _task_id(record)
        if task_id and task_id not in record.getMessage():
            text = f"{text} [{task_id}]"
        # stderr is often a terminal. Tracebacks (after the message) keep their lines.
        return printable(text, multiline=True)


# After a write failed for lack of room, the log is written again only once this much
# is free on its disk: a few bytes freed would take a few lines and fail again, and the
# log would flap between failing and writing.
RESUME_FREE = 64 << 10
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_GAP = "%d log lines lost from %s: %s could not be written"


class RotatingFile(logging.handlers.RotatingFileHandler):
    """Rotated by size as its base class is, but checked by the file's position before a
    line is written: the base formats every line twice and stats the file twice a line
    to check. A file rotates once it has reached ``maxBytes`` (its last line may end past it)."""

    _failing = False  # the last line could not be written
    _no_room = False  # ... for lack of room: wait for RESUME_FREE before trying again
    _lost = 0  # lines lost since it failed
    _lost_since = 0.0  # when the first of them was

    def emit(self, record: logging.LogRecord) -> None:
        if self._no_room and not self._room():
            self._lose(record)  # not tried: a write now would only fail again
            return
        self._failed = False
        lost = self._lost
        if self._failing and lost:
            super().emit(self._gap())  # the gap, said once in the log itself, where it is
            if not self._failed:
                self._lost = 0
        if not self._failed:
            super().emit(record)  # calls handleError when the line cannot be written
        if self._failing and not self._failed:
            self._failing = self._no_room = False
            sys.stderr.write(
                f"momentry-edge: writing to {self.baseFilename} again ({lost} lines lost)\n"
            )

    def _room(self) -> bool:
        try:
            disk = os.statvfs(os.path.dirname(self.baseFilename))
        except OSError:
            return True  # let the write say what is wrong
        return disk.f_bavail * disk.f_frsize >= RESUME_FREE

    def _lose(self, record: logging.LogRecord) -> None:
        if record.msg is _GAP:
            return
        if not self._lost:
            self._lost_since = record.created
        self._lost += 1

    def _gap(self) -> logging.LogRecord:
        return logging.makeLogRecord(
            {
                "name": __name__,
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": _GAP,
                "args": (self._lost, iso(self._lost_since), self.baseFilename),
            }
        )

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        # A full or failing disk: one line on stderr, not a traceback for every record.
        self._failed = True
        self._no_room = error.errno in _NO_ROOM
        self._lose(record)
        if self.stream is not None:  # what it buffered is dropped; reopened for the next
            with contextlib.suppress(OSError):
                self.stream.close()
            self.stream = None
        if not self._failing:
            self._failing = True
            sys.stderr.write(
                f"momentry-edge: cannot write to {self.baseFilename} ({error}); "
                "its lines are lost until it can be written again\n"
            )

    def _open(self) -> Any:
        if self._failing:
            _drop_cut_line(self.baseFilename)
        stream = super()._open()
        # Only a regular file rotates (the base class's rule, bpo-45401), looked at once.
        self._regular = os.path.isfile(self.baseFilename)
        return stream

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:  # delayed, or closed by a rollover that failed
            self.stream = self._open()
        return self.maxBytes > 0 and self._regular and self.stream.tell() >= self.maxBytes


TASK_ID = re.compile(r"task_[0-9a-f]{12}")
JOB_LOG_BYTES = 64 << 10  # of each job's lines, per node, kept for the other nodes to read
JOB_LOG_TASKS = 256  # jobs whose lines wait to be kept, at most (the database may be down)


class JobLines(logging.Handler):
    """Holds the lines logged about each job (its task id set, or named in the message)
    until the service takes them into the queue database (jobs.job_log), so that every
    node can read them. Bounded: the last JOB_LOG_BYTES of a job, the last JOB_LOG_TASKS jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonLines())
        self._pending: dict[str, deque[str]] = {}
        self._sizes: dict[str, int] = {}
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "peewee":  # its queries name the task ids this keeps
            return
        tasks = set(TASK_ID.findall(record.getMessage()))
        if task := _task_id(record):
            tasks.add(task)
        if not tasks:
            return
        line = self.format(record)
        with self._guard:
            for task in tasks:
                self._add(task, [line])

    def _add(self, task: str, lines: Iterable[str]) -> None:
        held = self._pending.setdefault(task, deque())
        size = self._sizes.get(task, 0)
        for line in lines:
            held.append(line)
            size += len(line) + 1
        while size > JOB_LOG_BYTES and len(held) > 1:
            size -= len(held.popleft()) + 1
        self._sizes[task] = size
        while len(self._pending) > JOB_LOG_TASKS:
            oldest = next(iter(self._pending))
            del self._pending[oldest], self._sizes[oldest]

    def take(self) -> dict[str, list[str]]:
        """The lines held, each job's oldest first; held no more."""
        with self._guard:
            taken = {task: list(lines) for task, lines in self._pending.items()}
            self._pending.clear()
            self._sizes.clear()
        return taken

    def put_back(self, lines: dict[str, list[str]]) -> None:
        """Lines taken but not kept (the database failed): held again, before newer ones."""
        with self._guard:
            newer = {task: list(held) for task, held in self._pending.items()}
            self._pending.clear()
            self._sizes.clear()
            for task in {**lines, **newer}:
                self._add(task, [*lines.get(task, ()), *newer.get(task, ())])


class Repeats:
    """Says a recurring failure when it first happens, then the same one again at most
    every ``every`` seconds (a resource run out fails the same way at every tick), and
    once when it has passed."""

    def __init__(self, logger: logging.Logger, every: float = 60.0) -> None:
        self._log = logger
        self._every = every
        self._said: dict[str, tuple[str, float]] = {}  # what -> (its error, said at)
        self._lock = threading.Lock()

    def failed(self, what: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {error}"
        now = time.monotonic()
        with self._lock:
            said = self._said.get(what)
            if said is not None and said[0] == text and now - said[1] < self._every:
                return
            self._said[what] = (text, now)
        self._log.error("%s failed", what, exc_info=error)

    def worked(self, what: str) -> None:
        with self._lock:
            said = self._said.pop(what, None)
        if said is not None:
            self._log.info("%s works again", what)


def _drop_cut_line(path: str) -> None:
    """Cut back a line that a failed write left half written, to the end of the last
    whole line, so that every line of the file stays one JSON object."""
    with contextlib.suppress(FileNotFoundError), open(path, "rb+") as file:
        end = file.seek(0, os.SEEK_END)
        start = file.seek(max(0, end - (1 << 20)))
        last = file.read().rfind(b"\n")
        if last >= 0 or start == 0:
            file.truncate(start + last + 1)


def forget(data_dir: Path, words: Collection[str]) -> int:
    """Take the lines naming any of ``words`` (a file's name, path, uuid, task ids) out of
    the log files in <data_dir>/logs, rotated ones included; returns how many. The live
    file is rewritten in place under its handler's lock: the handler appends (O_APPEND),
    so its next line goes after what is kept."""
    forms = {form for word in words if word for form in (word, _string(word)[1:-1])}
    handler = next((h for h in logging.getLogger().handlers if isinstance(h, RotatingFile)), None)
    removed = 0
    if handler is not None:
        handler.acquire()
    try:
        for path in sorted((data_dir / "logs").glob("*")):
            if not path.is_file():
                continue
            with path.open("r+b") as f:
                lines = f.read().splitlines(keepends=True)
                kept = [
                    line
                    for line in lines
                    if not any(form in line.decode("utf-8", "replace") for form in forms)
                ]
                if len(kept) != len(lines):
                    f.seek(0)
                    f.write(b"".join(kept))
                    f.truncate()
                    removed += len(lines) - len(kept)
    finally:
        if handler is not None:
            handler.release()
    return removed


def setup(data_dir: Path, level: str) -> Path:
    """Send logs to a rotated JSON-lines file and to stderr; returns the file's path."""
    folder = data_dir / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAME
    to_file = RotatingFile(path, maxBytes=10 << 20, backupCount=5, encoding="utf-8")
    to_file.setFormatter(JsonLines())
    to_stderr = logging.StreamHandler()
    to_stderr.setFormatter(Readable())
    if not sys.stderr.isatty():
        # Under launchd/systemd stderr is a file nobody rotates: keep it to problems.
        to_stderr.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.handlers[:] = [to_file, to_stderr]
    root.setLevel(level.upper())
    logging.getLogger("huey").setLevel(logging.WARNING)
    logging.getLogger("waitress").addFilter(_closed_streams_are_debug)
    return path


def _closed_streams_are_debug(record: logging.LogRecord) -> bool:
    """waitress says at INFO each reader that went away mid-answer: every closed console tab
    (its event stream). Routine: DEBUG."""
    if record.levelno == logging.INFO and str(record.msg).startswith("Client disconnected"):
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)
    return True


# -- reading it, as `momentry-edge logs` and a job's log route do ----------------------------

NAME = "momentry-edge.log"


def readable(raw: str) -> str:
    """One line of the JSON log as a person reads it; a line that is not JSON, as it is."""
    try:
        entry: dict[str, Any] = json.loads(raw)
        stamp = str(entry["time"]).replace("T", " ")[:19]
        text = f"{stamp} UTC {str(entry['level']).upper()} {entry['logger']}: {entry['message']}"
    except (ValueError, KeyError, TypeError):
        return printable(raw.rstrip("\n"))
    task = entry.get("task_id")
    if task and task not in text:
        text += f" [{task}]"
    line = printable(text)
    if entry.get("error"):  # the traceback keeps its lines, indented under the message
        line += "\n" + printable("    " + str(entry["error"]).replace("\n", "\n    "), True)
    return line


def job_lines(folder: Path, task_id: str, most: int, others: Iterable[str] = ()) -> list[str]:
    """The last ``most`` readable lines about the job ``task_id``: those of the log in
    ``folder`` and ``others`` (JSON lines other nodes wrote), in the order of their times."""
    mine = (raw for raw in raw_lines(log_files(folder)) if task_id in raw)
    return [readable(raw) for raw in deque(merged(mine, others), maxlen=most)]


def merged(*logs: Iterable[str]) -> list[str]:
    """JSON lines of several logs, each in its order, as one log in the order of their times."""
    return sorted((raw for log in logs for raw in log), key=_time_of)


def _time_of(raw: str) -> str:
    # Each line begins {"time": "<ISO 8601, UTC>", (JsonLines): compared as text.
    return raw[10:34] if raw.startswith('{"time": "') else ""


def log_files(folder: Path) -> list[Path]:
    """The log's files in ``folder``, oldest first: the rotated ones, then the live one."""
    rotated = sorted(folder.glob(f"{NAME}.[0-9]*"), key=lambda p: -int(p.suffix[1:] or 0))
    return [*rotated, folder / NAME]


def read_lines(files: Iterable[Path]) -> Iterator[str]:
    """Every line of ``files`` as a person reads it (readable)."""
    return (readable(raw) for raw in raw_lines(files))


def raw_lines(files: Iterable[Path]) -> Iterator[str]:
    """Every line of ``files``, as written."""
    for path in files:
        try:
            with path.open(encoding="utf-8", errors="replace") as stream:
                yield from stream
        except FileNotFoundError:
            continue  # rotated away meanwhile
