"""Registering media files: path checks, probe, identity and fingerprint."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from . import db
from .db import MediaFile
from .errors import Invalid
from .events import bus
from .media import MediaError, probe

_NAMESPACE = uuid.UUID("5d1f6a63-8a3e-4f0e-9d9b-2f0c6f1e7a11")
_SAMPLE = 1 << 20  # bytes hashed at head, middle and tail


def file_uuid_for(path: Path) -> str:
    """Stable per absolute path: the same path always names the same file."""
    return uuid.uuid5(_NAMESPACE, str(path)).hex


def fingerprint(path: Path, size: int) -> str:
    """Size plus a hash of three samples: quick on multi-GB files, changes when content does."""
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        for offset in sorted({0, max(size // 2 - _SAMPLE // 2, 0), max(size - _SAMPLE, 0)}):
            f.seek(offset)
            digest.update(f.read(_SAMPLE))
    return f"{size}:{digest.hexdigest()}"


def resolve_in_watch(raw: str, watch_dirs: Sequence[Path]) -> tuple[Path, Path]:
    """The real path of ``raw`` and the watched folder that holds it, or Invalid."""
    roots = [Path(os.path.realpath(w)) for w in watch_dirs]
    candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in roots]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        for root in roots:
            if real.is_relative_to(root) and real != root:
                return real, root
    raise Invalid(f"path {raw!r} is not inside a watched folder (after resolving symlinks)")


def register(
    path: Path, watch_root: Path, *, upload_ok: bool = True, now: float | None = None
) -> tuple[MediaFile, bool]:
    """Record the file at ``path``; returns (file, changed) where changed means new content.

    Unreadable or aborted uploads are recorded as ``rejected`` with the reason.
    """
    now = time.time() if now is None else now
    existing = MediaFile.get_or_none(MediaFile.path == str(path))
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise Invalid(f"no file at {path}") from None
    if not path.is_file():
        raise Invalid(f"{path} is not a regular file")

    fields: dict = {
        "watch_root": str(watch_root),
        "rel_path": str(path.relative_to(watch_root)),
        "name": path.name,
        "size": stat.st_size,
        "mtime": stat.st_mtime,
        "updated_at": now,
    }
    if (
        existing is not None
        and upload_ok
        and existing.state != db.MISSING
        and (existing.size, existing.mtime) == (stat.st_size, stat.st_mtime)
    ):
        return existing, False

    if not upload_ok:
        fields.update(state=db.REJECTED, reason="upload did not finish (upload_status != 1)")
    else:
        try:
            info = probe(path)
        except MediaError as exc:
            fields.update(state=db.REJECTED, reason=exc.reason)
        else:
            fields.update(
                state=db.PRESENT,
                reason=None,
                duration=info.duration,
                width=info.width,
                height=info.height,
                fps=info.fps,
                video_codec=info.video_codec,
                audio_codec=info.audio_codec,
            )
        fields["fingerprint"] = fingerprint(path, stat.st_size) if stat.st_size else None

    if existing is None:
        record = MediaFile.create(
            file_uuid=file_uuid_for(path), path=str(path), registered_at=now, **fields
        )
        bus.publish("file.registered", file_uuid=record.file_uuid, state=record.state)
        return record, True
    changed = fields.get("fingerprint") != existing.fingerprint or existing.state != fields["state"]
    MediaFile.update(fields).where(MediaFile.id == existing.id).execute()
    return MediaFile.get_by_id(existing.id), changed
