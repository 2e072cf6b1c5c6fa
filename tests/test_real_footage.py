"""Footage as it comes from phones and editors, through the service: a file dropped in
the watched folder, the results read over HTTP.

Portrait (9:16) video, a clip stored sideways with a display matrix, anamorphic
(non-square pixel) video, a phone's HDR (HLG) clip, fades through black, variable frame
rate, a small frame with small text. The expected results come from the libraries' own
default calls on the same media (PySceneDetect, RapidOCR) or from the same picture
stored upright (or SDR).
"""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from frame_media import (
    PHOTO_AT,
    anamorphic_video,
    box_iou,
    hdr_video,
    mirrored_video,
    photo_frame,
    portrait_frame,
    rotated_video,
    still_video,
    write_video,
)
from PIL import Image

from momentry_edge import media

DATA = Path(__file__).parent / "data"
FRAME_PROCESSORS = ["cut", "yolo", "ocr", "face", "pose"]
on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
pytestmark = on_sqlite  # every wait below has its own timeout


def frame_service(start_service, models_dir, **settings):
    return start_service(
        **{
            "processors.yolo": {"models_dir": str(models_dir)},
            "processors.ocr": {"sample_fps": 0.5},
            **settings,
        }
    )


def run_job(svc, name: str, processors: list[str]) -> tuple[dict, dict]:
    """Submit ``name`` (in the drop folder); the finished job and its results by processor."""
    task = svc.submit(name, processors)
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=240)
    results = {}
    for p in processors:
        results[p] = svc.get(f"/api/v1/files/{task['file_uuid']}/results/{p}")
    return job | {"file_uuid": task["file_uuid"]}, results


def best(items: list[dict], key: str = "confidence") -> dict:
    return max(items, key=lambda item: item[key])


def thumbnail(svc, file_uuid: str, index: int = 0) -> np.ndarray:
    reply = svc.client.get(f"{svc.url}/api/v1/files/{file_uuid}/thumbnails/{index}")
    assert reply.status_code == 200, reply.text
    with Image.open(io.BytesIO(reply.content)) as picture:
        return np.asarray(picture.convert("RGB"))


# -- 9:16 portrait, and the same picture stored sideways with a display matrix ----------


def test_portrait_video_runs_every_frame_processor(start_service, models_dir):
    # 720x1280 is fed at 360x640: rows PyAV pads, which MediaPipe refused as not contiguous.
    svc = frame_service(start_service, models_dir)
    still_video(svc.drop / "portrait.mp4", portrait_frame(), seconds=2.0)

    job, results = run_job(svc, "portrait.mp4", FRAME_PROCESSORS)

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    face = results["face"]["result"]
    assert face["frames_sampled"] == 4 and len(face["frames"]) == 4  # a face in each
    x1, y1, x2, y2 = best(face["frames"][0]["faces"])["box"]
    assert 104 + 150 < x1 < x2 < 104 + 300 and 384 + 60 < y1 < y2 < 384 + 200  # on the face
    person = best(results["pose"]["result"]["frames"][0]["people"])
    assert len(person["keypoints"]) == 33
    found = best(results["yolo"]["result"]["frames"][0]["detections"])
    assert found["label"] == "person" and found["box"][3] <= 1280


def test_a_phone_clip_with_a_display_matrix_is_upright_for_every_processor(
    start_service, models_dir
):
    svc = frame_service(start_service, models_dir)
    upright = portrait_frame()
    still_video(svc.drop / "upright.mp4", upright, seconds=2.0)
    rotated_video(svc.drop / "phone.mp4", upright, seconds=2.0)  # stored 1280x720, -90 degrees

    reference, expected = run_job(svc, "upright.mp4", FRAME_PROCESSORS)
    job, results = run_job(svc, "phone.mp4", FRAME_PROCESSORS)

    assert reference["status"] == "completed", json.dumps(reference["processors"], indent=1)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    described = svc.get(f"/api/v1/files/{job['file_uuid']}")
    assert (described["width"], described["height"]) == (720, 1280)
    # The same findings in the same places as on the clip stored upright.
    for name, key in (("face", "faces"), ("pose", "people"), ("yolo", "detections")):
        ours, theirs = results[name]["result"]["frames"], expected[name]["result"]["frames"]
        assert [f["frame"] for f in ours] == [f["frame"] for f in theirs], name
        for mine, other in zip(ours, theirs, strict=True):
            assert box_iou(best(mine[key])["box"], best(other[key])["box"]) > 0.85, name
    assert best(results["yolo"]["result"]["frames"][0]["detections"])["label"] == "person"
    # The scene's thumbnail is upright: the picture a player shows, not turned.
    picture = thumbnail(svc, job["file_uuid"])
    assert picture.shape[:2] == (320, 180)
    shown = np.asarray(Image.fromarray(upright).resize((180, 320), Image.Resampling.BILINEAR))
    assert np.abs(picture.astype(int) - shown).mean() < 8


def test_a_mirrored_clip_is_described_as_mirrored_and_shown_unflipped(start_service):
    # A front camera's clip: stored flipped and sideways, its display matrix turns and flips.
    svc = start_service()
    upright = portrait_frame()
    still_video(svc.drop / "plain.mp4", upright, seconds=2.0)
    mirrored_video(svc.drop / "selfie.mp4", upright, degrees=90, seconds=2.0)

    plain, _ = run_job(svc, "plain.mp4", ["cut"])
    job, _ = run_job(svc, "selfie.mp4", ["cut"])

    assert plain["status"] == job["status"] == "completed", json.dumps(job["processors"])
    described = svc.get(f"/api/v1/files/{job['file_uuid']}")
    assert (described["width"], described["height"]) == (720, 1280)  # stored 1280x720
    assert (described["mirrored"], described["sample_aspect_ratio"]) == (True, None)
    as_stored = svc.get(f"/api/v1/files/{plain['file_uuid']}")
    assert (as_stored["width"], as_stored["height"]) == (720, 1280)
    assert (as_stored["mirrored"], as_stored["sample_aspect_ratio"]) == (False, None)
    # Its thumbnail is the picture a player shows: upright and not flipped.
    picture = thumbnail(svc, job["file_uuid"])
    shown = np.asarray(Image.fromarray(upright).resize((180, 320), Image.Resampling.BILINEAR))
    assert picture.shape[:2] == (320, 180)
    assert np.abs(picture.astype(int) - shown).mean() < 8
    assert np.abs(picture.astype(int) - shown[:, ::-1]).mean() > 8  # flipped is told apart


# -- anamorphic video: pixels that are not square ---------------------------------------


def test_an_anamorphic_clip_is_reported_boxed_and_thumbnailed_in_square_pixels(
    start_service, models_dir
):
    # PAL 16:9 as DV and DVD store it: 720x576 pixels 64:45 wide, shown 1024x576.
    svc = frame_service(start_service, models_dir)
    scale = 0.8  # the 1280x720 photo frame shown at 1024x576
    shown = np.asarray(Image.fromarray(photo_frame()).resize((1024, 576), Image.Resampling.LANCZOS))
    anamorphic_video(svc.drop / "pal.mp4", shown, Fraction(64, 45), seconds=2.0)

    job, results = run_job(svc, "pal.mp4", ["cut", "face"])

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    described = svc.get(f"/api/v1/files/{job['file_uuid']}")
    assert (described["width"], described["height"]) == (1024, 576)
    assert (described["sample_aspect_ratio"], described["mirrored"]) == ("64:45", False)
    # The face where it is shown, and face-shaped (squeezed, it was 0.7 as wide as tall).
    x1, y1, x2, y2 = best(results["face"]["result"]["frames"][0]["faces"])["box"]
    x, y = PHOTO_AT
    assert (x + 150) * scale < x1 < x2 < (x + 300) * scale, (x1, x2)
    assert (y + 60) * scale < y1 < y2 < (y + 200) * scale, (y1, y2)
    assert 0.85 < (x2 - x1) / (y2 - y1) < 1.15
    # The thumbnail in square pixels: the picture a player shows, not squeezed.
    picture = thumbnail(svc, job["file_uuid"])
    assert picture.shape[:2] == (180, 320)
    small = np.asarray(Image.fromarray(shown).resize((320, 180), Image.Resampling.BILINEAR))
    assert np.abs(picture.astype(int) - small).mean() < 8


# -- HDR: a phone's HLG ---------------------------------------------------------------


def test_an_hlg_clip_is_seen_and_thumbnailed_as_the_sdr_picture_it_shows(start_service):
    # iPhones record HLG (10-bit, BT.2020) by default: read as SDR, dim and grey.
    svc = start_service()
    shown = np.asarray(Image.fromarray(photo_frame()).resize((640, 360), Image.Resampling.LANCZOS))
    hdr_video(svc.drop / "iphone.mp4", shown, "hlg", seconds=2.0)

    job, _ = run_job(svc, "iphone.mp4", ["cut"])

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert svc.get(f"/api/v1/files/{job['file_uuid']}")["hdr"] == "hlg"
    picture = thumbnail(svc, job["file_uuid"])
    small = np.asarray(
        Image.fromarray(shown).resize(picture.shape[1::-1], Image.Resampling.BILINEAR)
    )
    error = np.abs(picture.astype(int) - small).mean(axis=(0, 1))
    assert error.max() < 5, error


# -- a processor that fails on a frame ---------------------------------------------------


def test_an_error_on_a_frame_is_a_failure_with_its_reason_not_a_crash(start_service):
    svc = start_service(
        service={"plugins": ["workloads:Noop", "workloads:RaiseInFeed"]},
        queue={"max_crashes": 3},
        **{"processors.raise_in_feed": {"raises": "ValueError", "at": 3}},
    )
    still_video(svc.drop / "clip.mp4", photo_frame(), seconds=1.0)

    job, results = run_job(svc, "clip.mp4", ["raise_in_feed", "cut"])

    assert job["status"] == "partial" and job["crash_count"] == 0, job
    failed = job["processors"]["raise_in_feed"]
    assert failed["status"] == "failed" and failed["attempts"] == 1, failed  # not retried
    assert failed["error"] == "failed on frame 3 (0.300 s): ValueError: the frame model gave up"
    assert results["raise_in_feed"]["error"] == failed["error"]
    assert job["processors"]["cut"]["status"] == "completed"
    assert "crashed" not in svc.log()


# -- fades -------------------------------------------------------------------------------


def fade_video(path: Path, fps: int = 25) -> Path:
    """A picture fades to black over 2 s, black for 1 s, another fades in over 2 s."""
    first = photo_frame()
    second = np.ascontiguousarray(photo_frame(at=(100, 60))[:, ::-1])

    def frame_at(i: int) -> np.ndarray:
        t = i / fps
        level, image = (
            (1.0, first) if t < 1 else
            (1 - (t - 1) / 2, first) if t < 3 else
            (0.0, first) if t < 4 else
            ((t - 4) / 2, second) if t < 6 else
            (1.0, second)
        )  # fmt: skip
        return (image.astype(np.float32) * level).round().astype(np.uint8)

    return write_video(path, frame_at, 7 * fps, fps)


def test_cuts_at_fades_are_those_pyscenedetect_finds_by_default(start_service):
    import scenedetect

    svc = start_service()
    clip = fade_video(svc.drop / "fades.mp4")

    job, results = run_job(svc, "fades.mp4", ["cut"])

    assert job["status"] == "completed", job
    theirs = scenedetect.detect(str(clip), scenedetect.ContentDetector())
    golden = [start.get_frames() for start, _ in theirs[1:]]
    scenes = results["cut"]["result"]["scenes"]
    assert [s["start_frame"] for s in scenes[1:]] == golden


# -- variable frame rate -----------------------------------------------------------------


def vfr_video(path: Path) -> tuple[Path, list[float]]:
    """10 s on a 25 fps grid with every third frame left out (16.7 fps on average), a
    hard cut at 6 s; the frames' own times."""
    first, second = photo_frame(), np.ascontiguousarray(photo_frame(at=(100, 60))[:, ::-1])
    ticks = [i for i in range(250) if i % 3 != 2]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height = 1280, 720
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, 25)
        stream.codec_context.time_base = Fraction(1, 25)
        stream.options = {"preset": "superfast", "crf": "12"}
        for i in ticks:
            frame = av.VideoFrame.from_ndarray(first if i < 150 else second, "rgb24")
            frame.pts, frame.time_base = i, Fraction(1, 25)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path, [i / 25 for i in ticks]


def test_variable_frame_rate_uses_each_frames_own_time(start_service, models_dir):
    svc = frame_service(start_service, models_dir, **{"processors.face": {"sample_fps": 2.0}})
    _, times = vfr_video(svc.drop / "vfr.mp4")

    job, results = run_job(svc, "vfr.mp4", ["cut", "face"])

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert results["cut"]["result"]["cuts"] == [6.0]  # the first frame of the second picture
    face = results["face"]["result"]
    # Two a second of the video's time: the first frame at or after each half second.
    expected = [min(t for t in times if t >= k / 2) for k in range(20)]
    assert face["sample_fps"] == 2.0 and face["frames_sampled"] == 20
    assert [f["timestamp"] for f in face["frames"]] == pytest.approx(expected, abs=1e-3)


# -- small text in a small frame ---------------------------------------------------------


def test_ocr_reads_a_small_frame_as_rapidocr_does_by_default(start_service):
    from rapidocr import RapidOCR

    svc = start_service()
    image = np.asarray(Image.open(DATA / "ch_en_num.jpg").convert("RGB"))  # 323x430
    height, width = image.shape[:2]
    canvas = np.full((height + height % 2, width + width % 2, 3), 255, np.uint8)  # even for x264
    canvas[:height, :width] = image
    clip = still_video(svc.drop / "labels.mp4", canvas, seconds=1.0, fps=2)

    job, results = run_job(svc, "labels.mp4", ["ocr"])

    assert job["status"] == "completed", job
    _, _, frame = next(media.iter_frames(clip, fmt="bgr24"))
    theirs = RapidOCR(params={"Global.log_level": "error"})(frame)  # the library's defaults
    assert len(theirs.txts) == 18  # as RapidOCR's own test expects of this picture
    ours = [line["text"] for line in results["ocr"]["result"]["frames"][0]["lines"]]
    assert ours == list(theirs.txts)


# -- faces in a group, and a close-up -------------------------------------------------------

# The six faces of InsightFace's t1.jpg (tests/data) shown whole in a 1280x720 frame: a
# point inside each (x, y), as a person sees them.
T1_FACES = [(212, 274), (375, 175), (541, 284), (756, 338), (881, 112), (1073, 279)]


def shown_in_frame(picture: Image.Image, size: tuple[int, int] = (1280, 720)) -> np.ndarray:
    """``picture`` as a player shows it in a ``size`` frame: whole, centred, black bars."""
    scale = min(size[0] / picture.width, size[1] / picture.height)
    fitted = picture.resize((round(picture.width * scale), round(picture.height * scale)))
    frame = Image.new("RGB", size)
    frame.paste(fitted, ((size[0] - fitted.width) // 2, (size[1] - fitted.height) // 2))
    return np.asarray(frame)


def test_every_face_of_a_group_is_found_and_a_close_up_once(start_service):
    svc = start_service(**{"processors.face": {"sample_fps": 1.0}})
    with Image.open(DATA / "t1.jpg") as picture:
        still_video(svc.drop / "group.mp4", shown_in_frame(picture.convert("RGB")), seconds=2.0)
    # The photo's face filling a third of the frame's height, larger than any tile.
    close = Image.fromarray(photo_frame(size=(512, 512), at=(0, 0))).resize((1280, 1280))
    still_video(svc.drop / "close-up.mp4", np.asarray(close)[:720], seconds=2.0)

    _, group = run_job(svc, "group.mp4", ["face"])
    _, close_up = run_job(svc, "close-up.mp4", ["face"])

    frames = group["face"]["result"]["frames"]
    assert len(frames) == 2
    for frame in frames:
        boxes = [face["box"] for face in frame["faces"]]
        missed = [
            (x, y)
            for x, y in T1_FACES
            if not any(x1 <= x <= x2 and y1 <= y <= y2 for x1, y1, x2, y2 in boxes)
        ]
        assert not missed and len(boxes) == len(T1_FACES), (missed, frame["faces"])
    frames = close_up["face"]["result"]["frames"]
    assert [len(frame["faces"]) for frame in frames] == [1, 1], frames
    top, bottom = frames[0]["faces"][0]["box"][1::2]
    assert bottom - top > 240  # the whole face, not a piece of it
