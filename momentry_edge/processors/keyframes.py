"""Scene thumbnails for ``cut``: the middle frame of each scene as a JPEG."""

# The frames come from the ones cut is already fed (the shared decode, at cut's
# decode size). A scene's end is known only at the next cut, so the open scene
# keeps a bounded sample of its frames: every ``stride``-th, and when more than
# ``KEEP`` are held, every other one is dropped and the stride doubles. The frame
# kept nearest the middle is then within 1/KEEP of the scene's length of it, at a
# memory cost that does not grow with the video.
#
# A closed scene's JPEG is written at once to a work folder, named by its first
# frame, so a resumed run keeps the thumbnails of the scenes its checkpoint holds;
# ``publish`` moves the set into ``cut.thumbnails/`` once the run completes,
# replacing any earlier set in one rename (cut.json names each scene's file).

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from .. import durable, trees
from ..outputs import THUMBNAILS, give_mode, make_dir

KEEP = 64


def thumbnail_name(start_frame: int) -> str:
    return f"{start_frame:010d}.jpg"


def work_folder(output_dir: Path) -> Path:
    """Where a run's thumbnails wait until it completes (outputs.WORK_FOLDER)."""
    return output_dir / f".{THUMBNAILS}.work"


class Keyframes:
    def __init__(self, output_dir: Path, max_side: int, *, fresh: bool) -> None:
        self.final = output_dir / THUMBNAILS
        self.work = work_folder(output_dir)
        if fresh:
            trees.remove(self.work)  # thumbnails of another run's scenes
        self.max_side = max_side
        self.start = 0
        self._samples: list[tuple[int, np.ndarray]] = []
        self._stride = 1
        self._next_take = 0

    def open_scene(self, start: int) -> None:
        """From frame ``start`` on, frames belong to a new scene (nothing held yet)."""
        self.start = start
        self._samples, self._stride, self._next_take = [], 1, start

    def offer(self, index: int, image: np.ndarray) -> None:
        if index < self._next_take:
            return
        self._samples.append((index, image))
        if len(self._samples) > KEEP:
            self._samples = self._samples[::2]
            self._stride *= 2
        self._next_take = self._samples[-1][0] + self._stride

    def cut(self, at: int) -> None:
        """A scene ends before frame ``at``: write its thumbnail, carry later frames over."""
        later = [(i, image) for i, image in self._samples if i >= at]
        self.close(at)
        self.open_scene(at)
        for index, image in later:
            self.offer(index, image)

    def close(self, end: int) -> None:
        """Write the thumbnail of the open scene, frames [start, end)."""
        import numpy as np
        from PIL import Image

        held = [(i, image) for i, image in self._samples if self.start <= i < end]
        if not held:
            return  # resumed inside this scene past its middle, or an empty scene
        middle = self.start + (end - 1 - self.start) / 2
        _, image = min(held, key=lambda sample: abs(sample[0] - middle))
        picture = Image.fromarray(np.ascontiguousarray(image[..., ::-1]))  # BGR -> RGB
        if self.max_side:
            picture.thumbnail((self.max_side, self.max_side))
        make_dir(self.work)
        name = thumbnail_name(self.start)
        tmp = self.work / f".{name}.tmp"
        picture.save(tmp, "JPEG", quality=85)
        give_mode(tmp)
        os.replace(tmp, self.work / name)

    def publish(self, scene_starts: list[int]) -> list[str | None]:
        """Put each scene's thumbnail in ``cut.thumbnails/``; their paths relative to the
        results folder (None for a scene without one)."""
        staged = self.final.with_name(f".{THUMBNAILS}.new")
        trees.remove(staged)
        make_dir(staged)
        paths: list[str | None] = []
        for start in scene_starts:
            name = thumbnail_name(start)
            # This run's, or (a run resumed after its last checkpoint) the published one.
            source = next((p for p in (self.work / name, self.final / name) if p.is_file()), None)
            if source is None:
                paths.append(None)
                continue
            shutil.copy(source, staged / name)  # with its mode
            durable.flush_file(staged / name)
            paths.append(f"{THUMBNAILS}/{name}")
        # On disk before cut.json names them (it is committed after this).
        durable.flush_folder(staged)
        old = self.final.with_name(f".{THUMBNAILS}.old")
        trees.remove(old)
        if self.final.is_symlink() or self.final.exists():
            os.replace(self.final, old)  # a set linked from a duplicate, or an earlier run's
        os.replace(staged, self.final)
        durable.flush_folder(self.final.parent)
        if old.is_symlink():
            old.unlink()
        trees.remove(old)
        trees.remove(self.work)
        return paths
