"""A real small filesystem (tmpfs) for tests of a full disk, and a way to fill it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str = "16m", inodes: int | None = None) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (and ``inodes`` files and folders at most, if given) on
    ``folder`` (made if missing); unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def remount(folder: Path, inodes: int) -> None:
    """Give the tmpfs on ``folder`` room for ``inodes`` files and folders."""
    subprocess.run(["mount", "-o", f"remount,nr_inodes={inodes}", str(folder)], check=True)


def use_up_inodes(folder: Path) -> Path:
    """Make empty files in a new folder of ``folder`` until no inode is left; the folder."""
    spent = folder / "inodes"
    spent.mkdir()
    with pytest.raises(OSError) as full:
        for n in range(10**7):
            (spent / str(n)).touch()
    assert full.value.errno == errno.ENOSPC
    return spent


def fill(folder: Path) -> Path:
    """Write a file until the filesystem says ENOSPC, down to the last byte."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            chunk = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
        with pytest.raises(OSError) as full:
            os.write(fd, b"\0")
        assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler
