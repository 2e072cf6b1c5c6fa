"""The C heap's size, where glibc's allocator would keep more than a job needs: at most one
heap arena, and freed pages handed back as a job goes on. On other systems nothing to do
(macOS's allocator returns freed pages itself)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)


@functools.cache
def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def limit_arenas(count: int = 1) -> None:
    """Have glibc keep at most ``count`` heap arenas. By default a thread that finds the
    heap busy gets an arena of its own, up to eight a core, and each keeps what was freed
    in it: a job's threads (decode, members, runners, speech) held ~150 MiB more at its
    peak with eight than with two, and two 30-40 MiB more than one, which was no slower
    (benchmarks/README.md, memory)."""
    if libc := _glibc():
        libc.mallopt(M_ARENA_MAX, count)


def give_back() -> None:
    """Hand every freed heap page back to the system (glibc keeps them for reuse, and the
    process's resident size stays at its peak). A few milliseconds on a job's heap."""
    if libc := _glibc():
        libc.malloc_trim(0)
