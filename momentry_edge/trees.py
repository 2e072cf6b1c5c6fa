"""Walking and removing folder trees without recursion, so that any depth (results nested
1,500 folders deep) is a path too long at worst, an OSError, never a RecursionError.

Python 3.11's os.walk, shutil.rmtree and shutil.copytree recurse once per level.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
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
        links: set[str] = set()
        for entry in found:
            try:
                is_dir = entry.is_dir()
                if is_dir and entry.is_symlink():  # from the listing: no stat of its own
                    links.add(entry.name)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield folder, dirs, files
        # Those left after pruning; a link is listed, not entered.
        stack.extend(os.path.join(folder, d) for d in reversed(dirs) if d not in links)


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


def copy(source: str | Path, target: str | Path, copy_function: Callable[[str, str], None]) -> None:
    """shutil.copytree(source, target, symlinks=True, copy_function=copy_function) with a
    loop in place of recursion: links are copied as links, files with ``copy_function``;
    ``target`` must not exist. Raises OSError on the first failure."""
    top, into = os.fspath(source), os.fspath(target)
    os.mkdir(into)
    made = [(top, into)]
    for folder, dirs, files in walk(top, onerror=_raise):
        here = os.path.join(into, os.path.relpath(folder, top))
        for name in dirs + files:
            src, dst = os.path.join(folder, name), os.path.join(here, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            elif name in dirs:
                os.mkdir(dst)
                made.append((src, dst))
            else:
                copy_function(src, dst)
    for src, dst in reversed(made):  # times last, the deepest first, as copytree sets them
        shutil.copystat(src, dst)


def _raise(exc: OSError) -> None:
    raise exc


def lstat_regular(path: Path) -> os.stat_result | None:
    """``path``'s own status when it is a regular file (not a link, a folder, ...)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None
