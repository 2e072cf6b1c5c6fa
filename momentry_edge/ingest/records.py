"""What intake and the file guard share: outcomes, probe fields, path locks, stats."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from typing import Any

import peewee as pw

from .. import store
from ..media import MediaInfo


class Outcome(enum.Enum):
    NEW = "new"  # first time this path is seen
    CHANGED = "changed"  # different content (or state) than the record had
    RESTORED = "restored"  # was missing or rejected, is back with the same content
    TOUCHED = "touched"  # its stat changed, its content (fingerprint) did not
    UNCHANGED = "unchanged"  # recognised by its stat (store.unchanged), not read at all


def metadata(info: MediaInfo | None) -> dict[str, Any]:
    """The probe's findings as MediaFile fields; all None when there are none (yet)."""
    return {
        "duration": info.duration if info else None,
        "width": info.width if info else None,
        "height": info.height if info else None,
        "fps": info.fps if info else None,
        "video_codec": info.video_codec if info else None,
        "audio_codec": info.audio_codec if info else None,
        "hdr": info.hdr if info else None,
        # Square pixels say nothing: null, as for audio (MediaInfo says "1:1" then).
        "sample_aspect_ratio": (
            info.sample_aspect_ratio if info and info.sample_aspect_ratio != "1:1" else None
        ),
        "mirrored": info.mirrored if info else None,
    }


def lock_path(database: pw.Database, path: str) -> None:
    """Serialise admissions of one path across threads and nodes, until the commit."""
    lock_paths(database, [path])


def lock_paths(database: pw.Database, paths: Sequence[str]) -> None:
    """``lock_path`` for many paths in one statement; in one order (the keys sorted),
    so two batches never wait on each other."""
    if store.is_postgres(database) and paths:
        keys = sorted(
            int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "big", signed=True)
            for p in paths
        )
        database.execute_sql("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) k", (keys,))
