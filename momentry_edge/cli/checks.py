"""`doctor`'s look at this machine besides the processors: the data dir, the watched folders
that are fine (watch_folders.py warns of the others), the API's port, the disk, the queue
database, the API's token and the running service. Each check is ok, a warning, or a
problem that stops the service from working (doctor then exits 1)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import stat
from pathlib import Path
from typing import Any

from .. import apitoken, privacy, redact, store, watch_folders
from ..config import Config
from .client import (
    ApiClient,
    ApiError,
    ServiceUnreachable,
    UnexpectedReply,
    find_service,
    find_token,
    owner,
)

OK, WARNING, PROBLEM = "ok", "warning", "problem"


def machine(cfg: Config) -> list[dict[str, str]]:
    running = _service(cfg)
    return [
        *_folders(cfg),
        _port(cfg, running),
        _disk(cfg),
        _database(cfg),
        _auth(cfg),
        *_redis(cfg),
        running,
    ]


def _auth(cfg: Config) -> dict[str, str]:
    if not cfg.service.auth:
        return _check(
            "auth",
            WARNING,
            f"service.auth = false ({cfg.origin('service.auth')}): the API asks no token; "
            "any account on this machine can read every result and steer the queue",
        )
    if cfg.service.token:
        return _check("auth", OK, f"the API asks for service.token ({cfg.origin('service.token')})")
    where = apitoken.path(cfg.data_dir)
    return _check("auth", OK, f"the API asks for the token in {where} (made at the first start)")


def _redis(cfg: Config) -> list[dict[str, str]]:
    """The Redis mirror writes file names and job states: a Redis without a password
    gives them to every client that reaches it (on this machine, any account)."""
    url = cfg.service.redis_url
    if not url:
        return []
    if redact.secrets_of(url):
        return [_check("redis mirror", OK, f"{redact.url(url)} is asked with a password")]
    return [
        _check(
            "redis mirror",
            WARNING,
            f"{redact.url(url)} has no password in service.redis_url: the mirror writes file "
            "names and job states there, which any client that reaches that Redis reads (any "
            "account on this machine, for one on loopback); set `requirepass` in Redis and "
            "put it in the URL (redis://:PASSWORD@host:6379/0)",
        )
    ]


def _check(name: str, level: str, detail: str) -> dict[str, str]:
    return {"check": name, "level": level, "detail": detail}


def _folders(cfg: Config) -> list[dict[str, str]]:
    found = []
    if not cfg.service.watch:
        found.append(_check("watch", OK, "none: a processing-only node (service.watch = [])"))
    # A folder missing or closed is a warning of its own (doctor's watch_warnings).
    troubled = {str(f) for f in cfg.service.watch if watch_folders.problems([f])}
    found += [_check("watch", OK, str(f)) for f in cfg.service.watch if str(f) not in troubled]
    data = cfg.data_dir
    if data.is_dir():
        writable = os.access(data, os.W_OK | os.X_OK)
        level, detail = (OK, f"{data}") if writable else (PROBLEM, f"{data} is not writable")
    else:
        parent = _existing(data)
        makeable = os.access(parent, os.W_OK | os.X_OK)
        level = OK if makeable else PROBLEM
        detail = f"{data} (made at the first start)" if makeable else f"cannot create {data}"
    found.append(_check("data dir", level, detail))
    if level == OK and data.is_dir():
        found += _privacy(data)
    return found


def _privacy(data: Path) -> list[dict[str, str]]:
    """Whether other accounts could read what the data dir holds (transcripts, file names)."""
    if privacy.ignores_modes(data):
        return [
            _check(
                "data dir privacy",
                WARNING,
                f"{data} is on a volume that keeps no file modes (FAT, exFAT or a network "
                "share): any account on this machine can read the queue and the results; "
                "put service.data_dir on a disk of the machine's own format",
            )
        ]
    mode = stat.S_IMODE(data.stat().st_mode)
    if mode & 0o077 and mode != privacy.SHARED_DATA_DIR:
        return [
            _check(
                "data dir privacy",
                WARNING,
                f"{data} is mode {mode:04o}: other accounts may reach it; the service makes it "
                "0700 at its next start",
            )
        ]
    return [_check("data dir privacy", OK, f"{data} is mode {mode:04o}")]


def _port(cfg: Config, running: dict[str, str]) -> dict[str, str]:
    host, port = cfg.service.host, cfg.service.port
    if port == 0:
        return _check("port", OK, "any free port (service.port = 0)")
    if running["level"] == OK and f":{port}" in running["detail"]:
        return _check("port", OK, f"{host}:{port}, held by the running service")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            whose = (
                "another account's service"
                if "not this account's" in running["detail"]
                else "another program"
            )
            return _check(
                "port",
                PROBLEM,
                f"{host}:{port} cannot be used ({exc.strerror}): {whose} listens there;"
                " set service.port",
            )
    return _check("port", OK, f"{host}:{port} is free")


def _disk(cfg: Config) -> dict[str, str]:
    usage = shutil.disk_usage(_existing(cfg.data_dir))
    free_mb, floor = usage.free / 1e6, cfg.queue.min_free_disk_mb
    detail = f"{free_mb / 1000:.1f} GB free where the data dir is (jobs stop below {floor:.0f} MB)"
    return _check("disk", OK if free_mb >= floor else PROBLEM, detail)


def _database(cfg: Config) -> dict[str, str]:
    path = store.sqlite_file(cfg.service.database_url, cfg.data_dir)
    if path is None:
        return _postgres(cfg.service.database_url)
    if not path.exists():
        return _check("database", OK, f"{path} (made at the first start)")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        return _check("database", PROBLEM, f"{path} cannot be read: {exc}")
    return _check("database", OK, f"SQLite {path}")


def _postgres(url: str) -> dict[str, str]:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
            where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _check("database", PROBLEM, f"PostgreSQL cannot be reached: {reason}")
    return _check("database", OK, f"PostgreSQL {where}")


def _service(cfg: Config) -> dict[str, str]:
    found = find_service(cfg)
    try:
        with ApiClient(found.url, find_token(cfg, found).value, timeout=5) as api:
            whose = owner(api)
            if not whose.mine:  # e.g. a fresh account's default port, another's service
                return _check("service", WARNING, f"{found.url} answers: {whose.said(found.url)}")
            api.queue_status()
    except ServiceUnreachable:
        return _check(
            "service",
            WARNING,
            f"no answer at {found.url}; start it with `momentry-edge service start` "
            "or `momentry-edge run`",
        )
    except (UnexpectedReply, ApiError, ValueError) as exc:
        return _check("service", PROBLEM, f"{found.url} answers, but: {exc}")
    said = f"running at {found.url} (found through {found.how})"
    return _check("service", OK, f"{said}; {whose.said(found.url)}" if whose.account else said)


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor or "/"))


def problems(checks: list[dict[str, Any]]) -> bool:
    return any(c["level"] == PROBLEM for c in checks)
