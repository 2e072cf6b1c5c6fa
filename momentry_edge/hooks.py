"""Upload notifications in other programs' own formats, turned into a register call.

SFTPGo (custom actions hook, or an event rule's HTTP action sending the same
fields) posts ``{"action": "upload", "username", "path", "virtual_path",
"file_size", "status", "protocol", "ip", "timestamp", ...}`` where ``path`` is
the file's full filesystem path, ``virtual_path`` the path the SFTP user sees
(from their home folder) and ``status`` 1 = ok, 2 = error, 3 = quota exceeded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import Conflict, Invalid
from .ingest import resolve_in_watch

SFTPGO_OK = 1
FIELD_TYPES = {"username": str, "path": str, "virtual_path": str, "file_size": int, "status": int}


@dataclass(frozen=True)
class Upload:
    path: Path  # real path inside a watched folder
    ok: bool  # False: SFTPGo reports the upload failed; the file is recorded rejected
    status: int


def sftpgo_upload(body: dict[str, Any], watch: Sequence[Path]) -> Upload | None:
    """The upload SFTPGo reports, or None for an action that is not an upload."""
    action = body.get("action")
    if not isinstance(action, str) or not action:
        raise Invalid("action is required (SFTPGo's action name, e.g. upload)")
    for name, kind in FIELD_TYPES.items():  # what SFTPGo sends is never anything else
        value = body.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise Invalid(f"{name} must be {'an integer' if kind is int else 'a string'}")
    if action != "upload":
        return None  # download, delete, first-upload (always followed by upload), ...
    status = body.get("status")
    if not isinstance(status, int) or isinstance(status, bool):
        raise Invalid("status must be an integer (1 ok, 2 error, 3 quota exceeded)")
    path = _locate(body, watch)
    ok = status == SFTPGO_OK
    if ok:
        _check_whole(path, body.get("file_size"))
    return Upload(path, ok, status)


def _check_whole(path: Path, size: int | None) -> None:
    """Conflict while the file has fewer bytes than SFTPGo uploaded: probed now, it would
    be rejected as truncated. The watcher takes it once its writer is done."""
    try:
        st = path.stat()
    except OSError:
        return  # no file: register says so
    have = st.st_size
    if size is not None and stat.S_ISREG(st.st_mode) and have < size:
        raise Conflict(
            f"{path.name} is still being written ({have} of the {size} bytes SFTPGo "
            "uploaded are there); it is taken once whole"
        )


def _locate(body: dict[str, Any], watch: Sequence[Path]) -> Path:
    """``path`` when it is inside a watched folder; else ``virtual_path`` from a watched
    folder (the SFTP user's home is the drop folder, seen under another mount by SFTPGo)."""
    fs_path, virtual = body.get("path"), body.get("virtual_path")
    if not fs_path and not virtual:
        raise Invalid("path or virtual_path is required")
    problem = None
    if fs_path:
        if not os.path.isabs(fs_path):
            raise Invalid(f"path {fs_path!r} must be SFTPGo's full filesystem path")
        try:
            return resolve_in_watch(fs_path, watch)[0]
        except Invalid as exc:
            problem = exc
    if virtual:
        relative = virtual.lstrip("/")
        found = []
        for root in watch:
            try:
                found.append(resolve_in_watch(relative, [root])[0])
            except Invalid as exc:
                problem = exc
        if found:
            # The watched folder that has the file; the first one when none has it yet.
            return next((p for p in found if p.exists()), found[0])
    assert problem is not None
    raise problem
