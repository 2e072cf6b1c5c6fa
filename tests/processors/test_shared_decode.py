"""One decode pass feeding every frame processor gives what each gives decoding alone,
stops and resumes per processor, and keeps one processor's failure to itself; the
same with the members fed on several threads, and with each sampled processor's
frames shared out among the threads (one spare instance a thread: the built-in ones keep
to one instance for memory's sake, so yolo and face are given leave here, as a plugin's
processor may be)."""

from __future__ import annotations

import gc
import threading
import time
from itertools import pairwise
from typing import ClassVar

import numpy as np
import pytest
from frame_media import Reports, context, scenes_video

from momentry_edge import media
from momentry_edge.processors import frame_pass, frames
from momentry_edge.processors.backends import Backend
from momentry_edge.processors.base import PermanentError, Stop
from momentry_edge.processors.cut import CutProcessor
from momentry_edge.processors.face import FaceProcessor
from momentry_edge.processors.frames import FramePlan, FrameProcessor, SampledProcessor
from momentry_edge.processors.ocr import OcrProcessor
from momentry_edge.processors.pose import PoseProcessor
from momentry_edge.processors.yolo import YoloProcessor

# 10 frames a second (25 before): every frame is decoded and cut looks at each, while the
# sampled processors see as many frames at any rate; cuts still land to the frame.
FPS = 10
TOTAL = 20 * FPS
STOP_AT = round(10.4 * FPS)  # a stopped pass stops past half-way
WHERE_EVERY = FPS // 5  # Where samples 5 frames a second


class SharedYolo(YoloProcessor):
    spares = True


class SharedFace(FaceProcessor):
    spares = True


def make_processors(models_dir, shared: bool = False) -> list:
    """The five, sample rates kept low so the suite stays quick on two cores (all differ on
    purpose); ``shared``: yolo and face take spares, their frames shared out."""
    yolo, face = (SharedYolo, SharedFace) if shared else (YoloProcessor, FaceProcessor)
    return [
        CutProcessor({}),
        yolo({"models_dir": str(models_dir), "sample_fps": 0.25}),
        OcrProcessor({"sample_fps": 0.2}),
        face({"sample_fps": 1.0}),
        PoseProcessor({"sample_fps": 1.5}),
    ]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return scenes_video(tmp_path_factory.mktemp("shared") / "scenes.mp4", fps=FPS)


@pytest.fixture(scope="module")
def solo(clip, models_dir):
    """Each processor decoding the video on its own."""
    results = {}
    for processor in make_processors(models_dir):
        results[processor.name] = processor.run(context(clip, Reports()))
    return results


class Spares:
    """``run_shared``'s ``spare``: a new instance of a member's processor per call, like
    the worker's pool lends."""

    def __init__(self, make):
        self.make = make
        self.given = []

    def __call__(self, slot):
        spare = self.make()[slot]
        self.given.append(spare)
        return spare


class CountingDecodes:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = media.iter_decoded

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(media, "iter_decoded", counted)


@pytest.mark.parametrize(
    ("threads", "split"), [(1, False), (2, False), (3, False), (2, True), (3, True)]
)
def test_one_shared_decode_gives_each_processor_its_solo_result(
    clip, solo, models_dir, monkeypatch, threads, split
):
    decodes = CountingDecodes(monkeypatch)
    processors = make_processors(models_dir, shared=split)
    reports = [Reports() for _ in processors]
    spares = Spares(lambda: make_processors(models_dir, shared=split))

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r)) for p, r in zip(processors, reports, strict=True)],
        threads=threads,
        spare=spares if split else None,
    )

    assert decodes.calls == 1
    # Each sampled processor given leave (not cut: its frames depend on the one before;
    # nor ocr and pose, spares = False as for every built-in) had a spare for every thread
    # but its own.
    assert sorted(p.name for p in spares.given) == sorted(
        ["face", "yolo"] * (threads - 1) if split else []
    )
    assert {p.name: o for p, o in zip(processors, outcomes, strict=True)} == solo
    assert solo["cut"]["cuts"] == pytest.approx([5.0, 10.0, 15.0], abs=1 / FPS)
    for r in reports:  # each processor has its own progress, ending at the last frame
        currents = [current for current, _ in r.calls]
        assert currents == sorted(currents) and r.calls[-1] == (TOTAL, TOTAL)
        assert max(b - a for a, b in pairwise([0, *currents])) <= 2 * FPS
        assert r.checkpoints[-1]["frame"] == TOTAL


@pytest.mark.parametrize(("threads", "split"), [(1, False), (2, False), (2, True)])
def test_a_stopped_pass_resumes_each_processor_to_the_same_result(
    clip, solo, models_dir, threads, split
):
    processors = make_processors(models_dir, shared=split)
    first = [Reports(stop_at=STOP_AT) for _ in processors]
    spare = Spares(lambda: make_processors(models_dir, shared=split)) if split else None

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r)) for p, r in zip(processors, first, strict=True)],
        threads=threads,
        spare=spare,
    )

    assert all(isinstance(o, Stop) for o in outcomes)
    assert len({r.calls[-1] for r in first}) == 1  # all stopped at the same report
    checkpoints = [r.checkpoints[-1] for r in first]
    for r, checkpoint in zip(first, checkpoints, strict=True):
        assert r.calls[-1][0] - checkpoint["frame"] <= 2 * FPS  # redone: at most ~2 s of video
        assert STOP_AT <= checkpoint["frame"] < TOTAL
    # Resume with different starting points: cut starts over, the others go on.
    checkpoints[0] = None
    processors = make_processors(models_dir, shared=split)
    second = [Reports() for _ in processors]
    outcomes = frame_pass.run_shared(
        clip,
        [
            (p, context(clip, r, checkpoint))
            for p, r, checkpoint in zip(processors, second, checkpoints, strict=True)
        ],
        threads=threads,
        spare=spare,
    )

    assert {p.name: o for p, o in zip(processors, outcomes, strict=True)} == solo
    assert second[1].calls[0][0] > checkpoints[1]["frame"]  # yolo went on, did not start over


class Broken(SampledProcessor):
    """Fails half-way through the video."""

    name = "broken"
    item_key = "things"
    backends = (Backend("numpy", ("numpy",)),)

    def analyse(self, index, seconds, image):
        if index >= TOTAL // 2:
            raise RuntimeError("model exploded")
        return super().analyse(index, seconds, image)

    def detect(self, image):
        return [{"mean": float(image.mean())}]


@pytest.mark.parametrize(("threads", "split"), [(1, False), (2, False), (2, True)])
def test_one_failing_processor_does_not_fail_the_others(clip, solo, tmp_path, threads, split):
    def make():
        return [
            CutProcessor({}),
            Broken({}),
            YoloProcessor({"model_path": str(tmp_path / "missing.onnx")}),
            FaceProcessor({"sample_fps": 1.0}),
        ]

    members = make()
    reports = [Reports() for _ in members]

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r)) for p, r in zip(members, reports, strict=True)],
        threads=threads,
        spare=Spares(make) if split else None,
    )

    cut, broken, yolo, face = outcomes
    assert cut == solo["cut"] and face == solo["face"]
    # The same frame would fail again: a failure with the frame and the reason, not a crash.
    assert isinstance(broken, PermanentError)
    assert f"failed on frame {TOTAL // 2} " in str(broken)
    assert "RuntimeError: model exploded" in str(broken)
    assert isinstance(yolo, PermanentError) and "does not exist" in str(yolo)
    assert 0 < reports[1].checkpoints[-1]["frame"] <= TOTAL // 2  # saved before it failed


class Counter(FrameProcessor):
    """Takes every frame in order; its checkpoints say how many it had been fed."""

    name = "counter"

    def plan(self, info, checkpoint):
        self.fed = checkpoint["frame"] if checkpoint else 0
        self.seen = list(range(self.fed))
        self.threads = set()  # that fed it
        return FramePlan(resume=self.fed)

    def feed(self, index, seconds, image):
        self.threads.add(threading.get_ident())
        if index != self.fed:
            raise RuntimeError(f"fed frame {index} after {self.fed} frames")
        self.fed += 1
        self.seen.append(index)

    def checkpoint(self, done):
        # The live list, not a copy: a checkpoint reported later must not change.
        return {"frame": done, "fed": self.fed, "seen": self.seen}

    def finish(self, done):
        return {"fed": self.fed}


def test_parallel_checkpoints_hold_exactly_the_frames_before_them(clip):
    # Cut takes every frame too and face is slower: they run on the other thread.
    members = [Counter({}), CutProcessor({}), FaceProcessor({"sample_fps": 5.0})]
    reports = [Reports() for _ in members]

    outcomes = frame_pass.run_shared(
        clip, [(p, context(clip, r)) for p, r in zip(members, reports, strict=True)], threads=2
    )

    assert outcomes[0] == {"fed": TOTAL}
    assert len(reports[0].checkpoints) >= TOTAL // (2 * FPS)
    assert all(c["fed"] == c["frame"] for c in reports[0].checkpoints)


class Collecting(Counter):
    """A counter during whose checkpoints Python collects its garbage, as it does now and
    then in the middle of a save in a service with models loaded."""

    def checkpoint(self, done):
        gc.collect()
        return super().checkpoint(done)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_garbage_collection_during_a_save_does_not_hold_off_the_next_checkpoints(clip, threads):
    # A full collection of a heap this big takes ~0.1 s of CPU: were it charged to the
    # save, the next saves would be put off as if saving were that costly.
    heap = [[] for _ in range(1_000_000)]
    reports = Reports()

    (outcome,) = frame_pass.run_shared(
        clip, [(Collecting({}), context(clip, reports))], threads=threads
    )

    assert outcome == {"fed": TOTAL} and len(heap) == 1_000_000
    # The save itself is cheap: every report carries a checkpoint.
    assert [c["frame"] for c in reports.checkpoints] == [current for current, _ in reports.calls]


class Slow(Counter):
    """A counter with work to do on each frame."""

    def feed(self, index, seconds, image):
        for _ in range(4):
            np.asarray(image, np.float32).sum()
        super().feed(index, seconds, image)


def test_a_member_handed_to_another_thread_keeps_its_checkpoints_exact(clip):
    # Shared out before any was timed, both slow members start on the same thread; one
    # is handed to the other thread at a report point once they have been timed.
    members = [Slow({}), Counter({}), Slow({})]
    reports = [Reports() for _ in members]

    outcomes = frame_pass.run_shared(
        clip, [(p, context(clip, r)) for p, r in zip(members, reports, strict=True)], threads=2
    )

    assert outcomes == [{"fed": TOTAL}] * 3
    assert any(len(m.threads) == 2 for m in members)
    for r in reports:
        assert len(r.checkpoints) >= TOTAL // (2 * FPS)
        assert all(c["fed"] == c["frame"] for c in r.checkpoints)


class Holding(Reports):
    """Holds the caller in its first report with a checkpoint until ``reached()`` (the
    frames the members have gone through) is ``ahead`` frames past it, or for ``patience``
    seconds at most; keeps both."""

    def __init__(self, reached, ahead=FPS, patience=60):
        super().__init__()
        self.reached, self.ahead, self.patience = reached, ahead, patience
        self.seen = None

    def __call__(self, current, total, checkpoint):
        if checkpoint is not None and self.seen is None:
            deadline = time.monotonic() + self.patience  # so that a pass that waits fails
            while self.reached() < current + self.ahead and time.monotonic() < deadline:
                time.sleep(0.01)
            self.seen = (current, self.reached())
        super().__call__(current, total, checkpoint)  # the checkpoint as it is now


def test_the_threads_go_on_while_the_caller_reports(clip):
    Where.threads.clear()
    counter = Counter({})
    members = [counter, Where({"sample_fps": 5.0})]
    reports = [Holding(lambda: min(counter.fed, max(list(Where.threads), default=0))), Reports()]

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r)) for p, r in zip(members, reports, strict=True)],
        threads=2,
        spare=lambda slot: Where({"sample_fps": 5.0}),
    )

    assert outcomes[0] == {"fed": TOTAL}
    reported, reached = reports[0].seen
    assert reached >= reported + FPS  # both went on while the caller was in the report
    # Yet every checkpoint holds exactly the frames before it.
    assert all(c["seen"] == list(range(c["frame"])) for c in reports[0].checkpoints)
    for checkpoint in reports[1].checkpoints:
        listed = [f["frame"] for f in checkpoint["partial"]["frames"]]
        assert listed == list(range(0, checkpoint["frame"], WHERE_EVERY))


def test_the_threads_go_on_only_a_few_report_points_past_a_caller_that_lags(clip):
    # The caller stuck in a report (a slow database): what the threads did past it waits
    # in memory for the caller (the lanes' findings, checkpoints), so they stop a few
    # report points ahead. Held here for 3 s: were they not held back, they would reach
    # the end of the video.
    counter = Counter({})
    members = [counter, Where({"sample_fps": 5.0})]
    reports = [Holding(lambda: counter.fed, ahead=TOTAL, patience=3), Reports()]

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r)) for p, r in zip(members, reports, strict=True)],
        threads=2,
        spare=lambda slot: Where({"sample_fps": 5.0}),
    )

    reported, reached = reports[0].seen
    assert reached <= reported + (frame_pass.MARKS_AHEAD + 1) * 2 * FPS < TOTAL
    assert outcomes[0] == {"fed": TOTAL}
    assert all(c["seen"] == list(range(c["frame"])) for c in reports[0].checkpoints)
    assert reports[1].checkpoints[-1]["frame"] == TOTAL


@pytest.mark.parametrize("threads", [1, 2])
def test_a_pass_resumed_from_its_last_checkpoint_gives_the_finished_result(clip, threads):
    # The last checkpoint holds the whole result: a crash before the output file is
    # written resumes there, with no frame left to decode.
    first = Reports()
    (finished,) = frame_pass.run_shared(clip, [(Where({"sample_fps": 5.0}), context(clip, first))])
    members = [Where({"sample_fps": 5.0}), Counter({})]
    checkpoints = [first.checkpoints[-1], {"frame": TOTAL}]
    reports = [Reports() for _ in members]

    outcomes = frame_pass.run_shared(
        clip,
        [(p, context(clip, r, c)) for p, r, c in zip(members, reports, checkpoints, strict=True)],
        threads=threads,
        spare=lambda slot: Where({"sample_fps": 5.0}) if slot == 0 else None,
    )

    assert outcomes == [finished, {"fed": TOTAL}]
    assert [r.calls for r in reports] == [[(TOTAL, TOTAL)]] * 2


class Where(SampledProcessor):
    """Finds, in every sampled frame, its mean and the thread that looked at it."""

    name = "where"
    item_key = "seen"
    backends = (Backend("numpy", ("numpy",)),)
    threads: ClassVar[dict[int, int]] = {}  # frame -> thread ident, across instances

    def analyse(self, index, seconds, image):
        Where.threads[index] = threading.get_ident()
        return super().analyse(index, seconds, image)

    def detect(self, image):
        return [{"mean": round(float(image.mean()), 3)}]


def test_a_sampled_processor_alone_is_shared_out_among_the_threads_in_frame_order(clip):
    alone = Where({"sample_fps": 5.0}).run(context(clip, Reports()))
    Where.threads.clear()
    reports = Reports()

    (outcome,) = frame_pass.run_shared(
        clip,
        [(Where({"sample_fps": 5.0}), context(clip, reports))],
        threads=2,
        spare=lambda slot: Where({"sample_fps": 5.0}),
    )

    assert outcome == alone
    assert len(set(Where.threads.values())) == 2  # both threads looked at its frames
    for checkpoint in reports.checkpoints:  # each holds exactly the frames before it
        listed = [f["frame"] for f in checkpoint["partial"]["frames"]]
        assert listed == sorted(listed) == list(range(0, checkpoint["frame"], WHERE_EVERY))
        assert checkpoint["sampled"] == len(listed)


def test_unreadable_video_fails_every_member(tmp_path):
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video\n" * 50)

    outcomes = frame_pass.run_shared(notes, [(CutProcessor({}), context(notes, Reports()))] * 2)

    assert all(isinstance(o, PermanentError) for o in outcomes)
    assert "not a readable media file" in str(outcomes[0])


def test_decode_sizes_keep_the_aspect_and_never_upscale():
    assert frames.fit_size(1920, 1080, 640) == (640, 360)
    assert frames.fit_size(1080, 1920, 640) == (360, 640)
    assert frames.fit_size(640, 360, 640) is None  # never upscale
    assert frames.fit_size(1920, 1080, 0) is None
