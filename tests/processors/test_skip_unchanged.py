"""Frames whose picture has not changed since the last analysed one are not analysed
again: their answer is carried forward, a change (a caption coming on) is caught at the
first sampled frame that shows it, and an unchanged picture is analysed again after
``recheck_seconds``. Sensor noise is not a change. ``skip_unchanged = false`` analyses
every sampled frame, to the same answer."""

from __future__ import annotations

import av
import numpy as np
import pytest
from frame_media import Reports, context, photo_frame, write_video
from PIL import Image, ImageDraw, ImageFont

from momentry_edge.processors import frame_pass
from momentry_edge.processors.base import Stop
from momentry_edge.processors.frames import Glance
from momentry_edge.processors.ocr import OcrProcessor

FPS = 10
SECONDS = 8
CAPTION_AT = 3.0  # seconds: the caption comes on here and stays
CAPTION = "Eileen Collins, astronaut"


def studio_frame(captioned: bool) -> np.ndarray:
    rows = np.linspace(40, 110, 360)[:, None, None]
    frame = np.broadcast_to(rows, (360, 640, 3)).astype(np.uint8).copy()
    image = Image.fromarray(frame)
    if captioned:
        draw = ImageDraw.Draw(image)
        draw.rectangle((30, 270, 470, 330), fill=(20, 20, 30))
        draw.text((45, 280), CAPTION, font=ImageFont.load_default(size=32), fill=(255, 255, 255))
    return np.asarray(image)


@pytest.fixture(scope="module")
def interview(tmp_path_factory):
    """A still camera with sensor noise on every frame; a caption from CAPTION_AT on."""
    plain, captioned = studio_frame(False), studio_frame(True)
    rng = np.random.default_rng(7)
    noise = rng.normal(0, 3, (4, 360, 640, 3)).round().astype(np.int16)

    def frame_at(i: int) -> np.ndarray:
        base = captioned if i >= CAPTION_AT * FPS else plain
        return np.clip(base + noise[i % 4], 0, 255).astype(np.uint8)

    path = tmp_path_factory.mktemp("studio") / "interview.mp4"
    return write_video(path, frame_at, SECONDS * FPS, FPS)


def ocr(**settings) -> OcrProcessor:
    return OcrProcessor({"sample_fps": 2.0, **settings})


def seen(result: dict) -> dict[float, list[str]]:
    return {f["timestamp"]: [line["text"] for line in f["lines"]] for f in result["frames"]}


@pytest.fixture(scope="module")
def every_frame(interview):
    return ocr(skip_unchanged=False).run(context(interview, Reports()))


@pytest.fixture(scope="module")
def skipping(interview):
    """A run with the default settings, uninterrupted."""
    return ocr().run(context(interview, Reports()))


def test_unchanged_frames_are_skipped_and_the_caption_is_caught(skipping, every_frame):
    result = skipping

    # Analysed: the first frame, and the first that shows the caption; the 14 others
    # of the 16 sampled carry the answer of the frame before.
    assert (result["frames_sampled"], result["frames_skipped"]) == (16, 14)
    assert (every_frame["frames_sampled"], every_frame["frames_skipped"]) == (16, 0)
    lines = seen(result)
    assert min(lines) == CAPTION_AT and len(lines) == 10  # 3.0, 3.5, ... 7.5 s
    assert all(CAPTION.replace(" ", "") in "".join(t).replace(" ", "") for t in lines.values())
    assert seen(every_frame) == lines  # the same answer, frame by frame


def test_an_unchanged_picture_is_analysed_again_after_recheck_seconds(interview):
    result = ocr(recheck_seconds=2.0).run(context(interview, Reports()))

    # Analysed at 0, 2 (recheck), 3 (caption), 5, 7 (rechecks): 5 of 16.
    assert result["frames_sampled"] - result["frames_skipped"] == 5


class SharedOcr(OcrProcessor):
    spares = True  # as a plugin's processor may (the built-ins keep to one instance)


def test_frames_shared_out_over_threads_skip_alike(interview, every_frame):
    member = SharedOcr({"sample_fps": 2.0})
    spares = []

    def spare(_slot: int) -> SharedOcr:
        spares.append(SharedOcr({"sample_fps": 2.0}))
        return spares[-1]

    (result,) = frame_pass.run_shared(
        interview, [(member, context(interview, Reports()))], threads=2, spare=spare
    )

    assert len(spares) == 1  # its frames were shared out over the two threads

    assert result["frames_skipped"] == 14
    assert seen(result) == seen(every_frame)


def test_a_resumed_run_skips_what_an_uninterrupted_one_skips(interview, skipping):
    alone = skipping
    first = Reports(stop_at=45)
    with pytest.raises(Stop):
        ocr().run(context(interview, first))
    checkpoint = first.checkpoints[-1]
    assert checkpoint["frame"] > CAPTION_AT * FPS  # past the last frame analysed

    resumed = ocr().run(context(interview, Reports(), checkpoint))

    assert resumed == alone and resumed["frames_skipped"] == 14


def test_noise_is_no_change_a_small_mark_is():
    rng = np.random.default_rng(1)
    picture = studio_frame(False)
    noisy = np.clip(picture + rng.normal(0, 4, picture.shape), 0, 255).astype(np.uint8)
    marked = picture.copy()
    marked[100:106, 200:206] += 100  # a 6 px dot

    assert Glance(picture).same(Glance(noisy))
    assert not Glance(picture).same(Glance(marked))


def test_a_still_cameras_noise_as_x264_codes_it_is_no_change_at_any_size(tmp_path):
    # x264 (its default quality, a keyframe a second) codes 16 px blocks, and a block's
    # mean moves with the noise: 16 px squares of the frame at 1280 px saw a change where
    # the same frame at 640 px did not.
    rng = np.random.default_rng(3)
    photo = photo_frame().astype(np.int16)

    def noisy(i: int) -> np.ndarray:
        return np.clip(photo + rng.normal(0, 4, photo.shape), 0, 255).astype(np.uint8)

    still = write_video(tmp_path / "still.mp4", noisy, 30, fps=10, options={"g": "10"})
    for width, height in ((1280, 720), (640, 360)):
        with av.open(str(still)) as container:
            frames = [
                Glance(f.to_ndarray(width=width, height=height, format="rgb24"))
                for f in container.decode(video=0)
            ]
        assert len(frames) == 30
        assert all(frames[0].same(other) for other in frames[1:]), (width, height)


@pytest.mark.parametrize(
    "settings", [{"skip_unchanged": "yes"}, {"recheck_seconds": -1}, {"recheck_seconds": "x"}]
)
def test_bad_skip_settings_are_refused(settings):
    problem = OcrProcessor(settings).settings_problem()
    assert problem is not None and problem.startswith("bad ocr settings")
