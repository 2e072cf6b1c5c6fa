import json
import shutil

import numpy as np
import pytest
from media_factory import (
    make_audio_file,
    make_corrupt_video,
    make_damaged_video,
    make_text_file,
    make_video,
    segment_colour,
)

from momentry_edge.media import MediaError, MediaNotFoundError, iter_frames, probe

FPS = 25


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """6 s, 3 segments of 2 s, h264 with B-frames + aac."""
    return make_video(
        tmp_path_factory.mktemp("media") / "clip.mp4", segments=3, segment_seconds=2.0, fps=FPS
    )


@pytest.fixture(scope="module")
def full_decode(clip):
    return list(iter_frames(clip))


def test_probe_reports_what_the_clip_is(clip):
    info = probe(clip)

    assert info.duration == pytest.approx(6.0, abs=0.05)
    assert (info.width, info.height) == (320, 240)
    assert info.fps == 25.0
    assert info.frame_count == 150
    assert info.video_codec == "h264"
    assert info.audio_codec == "aac"
    assert info.has_audio is True
    assert info.size == clip.stat().st_size
    assert "mp4" in info.container
    assert json.loads(json.dumps(info.to_dict()))["video_codec"] == "h264"


def test_probe_without_audio(tmp_path):
    info = probe(make_video(tmp_path / "silent.mp4", segments=1, segment_seconds=1.0, audio=False))

    assert info.has_audio is False
    assert info.audio_codec is None
    assert info.frame_count == 25


def test_probe_of_an_audio_file(tmp_path):
    info = probe(make_audio_file(tmp_path / "voice-over.mp4", seconds=2.0))

    assert (info.has_video, info.has_audio) == (False, True)
    assert (info.width, info.height, info.fps, info.video_codec) == (None, None, None, None)
    assert info.audio_codec == "aac" and info.frame_count == 0
    assert info.duration == pytest.approx(2.0, abs=0.05)


def test_probe_webm(tmp_path):
    path = make_video(tmp_path / "clip.webm", segments=1, segment_seconds=1.0, codec="libvpx-vp9")

    info = probe(path)

    assert (info.video_codec, info.audio_codec) == ("vp9", "opus")
    assert "webm" in info.container


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.write_bytes(b""), "file is empty (0 bytes)"),
        (make_text_file, "not a readable media file"),
        # the mp4 index is written last, so an interrupted upload has none
        (make_corrupt_video, "truncated or corrupt"),
        # index up front: opens and plays its start, but the data ends early
        (lambda p: make_corrupt_video(p, faststart=True), "truncated or corrupt"),
    ],
    ids=["empty", "text", "truncated", "truncated-faststart"],
)
def test_probe_says_why_a_file_is_unusable(tmp_path, make, reason):
    path = tmp_path / "upload.mp4"
    make(path)

    with pytest.raises(MediaError) as caught:
        probe(path)

    assert caught.value.reason.startswith(reason)
    assert not isinstance(caught.value, MediaNotFoundError)


def test_a_whole_transport_stream_with_keyframes_far_apart_is_accepted(tmp_path):
    # Its last keyframe more than a second before the end, where the check of the end
    # starts reading (a transport stream is sought by bytes, not to a keyframe).
    path = make_video(
        tmp_path / "camera.mts",
        segments=1,
        segment_seconds=20,
        fps=30,
        size=(320, 240),
        audio=False,
        keyframe_every=60,
    )
    assert probe(path).duration == pytest.approx(20, abs=0.1)


def test_probe_missing_file(tmp_path):
    with pytest.raises(MediaNotFoundError) as caught:
        probe(tmp_path / "gone.mp4")

    assert caught.value.reason.startswith("file not found: ")
    assert isinstance(caught.value, MediaError)


def test_names_with_spaces_and_unicode(tmp_path, clip):
    path = tmp_path / "Sommer Ürlaub – café 🎬 (1).mp4"
    shutil.copy(clip, path)

    assert probe(path).frame_count == 150
    index, seconds, image = next(iter_frames(path, start_frame=60))
    assert (index, seconds, image.shape) == (60, 2.4, (240, 320, 3))


def test_full_decode_has_every_frame_in_order_with_the_segment_colours(full_decode):
    assert [index for index, _, _ in full_decode] == list(range(150))
    assert [seconds for _, seconds, _ in full_decode[:3]] == [0.0, 0.04, 0.08]
    for index, _, image in full_decode[::25]:
        # bgr24; the moving bar never reaches the last columns, so they show the
        # segment's colour (give or take h264 loss)
        expected = segment_colour(index // 50)[::-1]
        assert np.abs(image[-2, -2].astype(int) - expected).max() <= 12, index


@pytest.mark.parametrize("start", [1, 37, 49, 50, 51, 99, 120, 149])
def test_starting_later_gives_the_same_frames_as_a_full_decode(clip, full_decode, start):
    resumed = list(iter_frames(clip, start_frame=start))

    assert [index for index, _, _ in resumed] == list(range(start, 150))
    for (index, seconds, image), (_, full_seconds, full_image) in zip(
        resumed, full_decode[start:], strict=True
    ):
        assert seconds == full_seconds
        assert np.array_equal(image, full_image), index


def test_step_and_size_sample_the_same_frames_from_anywhere(clip):
    every_tenth = list(iter_frames(clip, step=10, size=(160, 120)))
    from_33 = list(iter_frames(clip, start_frame=33, step=10, size=(160, 120)))

    assert [index for index, _, _ in every_tenth] == list(range(0, 150, 10))
    assert [index for index, _, _ in from_33] == list(range(40, 150, 10))
    assert every_tenth[0][2].shape == (120, 160, 3)
    assert np.array_equal(from_33[0][2], every_tenth[4][2])


def test_a_damaged_stretch_is_skipped_and_the_rest_decodes(tmp_path):
    path = make_damaged_video(tmp_path / "glitch.mp4")

    full = list(iter_frames(path))
    resumed = list(iter_frames(path, start_frame=105))

    indices = [index for index, _, _ in full]
    assert indices[0] == 0 and indices[-1] == 199
    assert 150 < len(indices) < 200  # only the damaged stretch is missing
    assert [index for index, _, _ in resumed] == [i for i in indices if i >= 105]
    tail = full[-len(resumed) :]
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(resumed, tail, strict=True))


def test_start_past_the_end_yields_nothing(clip):
    assert list(iter_frames(clip, start_frame=1000)) == []


def test_iter_frames_errors_are_media_errors(tmp_path):
    with pytest.raises(MediaNotFoundError):
        next(iter_frames(tmp_path / "gone.mp4"))
    with pytest.raises(MediaError, match="not a readable media file"):
        next(iter_frames(make_text_file(tmp_path / "notes.mp4")))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_codecs_are_named_as_ffprobe_names_them_not_by_their_decoder(start_service, tmp_path):
    # FFmpeg decodes AV1 with libdav1d and MP3 with mp3float: the file holds av1 and mp3.
    svc = start_service()
    clip = make_video(
        tmp_path / "av1.mkv",
        segments=1,
        segment_seconds=0.4,
        fps=10,
        size=(64, 64),
        codec="libsvtav1",
        audio_codec="libmp3lame",
    )
    shutil.move(clip, svc.drop / clip.name)
    task = svc.submit(clip.name, ["noop"])
    svc.wait_status(task["task_id"], "completed")
    detail = svc.get(f"/api/v1/files/{task['file_uuid']}")
    assert (detail["video_codec"], detail["audio_codec"]) == ("av1", "mp3")
