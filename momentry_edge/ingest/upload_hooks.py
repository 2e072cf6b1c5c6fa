"""Upload notifications in other programs' own formats, turned into a register call."""

# SFTPGo (custom actions hook, or an event rule's HTTP action sending the same
# fields) posts ``{"action": "upload", "username", "path", "virtual_path",
# "file_size", "status", "protocol", "ip", "timestamp", ...}`` where ``path`` is
# the file's full filesystem path, ``virtual_path`` the path the SFTP user sees
# (from their home folder) and ``status`` 1 = ok, 2 = error, 3 = quota exceeded.
#
# A failed upload reported for a file that is just as it was registered, and does not
# hold the failed upload's ``file_size`` bytes, is another upload's news: in SFTPGo's
# atomic upload mode a failed upload never touches the file under its name. Unless the
# file was registered as it was changed after that upload began (``timestamp``, in
# nanoseconds, less ``elapsed``, in milliseconds): written in place, the watcher may
# have taken the failed upload's bytes (it takes a file once its writer closes it)
# before the hook arrived.

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import store
from ..errors import Conflict, Invalid
from ..store import FileState, MediaFile
from .paths import NOT_FOLLOWED, resolve_in_watch

log = logging.getLogger(__name__)

SFTPGO_OK = 1
FIELD_TYPES = {
    "username": str,
    "path": str,
    "virtual_path": str,
    "file_size": int,
    "status": int,
    "timestamp": int,
    "elapsed": int,
}
# File times come from the kernel's coarse clock, up to a tick behind the one SFTPGo
# stamps its events with: a change this close before an upload began may be the upload's.
CLOCK_SLACK = 0.05


@dataclass(frozen=True)
class Upload:
    path: Path  # real path inside a watched folder
    ok: bool  # False: SFTPGo reports the upload failed; the file is recorded rejected
    status: int
    size: int | None = None  # file_size: the bytes SFTPGo received for this upload
    started: float | None = None  # when the upload began (seconds since the epoch)


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
    return Upload(path, ok, status, body.get("file_size"), _started(body))


def _started(body: dict[str, Any]) -> float | None:
    """When the upload began: the event's ``timestamp`` less its ``elapsed``; None
    without both (an Event Manager body may send neither)."""
    stamp, elapsed = body.get("timestamp"), body.get("elapsed")
    if stamp is None or elapsed is None:
        return None
    return stamp / 1e9 - elapsed / 1e3


def untouched(upload: Upload) -> MediaFile | None:
    """The record of the file a failed upload names when that upload cannot have written
    it: the file is as it was registered (size, mtime, inode, ctime), its size is not the
    upload's, and it was registered as it was before the upload began. Else None: the
    file may be what the failed upload left, and is rejected."""
    if upload.ok:
        return None
    try:
        st = upload.path.lstat()
    except OSError:
        return None
    record = MediaFile.get_or_none(MediaFile.path == str(upload.path))
    if record is None or record.state == FileState.MISSING or st.st_size == upload.size:
        return None
    if not store.unchanged((record.size, record.mtime, record.inode, record.ctime), st):
        return None
    if upload.started is not None and st.st_ctime >= upload.started - CLOCK_SLACK:
        return None  # registered with what the upload may have written in place
    log.info(
        "SFTPGo reports a failed upload (status %d) of %s, which is unchanged since it was "
        "registered: left as it is",
        upload.status,
        record.rel_path,
    )
    return record


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
            return _not_linked(Path(fs_path), *resolve_in_watch(fs_path, watch))
        except Invalid as exc:
            problem = exc
    if virtual:
        relative = virtual.lstrip("/")
        found = []
        for root in watch:
            try:
                real, real_root = resolve_in_watch(relative, [root])
                found.append(_not_linked(real_root / relative, real, real_root))
            except Invalid as exc:
                problem = exc
        if found:
            # The watched folder that has the file; the first one when none has it yet.
            return next((p for p in found if p.exists()), found[0])
    assert problem is not None
    raise problem


def _not_linked(given: Path, real: Path, root: Path) -> Path:
    """``real`` unless ``given`` reaches it through a symlink inside the watched folder
    ``root``: the watcher never follows one, so neither does the hook (it would name the
    link's target). How SFTPGo reaches the watched folder itself is its own business."""
    for step in (given, *given.parents):
        folder = Path(os.path.realpath(step.parent))
        if not folder.is_relative_to(root):
            break  # above the watched folder
        if step.is_symlink():
            raise Invalid(f"{given.name}: not taken: {NOT_FOLLOWED}")
    return real
