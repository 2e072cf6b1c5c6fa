"""Walking and removing folder trees without recursion, so that any depth (results nested
1,500 folders deep) is a path too long at worst, an OSError, never a RecursionError.

Python 3.11's os.walk and shutil.rmtree recurse once per level.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def walk(
    top: str | Path, onerror: Callable[[OSError], None] | None = None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk(top, onerror=onerror) top-down, links not followed, with a loop in place
    of recursion: the same (folder, dirnames, filenames), and dirnames may be pruned."""
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                found = list(entries)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs: list[str] = []
        files: list[str] = []
        below: list[str] = []
        for entry in found:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield folder, dirs, files
        for name in reversed(dirs):  # those left after pruning; a link is listed, not entered
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                below.append(path)
        stack.extend(below)


def remove(path: str | Path) -> bool:
    """Remove the file, link or folder tree at ``path`` as far as it can (links are removed,
    never followed), as shutil.rmtree(ignore_errors=True) does; True when it is gone."""
    path = os.fspath(path)
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return not os.path.lexists(path)
    folders = []
    for folder, dirs, files in walk(path):
        folders.append(folder)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    for folder in reversed(folders):  # the deepest first: each is empty by its turn
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return not os.path.lexists(path)
