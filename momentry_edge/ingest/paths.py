"""Which files are taken, and where a path is: names, extensions, the watched folders."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePath

from ..errors import Invalid

_NAMESPACE = uuid.UUID("5d1f6a63-8a3e-4f0e-9d9b-2f0c6f1e7a11")


# Names upload clients give a file while it is still being written.

TEMP_SUFFIXES = (".part", ".filepart", ".tmp", ".crdownload", ".partial")

# A path longer than this, or a component longer than NAME_MAX bytes, cannot name a file.
PATH_MAX, NAME_MAX = 4096, 255


NOT_FOLLOWED = "a symlink, not followed (symlinks could lead out of the watched folder)"


def file_uuid_for(path: Path) -> str:
    """Stable per absolute path: the same path always names the same file."""
    return uuid.uuid5(_NAMESPACE, str(path)).hex


def normalize_extensions(extensions: Sequence[str]) -> tuple[str, ...]:
    """Lower case with a leading dot, so "MP4", "mp4" and ".mp4" all mean the same."""
    return tuple("." + e.lower().lstrip(".") for e in extensions if e.strip("."))


NOT_TAKEN = "extension"  # how the reason for a kind of file not taken begins


def shown_ignored(reason: str | None) -> bool:
    """Whether a file not taken for ``reason`` is recorded as ``ignored``: a kind of file
    not taken is; a hidden file, or one still being uploaded under a temporary name, is not."""
    return reason is not None and reason.startswith(NOT_TAKEN)


def ignored_reason(rel_path: PurePath, extensions: Sequence[str]) -> str | None:
    """Why a file at ``rel_path`` (relative to its watched folder) is not taken, or None."""
    hidden = [part for part in rel_path.parts[:-1] if part.startswith(".")]
    if hidden:
        return f"it is inside the hidden folder {hidden[0]!r}"
    name = rel_path.name
    if name.startswith("."):
        return "hidden files (dotfiles) are not taken"
    if name.startswith("~$"):
        return "temporary files (~$ prefix) are not taken"
    lower = name.lower()
    for suffix in TEMP_SUFFIXES:
        if lower.endswith(suffix):
            return f"{suffix} is a temporary or partial upload name; it is taken once renamed"
    if not lower.endswith(tuple(extensions)):
        return f"{NOT_TAKEN} {PurePath(lower).suffix or '(none)'!r} is not in [ingest].extensions"
    try:
        str(rel_path).encode("utf-8")  # the folders on the way too: every path is stored
    except UnicodeEncodeError:
        return "the name is not valid UTF-8; rename the file"
    return None


def check_path(raw: str) -> None:
    """Invalid unless ``raw`` could name a file: no NUL, valid UTF-8, within the OS limits."""
    if not raw:
        raise Invalid("path is empty")
    if "\0" in raw:
        raise Invalid("path contains a NUL byte")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid("path is not valid UTF-8 (it contains a lone surrogate)") from None
    if len(encoded) >= PATH_MAX:
        raise Invalid(f"path is too long ({len(encoded)} bytes; the limit is {PATH_MAX - 1})")
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX:
        raise Invalid(f"a name in the path is too long ({longest} bytes; the limit is {NAME_MAX})")


def resolve_in_watch(raw: str, watch_dirs: Sequence[Path]) -> tuple[Path, Path]:
    """The real path of ``raw`` and the watched folder that holds it, or Invalid."""
    check_path(raw)
    roots = [Path(os.path.realpath(w)) for w in watch_dirs]
    candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in roots]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        for root in roots:
            if real.is_relative_to(root) and real != root:
                return real, root
    raise Invalid(f"path {raw!r} is not inside a watched folder (after resolving symlinks)")
