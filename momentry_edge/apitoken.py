"""The API token: ``service.token`` when set, else one made at first start into
``<data_dir>/api-token``, a file only the service's account can read. The CLI of that
account reads it from there; any other account cannot, and is refused by the API."""

# Made as Jupyter makes its token: random, kept, required on loopback too, so that no
# other account on a shared machine reads file names and transcripts or steers the queue.

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from .config import Config

FILE_NAME = "api-token"
# The shortest token a service reachable from the network may have: 32 characters, so
# `openssl rand -hex 16` (128 random bits) is the shortest accepted; the made one is 43.
MIN_REMOTE_LENGTH = 32


def path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def effective(config: Config) -> str:
    """The token the service requires: "" when ``service.auth = false``; the configured
    one when set; else the data dir's token file's, made now if there is none."""
    if not config.service.auth:
        return ""
    if config.service.token:
        return config.service.token
    return ensure(config.data_dir)


def ensure(data_dir: Path) -> str:
    """The token in the data dir's file, made if there is none. The file is written whole
    under a name of its own, created 0600 (never readable by another account, not even
    for an instant), then linked into place: a reader sees a complete token or none."""
    existing = read(data_dir)
    if existing:
        with contextlib.suppress(OSError):  # loosened by hand, or copied in: private again
            if path(data_dir).stat().st_mode & 0o077:
                path(data_dir).chmod(0o600)
        return existing
    token = secrets.token_urlsafe(32)
    staged = data_dir / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(staged, path(data_dir))  # fails if another start made one meanwhile
        except FileExistsError:
            return read(data_dir) or token
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()
    return token


def read(data_dir: Path) -> str:
    """The token in the data dir's file; "" when there is none. PermissionError when this
    account may not read it (it belongs to the service's)."""
    try:
        text = path(data_dir).read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return ""
    return text.strip()


def owner(data_dir: Path) -> str:
    """The account the token file (else the data dir) belongs to, by name if it has one."""
    import pwd

    for candidate in (path(data_dir), data_dir):
        try:
            uid = candidate.stat().st_uid
        except OSError:
            continue
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"
    return "another account"
