"""`momentry-edge logs [-f] [--job ID]`: the service's JSON-lines log as readable lines,
``2026-12-04 23:06:20 UTC INFO service: message [task]``, times in UTC, labelled so. The
rotated files (.1 to .5) are read too, oldest first; -f follows the live file across a
rotation."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..config import Config
from ..logs import NAME, log_files, read_lines, readable
from ..terminal import printable
from .client import (
    ApiClient,
    ApiError,
    ServiceUnreachable,
    UnexpectedReply,
    find_service,
    find_token,
)

FOLLOW_EVERY = 0.25  # seconds between looks at the live file


def command(cfg: Config, args: argparse.Namespace) -> int:
    if args.job and not args.follow:
        # Through the service: the job may have run on another node (nodes share the
        # database, not a disk), whose lines the service reads from there.
        try:
            lines = _from_service(cfg, args.job, args.lines)
        except ApiError as exc:
            print(printable(f"error: --job {args.job}: {exc.message}"), file=sys.stderr)
            return 1
        if lines is not None:
            for line in lines:
                print(line, flush=False)
            sys.stdout.flush()
            return 0
    folder = log_folder(cfg)
    live = folder / NAME
    if not live.exists():
        print(printable(f"error: no log at {live} (has the service run here?)"), file=sys.stderr)
        return 1
    try:
        job = _task_id(cfg, args.job) if args.job else None
    except LookupError as exc:
        print(printable(f"error: --job {args.job}: {exc}"), file=sys.stderr)
        return 1
    wanted = [line for line in read_lines(log_files(folder)) if _matches(line, job)]
    for line in deque(wanted, maxlen=args.lines) if args.lines else ():
        print(line, flush=False)
    sys.stdout.flush()
    if args.follow:
        try:
            for line in follow(live):
                if _matches(line, job):
                    print(line, flush=True)
        except KeyboardInterrupt:
            return 0
    return 0


def _from_service(cfg: Config, ref: str, most: int) -> list[str] | None:
    """The job's last ``most`` lines as the service gives them; None when it cannot be asked
    (the local log file is read then)."""
    if most == 0:
        return []
    found = find_service(cfg)
    try:
        with ApiClient(found.url, find_token(cfg, found).value, timeout=5) as api:
            return [str(line) for line in api.job_log(ref.strip(), min(most, 1000))["lines"]]
    except ApiError as exc:
        if exc.status in (400, 404):
            raise  # no such job
        return None  # e.g. another account's service: this account's own log file
    except (ServiceUnreachable, UnexpectedReply):
        return None


def log_folder(cfg: Config) -> Path:
    """The running service's log folder (it may have a data dir of its own), else ours."""
    found = find_service(cfg)
    data_dir = (found.entry or {}).get("data_dir") or cfg.data_dir
    return Path(data_dir) / "logs"


def follow(path: Path) -> Iterator[str]:
    """The lines written to ``path`` from now on, also once it has been rotated."""
    stream = path.open("rb")
    stream.seek(0, os.SEEK_END)
    pending = b""
    while True:
        chunk = stream.readline()
        if chunk:
            pending += chunk
            if pending.endswith(b"\n"):  # else half written: the rest comes later
                yield readable(pending.decode("utf-8", errors="replace"))
                pending = b""
            continue
        time.sleep(FOLLOW_EVERY)
        if _rotated(path, stream):
            stream.close()
            stream, pending = path.open("rb"), b""


def _task_id(cfg: Config, ref: str) -> str:
    """The task id of the job ``ref`` names: the lines name a job by it. A job id or file
    uuid is looked up through the service."""
    ref = ref.strip()
    if TASK_ID.fullmatch(ref):
        return ref
    found = find_service(cfg)
    try:
        with ApiClient(found.url, find_token(cfg, found).value, timeout=5) as api:
            return str(api.job(ref)["task_id"])
    except ApiError as exc:
        raise LookupError(exc.message) from None
    except (ServiceUnreachable, UnexpectedReply, ValueError) as exc:
        raise LookupError(
            f"a job id or file uuid is looked up through the service: {exc}; "
            "give the job's task id (task_...)"
        ) from None


TASK_ID = re.compile(r"task_[0-9a-f]{12}")


def _matches(line: str, task_id: str | None) -> bool:
    """Lines about that job: they name its task id whole (not a longer id holding it)."""
    return task_id is None or re.search(rf"(?<![\w]){re.escape(task_id)}(?![\w])", line) is not None


def _rotated(path: Path, stream: BinaryIO) -> bool:
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(stream.fileno())
    return (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev) or now.st_size < stream.tell()
