"""A drop folder 1,500 folders deep: files at any depth the system allows are taken, the
folders the watcher cannot watch are said once (log and status), and no traceback repeats.
A real service process watching a real folder; real videos. Every wait is bounded
(wait_for's timeouts, as in the other ingest tests)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_for
from media_factory import make_video
from test_ingest import INGEST, files

from momentry_edge import trees

DEPTH = 1500  # past Python's recursion limit (1,000), well inside PATH_MAX (4,096)


def make_deep(top: Path, depth: int = DEPTH) -> Path:
    """``depth`` nested folders below ``top``, one mkdir at a time (os.makedirs and
    Path.mkdir(parents=True) recurse once per level); returns the deepest."""
    folder = top
    for _ in range(depth):
        folder = folder / "d"
        os.mkdir(folder)
    return folder


@pytest.fixture
def deep_cleanup(tmp_path: Path) -> Iterator[None]:
    """Remove the deep trees with a loop, bottom up: pytest's own clean-up of tmp_path
    (shutil.rmtree, recursive on Python 3.11) hits RecursionError on them."""
    yield
    assert trees.remove(tmp_path / "node" / "drop")


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clip")
    return make_video(folder / "clip.mp4", segments=1, segment_seconds=0.4, fps=10, size=(64, 48))


def put(clip: Path, target: Path, tail: bytes) -> Path:
    """A distinct real video at ``target`` (a tail of bytes after the last box)."""
    shutil.copyfile(clip, target)
    with target.open("ab") as f:
        f.write(tail)
    return target


def relative(svc: ServiceProcess, path: Path) -> str:
    return str(path.relative_to(svc.drop))


def messages(svc: ServiceProcess) -> list[str]:
    """The service's log messages (its JSON-lines file), tracebacks included."""
    log_file = svc.data_dir / "logs" / "momentry-edge.log"
    return [json.dumps(json.loads(line)) for line in log_file.read_text().splitlines()]


def tracebacks(svc: ServiceProcess) -> int:
    """Tracebacks in the log and on stderr."""
    stderr = (svc.root / "service.log").read_text(errors="replace")
    return sum(m.count("Traceback") for m in messages(svc)) + stderr.count("Traceback")


def cannot_watch(svc: ServiceProcess) -> list[str]:
    return [m for m in messages(svc) if "cannot watch" in m]


def inotify_watches(svc: ServiceProcess) -> int:
    """The inotify watches the service process holds (Linux)."""
    count = 0
    for info in Path(f"/proc/{svc.proc.pid}/fdinfo").iterdir():
        with contextlib.suppress(OSError):
            count += info.read_text().count("inotify wd:")
    return count


def watches_stay(svc: ServiceProcess) -> None:
    """Three rescans later the service holds no more watches: a watch that cannot be
    made is not tried again at each rescan (watchdog keeps what it added before failing)."""
    before, done = inotify_watches(svc), rescans(svc)
    wait_for(lambda: rescans(svc) >= done + 3, timeout=30)
    assert inotify_watches(svc) <= before


def rescans(svc: ServiceProcess) -> int:
    return sum("rescan in" in m for m in messages(svc))


def test_a_tree_1500_deep_made_while_running_is_taken_and_said_once(
    start_service, tmp_path, clip, deep_cleanup
) -> None:
    svc = start_service(ingest=INGEST | {"rescan_interval": 1})
    bottom = make_deep(svc.drop)
    deep = put(clip, bottom / "deep.mp4", b"deep")
    top = put(clip, svc.drop / "top.mp4", b"top")
    # 7.5 s on a quiet machine, 19 s beside six busy loops (tests/README.md).
    wait_for(lambda: {relative(svc, top), relative(svc, deep)} <= files(svc).keys(), timeout=120)

    # Said once, in the log and as a warning in status; the rescans carry on in silence.
    wait_for(lambda: cannot_watch(svc), timeout=10)
    warnings = svc.status()["warnings"]
    assert any("cannot watch" in w for w in warnings), warnings
    wait_for(lambda: rescans(svc) >= 4, timeout=30)
    assert len(cannot_watch(svc)) == 1, cannot_watch(svc)
    # watchdog's reader thread prints its own as it stops, once; nothing repeats.
    assert tracebacks(svc) <= 1, svc.log()
    watches_stay(svc)

    # The rest of the drop folder is still watched: a new file is taken at once.
    later = put(clip, svc.drop / "later.mp4", b"later")
    wait_for(lambda: relative(svc, later) in files(svc), timeout=20)
    assert svc.stop() == 0


def test_a_tree_1500_deep_there_at_start_up_is_taken_and_said_once(
    start_service, tmp_path, clip, deep_cleanup
) -> None:
    drop = tmp_path / "node" / "drop"
    drop.mkdir(parents=True)
    deep = put(clip, make_deep(drop) / "deep.mp4", b"deep")
    top = put(clip, drop / "top.mp4", b"top")
    svc = start_service(ingest=INGEST | {"rescan_interval": 1})
    wait_for(lambda: {relative(svc, top), relative(svc, deep)} <= files(svc).keys(), timeout=120)
    wait_for(lambda: rescans(svc) >= 4, timeout=30)
    assert len(cannot_watch(svc)) == 1, cannot_watch(svc)
    assert any("cannot watch" in w for w in svc.status()["warnings"])
    assert tracebacks(svc) == 0, svc.log()
    watches_stay(svc)

    later = put(clip, svc.drop / "later.mp4", b"later")
    wait_for(lambda: relative(svc, later) in files(svc), timeout=20)
    assert svc.stop() == 0


def test_a_results_folder_1500_deep_is_copied_with_links_kept(tmp_path: Path) -> None:
    """trees.copy, which sets aside a duplicate's result folders (outputs._link_outputs) where
    shutil.copytree recursed once per level."""
    source = tmp_path / "cut.thumbnails"
    source.mkdir()
    bottom = make_deep(source)
    (bottom / "0.jpg").write_bytes(b"jpeg")
    (bottom / "link").symlink_to("/etc/passwd")
    target = tmp_path / "copy"
    try:
        trees.copy(source, target, copy_function=os.link)
        copied = target / bottom.relative_to(source)
        assert (copied / "0.jpg").read_bytes() == b"jpeg"
        assert os.readlink(copied / "link") == "/etc/passwd"
        assert (copied / "0.jpg").stat().st_ino == (bottom / "0.jpg").stat().st_ino
    finally:
        assert trees.remove(source) and trees.remove(target)
