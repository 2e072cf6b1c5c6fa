"""The frame pass: one decode of a video feeding every frame processor of a job, on one
thread or shared out over several threads (``run_shared``); frames.py is the contract."""

# One piece (~780 lines): the serial and the parallel feeders share the members'
# bookkeeping, reports and checkpoints.

from __future__ import annotations

import collections
import contextlib
import copy
import gc
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from av.video.frame import VideoFrame

from momentry_edge import heap, media
from momentry_edge.pictures import Converter

from .base import PermanentError, Processor, ProcessorError, RunContext, Stop
from .frames import CARRIED, FramePlan, FrameProcessor, Outcome, probe, video_geometry

CHECKPOINT_SECONDS = 2.0  # of video between checkpoints: a resume redoes at most this much


REPORT_SECONDS = 1.0  # of wall time: progress (and a chance to stop) at least this often


# Partial results grow with the video, and so does the cost of saving them. A save
# that took more than CHEAP_SAVE seconds of CPU delays the next one by SAVE_SPACING
# times as long, so saving never costs more than ~1/SAVE_SPACING of the run. CPU, not
# wall time: on a busy machine a cheap save that waited for a core is still cheap.
# Nor the garbage collector's: a full collection of a heap with models loaded takes
# ~0.1 s in whichever thread allocates when one is due; charged to a cheap save, it put
# the next saves off for seconds.

CHEAP_SAVE = 0.01


SAVE_SPACING = 20


# Parallel pass: bytes of images queued per member thread (memory stays flat; counted in
# bytes, not frames, so that many small frames for one member, cut's, do not hold up the
# decode while the thread is on one big frame for another), and how often a blocked
# thread looks whether the pass is ending.

BYTES_IN_FLIGHT = 16 << 20  # 32 held ~20 MiB more and was no quicker


POLL_SECONDS = 0.1


# Report points the threads may be ahead of the caller: what waits for its report (the
# lanes' findings, the checkpoints taken) stays bounded when it lags (a slow database).

MARKS_AHEAD = 4


UNKNOWN_COST = 0.01  # seconds a frame is taken to cost before one was timed


class _Collections(threading.local):
    """CPU seconds this thread spent in Python's garbage collector."""

    spent = 0.0
    started = 0.0


_collections = _Collections()


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    now = time.thread_time()
    if phase == "start":
        _collections.started = now
    else:
        _collections.spent += now - _collections.started


gc.callbacks.append(_on_collection)


def _save_clock() -> float:
    """This thread's CPU seconds but those spent collecting garbage: what a save costs."""
    return time.thread_time() - _collections.spent


log = logging.getLogger(__name__)


class _Member:
    def __init__(self, slot: int, processor: FrameProcessor, ctx: RunContext) -> None:
        self.slot = slot
        self.processor = processor
        self.ctx = ctx
        self.plan: FramePlan | None = None
        self.saved = -1  # frame count of the last checkpoint saved
        self.next_save = 0.0  # monotonic time before which no checkpoint is saved
        self.busy = 0.0  # seconds spent in feed (parallel pass: how threads are shared out)
        # Parallel pass, independent frames: the instance each thread analyses with, and
        # what was found, by frame index, until the caller takes it in order.
        self.lanes: list[FrameProcessor] = []
        self.found: dict[int, tuple[float, Any]] = {}
        # Parallel pass: the frame it failed at (nothing from there on is fed, its reports
        # before still happen) and the error.
        self.fails_at: float = math.inf
        self.error: BaseException | None = None
        # Sampling by time: the frame last asked about and the answer, and the time of the
        # frame before it (None: it was not decoded; a frame's length before it is taken).
        self.asked: tuple[int, float, bool] = (-1, 0.0, False)
        self.before: float | None = None
        self.frame_length = 0.0  # the video's average frame duration (set by run_shared)
        # The picture as a player shows it (upright, square pixels; set by run_shared):
        # the size of a plan without one.
        self.shown: tuple[int, int] | None = None

    def wants(self, index: int, seconds: float) -> bool:
        """Whether to feed this frame; asked about each decoded frame in order (again for
        the same frame gives the same answer)."""
        plan = self.plan
        assert plan is not None
        if not plan.rate:
            return index >= plan.first and (index < plan.resume or index % plan.step == 0)
        if self.asked[:2] == (index, seconds):
            return self.asked[2]
        before, self.before = self.before, seconds
        if index < plan.first:
            wanted = False
        elif index < plan.resume:
            wanted = True
        else:
            if before is None:  # the first frame decoded: at the start, or a resume
                before = seconds - 1 / plan.rate if index == 0 else seconds - self.frame_length
            wanted = _grid(seconds, plan.rate) > _grid(before, plan.rate)
        self.asked = (index, seconds, wanted)
        return wanted

    @property
    def key(self) -> tuple[Any, str]:
        assert self.plan is not None
        return self.plan.size or self.shown, self.plan.fmt


def run_shared(
    media_path: Path,
    members: Sequence[tuple[FrameProcessor, RunContext]],
    threads: int = 1,
    spare: Callable[[int], FrameProcessor | None] | None = None,
) -> list[Outcome]:
    """Decode ``media_path`` once and feed every member; each member's result or error.

    With ``threads`` > 1, one thread decodes and up to ``threads`` others feed the
    members (see ``_Parallel``); results, reports and checkpoints are the same.
    ``spare(i)`` gives another instance of member ``i``'s processor (same settings,
    not in use elsewhere) or None: a member with ``independent_frames`` has its
    frames analysed on every thread, one spare a thread besides itself.
    A ``Stop`` from any member's report (cancel, shutdown, timeout: all job-wide)
    ends the pass after every member has saved its checkpoint; each unfinished
    member's outcome is then that ``Stop``.
    """
    outcomes: list[Outcome | None] = [None] * len(members)
    active = [_Member(i, p, c) for i, (p, c) in enumerate(members)]
    try:
        info = probe(media_path)
    except ProcessorError as exc:
        return [exc] * len(members)
    for m in list(active):
        try:
            m.processor.output_dir = m.ctx.output_dir
            m.plan = m.processor.plan(info, m.ctx.checkpoint)
            width, height, fps = video_geometry(info)
            m.frame_length, m.shown = 1 / fps, (width, height)
        except BaseException as exc:
            outcomes[m.slot] = exc
            active.remove(m)
    if not active:
        return outcomes  # type: ignore[return-value]

    first = min(m.plan.first for m in active)  # type: ignore[union-attr]
    clock = _ReportClock(max(1, round(CHECKPOINT_SECONDS * video_geometry(info)[2])), first)
    feeder = _Parallel if threads > 1 else _Serial
    if threads > 1 and spare is not None:
        for m in active:
            m.lanes = _lanes(m, spare, info, threads)
    stop = None
    try:
        with feeder(media_path, first, active, outcomes, clock, threads) as fed:
            # At each report point every member's checkpoint holds exactly the frames
            # before it (taken there, or now: see _Parallel).
            for done in fed:
                total = max(info.frame_count, done)
                stop = _report_all(active, outcomes, done, total, taken=fed.taken)
                # What the members freed since (frames, the models' buffers), back to the
                # system: a default scan of 2 min of 720p peaked 40-80 MiB lower.
                heap.give_back()
                if stop is not None:
                    break
    except media.MediaNotFoundError as e:
        return _fail_all(outcomes, active, ProcessorError(e.reason, transient=True))
    except media.MediaError as e:
        return _fail_all(outcomes, active, PermanentError(e.reason))
    if stop is not None:
        return _stopped(outcomes, active, stop)
    if not active:
        return outcomes  # type: ignore[return-value]

    # Nothing decoded from ``first`` on: every member resumes at the end (the last
    # checkpoint holds the whole result), the video is the frames before it.
    done = max(fed.done, first)
    if done == 0:
        error = PermanentError("truncated or corrupt: could not decode any video frame")
        return _fail_all(outcomes, active, error)
    for m in list(active):
        try:
            outcomes[m.slot] = m.processor.finish(done)
        except BaseException as exc:
            outcomes[m.slot] = exc
            active.remove(m)
    # The last checkpoint holds the whole result (what finish added included: cut's
    # post-processing and thumbnails): a crash before the output file is written
    # resumes at the end instead of starting over. A stop asked for now does not
    # throw the finished results away; the job notices it next.
    _report_all(active, outcomes, done, done, final=True)
    return outcomes  # type: ignore[return-value]


def _lanes(
    m: _Member, spare: Callable[[int], FrameProcessor | None], info: media.MediaInfo, threads: int
) -> list[FrameProcessor]:
    """The member and ``threads - 1`` spares planned alike, one per thread; [] when the
    member's frames are not independent or a spare cannot be had (it is fed on one thread)."""
    if not (m.processor.independent_frames and m.processor.spares):
        return []
    lanes = [m.processor]
    for _ in range(threads - 1):
        try:
            other = spare(m.slot)
            if other is None or type(other) is not type(m.processor):
                return []
            other.output_dir = m.ctx.output_dir
            plan = other.plan(info, None)
        except BaseException as exc:  # the member still runs, on one thread
            log.warning("no spare %s for the frame pass: %s", m.processor.name, exc)
            return []
        assert m.plan is not None
        if (plan.step, plan.rate, plan.size, plan.fmt) != (
            m.plan.step,
            m.plan.rate,
            m.plan.size,
            m.plan.fmt,
        ):
            return []
        lanes.append(other)
    return lanes


class _ReportClock:
    """Report points: every ``every`` frames of video, and at least every REPORT_SECONDS."""

    def __init__(self, every: int, first: int) -> None:
        self.every = every
        self.next = (first // every + 1) * every
        self.last = time.monotonic()

    def due(self, done: int) -> bool:
        now = time.monotonic()
        if done < self.next and now - self.last < REPORT_SECONDS:
            return False
        self.next = (done // self.every + 1) * self.every
        self.last = now
        return True


class _Serial:
    """Decode and feed on the calling thread, one member after another.

    Iterating yields ``done`` at each report point; ``done`` is then the frame count.
    """

    def __init__(
        self,
        media_path: Path,
        first: int,
        active: list[_Member],
        outcomes: list[Outcome | None],
        clock: _ReportClock,
        threads: int = 1,
    ) -> None:
        self.media_path, self.first, self.clock = media_path, first, clock
        self.active, self.outcomes = active, outcomes
        self.done = 0
        self.taken: dict[int, tuple[dict[str, Any] | None, float]] = {}  # none: see _Parallel

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        converters: dict[tuple[Any, str], Converter] = {}
        for index, seconds, frame in media.iter_decoded(self.media_path, start_frame=self.first):
            images = _convert(frame, index, seconds, self.active, converters)
            for m in list(self.active):
                if m.wants(index, seconds) and not _feed(m, self.outcomes, index, seconds, images):
                    self.active.remove(m)
            self.done = index + 1
            if self.clock.due(self.done):
                yield self.done
            if not self.active:
                return


@dataclass
class _Mark:
    """A report point (or the end) in every member thread's queue, after the frames
    before ``done``."""

    seq: int
    done: int
    owner: dict[int, int]  # member slot -> the thread that feeds it after the mark
    last: bool = False
    # The checkpoints member threads took there, by slot: (the checkpoint, or None where
    # none was due; the CPU seconds it took).
    saves: dict[int, tuple[dict[str, Any] | None, float]] = field(default_factory=dict)


class _Parallel:
    """Decode on one thread and feed the members on up to ``threads`` others; nobody but
    the caller waits at a report point.

    Each member thread has a queue of the frames its members want, bounded in bytes so
    memory stays flat however long the video. At a report point the decode thread puts
    a mark in every queue and goes on decoding. A member with lanes (independent frames,
    a spare per thread) has each frame analysed on the thread with the least work still
    queued; its run state changes only in ``take``, which the caller does in frame
    order, so the caller takes its checkpoints too. Any other member (cut: ``feed``
    changes its state) is fed by one thread at a time; reaching a mark, having fed it
    exactly the frames before, that thread takes its checkpoint (when one is due) and
    goes on at once. The caller waits until every thread has passed the mark, takes
    what the lanes found before it, in order, and reports as a single thread would,
    while the threads work on the frames after it (up to MARKS_AHEAD marks on: a caller
    further behind holds the decode).

    At each mark the decode thread may share the members without lanes out again (the
    ones that took longest so far first, each onto the thread with the least time),
    when that lowers the busiest thread's time by a tenth: a member handed over is fed
    by its new thread only once the old one has passed the mark (the new one waits for
    it there: the only wait besides the caller's, and rare). A member that fails (feed,
    analyse, take, checkpoint, report) is fed nothing from the frame it failed at and
    still reported at the marks before it. Leaving the ``with`` block ends and joins
    every thread.
    """

    def __init__(
        self,
        media_path: Path,
        first: int,
        active: list[_Member],
        outcomes: list[Outcome | None],
        clock: _ReportClock,
        threads: int,
    ) -> None:
        self.media_path, self.first, self.clock = media_path, first, clock
        self.active, self.outcomes = active, outcomes
        self.members = {m.slot: m for m in active}
        self.done = 0
        self.error: BaseException | None = None
        self.taken: dict[int, tuple[dict[str, Any] | None, float]] = {}  # at the last mark
        count = threads if any(m.lanes for m in active) else min(threads, len(active))
        self.owner = _share_out([m for m in active if not m.lanes], count)
        # Seconds and frames each thread spent on each member (a thread writes only its
        # own), and the work (estimated seconds) the decode gave each thread and what of
        # it the thread did: the difference is what is still queued.
        self.spent = [collections.Counter[int]() for _ in range(count)]
        self.looks = [collections.Counter[int]() for _ in range(count)]
        self.given = [0.0] * count
        self.worked = [0.0] * count
        # The marks the caller has yet to report, and the last one each thread passed.
        self.marks: collections.deque[_Mark] = collections.deque()
        self.seq = 0  # the next mark's
        self.passed = [-1] * count
        self.progress = threading.Condition()
        self.lock = threading.Lock()  # what lanes found; failures
        self.quit = threading.Event()
        self.queues = [_Inbox(BYTES_IN_FLIGHT, self.quit) for _ in range(count)]
        self.threads = [threading.Thread(target=self._decode, name="frames-decode")]
        self.threads += [
            threading.Thread(target=self._work, args=(i, dict(self.owner)), name=f"frames-{i}")
            for i in range(count)
        ]

    def __enter__(self) -> _Parallel:
        try:
            for thread in self.threads:
                thread.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.quit.set()  # a stop or an error: the others leave what they were doing
        for thread in self.threads:
            if thread.ident is not None:  # started
                thread.join()

    def __iter__(self) -> Iterator[int]:
        while True:
            mark = self._next_mark()
            self._take_found(mark.done)
            self._prune(mark.done)
            if mark.last:
                break
            self.taken = {
                m.slot: mark.saves.get(m.slot, (None, 0.0)) for m in self.active if not m.lanes
            }
            yield mark.done
            for m in self.members.values():  # one that failed in its report is fed no more
                if isinstance(outcome := self.outcomes[m.slot], BaseException):
                    self._fail(m, mark.done, outcome)
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error

    def _next_mark(self) -> _Mark:
        """The next mark, once every member thread has passed it."""
        with self.progress:
            while not (self.marks and min(self.passed) >= self.marks[0].seq):
                if self.quit.is_set():  # a thread ended early
                    raise self.error or RuntimeError("frame pass: a thread ended early")
                self.progress.wait(POLL_SECONDS)
            self.progress.notify_all()  # the decode may wait for room for a mark
            return self.marks.popleft()

    def _take_found(self, done: int) -> None:
        """Hand each member with lanes what they found before ``done``, in frame order."""
        for m in self.active:
            if not m.lanes or m.fails_at < done:
                continue
            with self.lock:
                found = [(i, m.found.pop(i)) for i in sorted(i for i in m.found if i < done)]
            for index, (seconds, what) in found:
                try:
                    m.processor.take(index, seconds, what)
                except BaseException as exc:
                    self._fail(m, index, frame_failure(m.processor, index, seconds, exc))
                    break

    def _prune(self, done: int) -> None:
        """Members that failed before ``done`` get their error as outcome."""
        for m in self.active:
            if m.fails_at < done:
                self.outcomes[m.slot] = m.error
        self.active[:] = [m for m in self.active if self.outcomes[m.slot] is None]

    def _fail(self, m: _Member, at: float, exc: BaseException) -> None:
        """``m`` failed at frame ``at``: the first failure counts."""
        with self.lock:
            if at < m.fails_at:
                m.fails_at, m.error = at, exc

    def _decode(self) -> None:
        converters: dict[tuple[Any, str], Converter] = {}
        try:
            # One decoder thread: the pass's others are busy with the members.
            decoded = media.iter_decoded(self.media_path, start_frame=self.first, threaded=False)
            with contextlib.closing(decoded):  # type: ignore[type-var]  # a generator
                for index, seconds, frame in decoded:
                    wanting = [m for m in self.members.values() if index < m.fails_at]
                    if not wanting or self.quit.is_set():
                        break
                    images = _convert(frame, index, seconds, wanting, converters)
                    tasks: dict[int, list[_Member]] = {}
                    cost = collections.Counter[int]()
                    for m in wanting:
                        if m.wants(index, seconds):
                            if m.lanes and self._unchanged(m, index, seconds, images[m.key]):
                                continue
                            thread = self._thread_for(m, cost)
                            tasks.setdefault(thread, []).append(m)
                    for thread, members in sorted(tasks.items()):
                        size = sum(images[key].nbytes for key in {m.key for m in members})
                        self.given[thread] += cost[thread]  # as the thread adds it to worked
                        item = (index, seconds, images, members, cost[thread])
                        self.queues[thread].put(item, size)
                    self.done = index + 1
                    if self.clock.due(self.done):
                        self._mark(self.done)
        except BaseException as exc:  # MediaError for the caller, or a bug: raised there
            self.error = exc
        self._mark(self.done, last=True)

    def _unchanged(self, m: _Member, index: int, seconds: float, image: np.ndarray) -> bool:
        """Whether ``m`` skips this frame (it is then found CARRIED, taken in order as the
        rest); asked here, in frame order. A failure to tell is ``m``'s from this frame."""
        try:
            if not m.processor.unchanged(index, seconds, image):
                return False
        except BaseException as exc:
            self._fail(m, index, frame_failure(m.processor, index, seconds, exc))
            return True
        with self.lock:
            m.found[index] = (seconds, CARRIED)
        return True

    def _thread_for(self, m: _Member, cost: collections.Counter[int]) -> int:
        """The thread to give ``m`` a frame: its owner, or with lanes the one with the least
        work queued (``cost``: this frame's so far), then given so far; what the frame is
        likely to cost is added to ``cost``."""
        looks = sum(c[m.slot] for c in self.looks)
        estimate = sum(c[m.slot] for c in self.spent) / looks if looks else UNKNOWN_COST
        thread = self.owner.get(m.slot, 0)
        if m.lanes:
            threads = range(len(self.queues))
            queued = [(self.given[t] - self.worked[t] + cost[t], self.given[t]) for t in threads]
            thread = queued.index(min(queued))
        cost[thread] += estimate  # type: ignore[assignment]  # seconds, in a Counter
        return thread

    def _mark(self, done: int, last: bool = False) -> None:
        """Put a mark in every queue (after the frames before ``done``), for the caller too."""
        owner = self.owner if last else self._reshare()
        mark = _Mark(self.seq, done, owner, last)
        self.seq += 1
        with self.progress:
            while len(self.marks) >= MARKS_AHEAD and not self.quit.is_set():
                self.progress.wait(POLL_SECONDS)  # the caller lags: see MARKS_AHEAD
            self.marks.append(mark)
        for q in self.queues:
            q.put(mark)
        self.owner = owner

    def _reshare(self) -> dict[int, int]:
        """Who feeds each member without lanes after the next mark."""
        members = [m for m in self.members.values() if not m.lanes and self.done < m.fails_at]
        count = len(self.queues)
        owner = _share_out(members, count)
        better = _busiest(owner, members, count) < 0.9 * _busiest(self.owner, members, count)
        return owner if better else self.owner

    def _work(self, thread: int, owner: dict[int, int]) -> None:
        """Feed this thread's queue; ``owner``: who fed the members without lanes since
        the last mark."""
        q = self.queues[thread]
        try:
            while (item := q.get()) is not None:
                if isinstance(item, _Mark):
                    if not self._pass(thread, item, owner) or item.last:
                        return
                    owner = item.owner
                    continue
                index, seconds, images, members, cost = item
                for m in members:
                    if index < m.fails_at:
                        self._look(m, thread, index, seconds, images[m.key])
                self.worked[thread] += cost
        except BaseException as exc:  # a bug here: end the pass, the caller raises it
            self.error = exc
            self.quit.set()

    def _look(self, m: _Member, thread: int, index: int, seconds: float, image: np.ndarray) -> None:
        """Feed ``m`` a frame, or with lanes analyse it with this thread's instance."""
        started = time.perf_counter()
        try:
            if m.lanes:
                found = m.lanes[thread].analyse(index, seconds, image)
                with self.lock:
                    m.found[index] = (seconds, found)
            else:
                m.processor.feed(index, seconds, image)
        except BaseException as exc:
            self._fail(m, index, frame_failure(m.processor, index, seconds, exc))
        spent = time.perf_counter() - started
        if not m.lanes:
            m.busy += spent
        self.spent[thread][m.slot] += spent  # type: ignore[assignment]  # seconds
        self.looks[thread][m.slot] += 1

    def _pass(self, thread: int, mark: _Mark, owner: dict[int, int]) -> bool:
        """Take the checkpoints due at ``mark`` of the members this thread fed, say it has
        passed it, then wait for the old thread of each member handed to this one there to
        pass it too. False when the pass is ending."""
        for slot, fed_by in owner.items():
            m = self.members[slot]
            if fed_by == thread and not mark.last and mark.done <= m.fails_at:
                mark.saves[slot] = self._save(m, mark.done)
        with self.progress:
            self.passed[thread] = mark.seq
            self.progress.notify_all()
            for slot, fed_by in mark.owner.items():
                before = owner.get(slot, thread)
                while fed_by == thread != before and self.passed[before] < mark.seq:
                    if self.quit.is_set():
                        return False
                    self.progress.wait(POLL_SECONDS)
        return True

    def _save(self, m: _Member, done: int) -> tuple[dict[str, Any] | None, float]:
        """``m``'s checkpoint at ``done`` if one is due, and the CPU seconds it took. The
        caller adds its report's to space the next one (it may be a few marks behind)."""
        assert m.plan is not None
        if done <= m.plan.resume or time.monotonic() < m.next_save:
            return None, 0.0
        cpu = _save_clock()
        try:
            # A copy: it is reported after this thread has fed the member more frames.
            return copy.deepcopy(m.processor.checkpoint(done)), _save_clock() - cpu
        except BaseException as exc:
            self._fail(m, done - 1, exc)  # no report at this mark
            return None, 0.0


class _Inbox:
    """One member thread's queue, holding at most ``limit`` bytes of images (and always at
    least one item). Both ends give up once ``quit`` is set."""

    def __init__(self, limit: int, quit: threading.Event) -> None:
        self.limit, self.quit = limit, quit
        self.items: collections.deque[tuple[Any, int]] = collections.deque()
        self.bytes = 0
        self.changed = threading.Condition()

    def put(self, item: Any, size: int = 0) -> None:
        with self.changed:
            while not self.quit.is_set():
                if not self.items or self.bytes + size <= self.limit:
                    self.items.append((item, size))
                    self.bytes += size
                    self.changed.notify()
                    return
                self.changed.wait(POLL_SECONDS)

    def get(self) -> Any:
        """The next item; None once the pass is ending."""
        with self.changed:
            while not self.quit.is_set():
                if self.items:
                    item, size = self.items.popleft()
                    self.bytes -= size
                    self.changed.notify()
                    return item
                self.changed.wait(POLL_SECONDS)
            return None


def _share_out(members: list[_Member], threads: int) -> dict[int, int]:
    """Member slot -> thread: the members that took longest so far first, each onto the
    thread with the least time (then fewest members) so far."""
    loads = [(0.0, 0)] * threads
    owner = {}
    for m in sorted(members, key=lambda m: -m.busy):
        thread = loads.index(min(loads))
        owner[m.slot] = thread
        busy, count = loads[thread]
        loads[thread] = (busy + m.busy, count + 1)
    return owner


def _busiest(owner: dict[int, int], members: list[_Member], threads: int) -> float:
    """The most time so far of one thread's members, shared out as ``owner`` says."""
    loads = [0.0] * threads
    for m in members:
        loads[owner[m.slot]] += m.busy
    return max(loads)


def _convert(
    frame: VideoFrame,
    index: int,
    seconds: float,
    members: list[_Member],
    converters: dict[tuple[Any, str], Converter],
) -> dict[tuple[Any, str], np.ndarray]:
    """The frame converted once per (size, pixel format) that a member wants at ``index``
    (upright, contiguous, read-only: see pictures.py)."""

    images: dict[tuple[Any, str], np.ndarray] = {}
    for m in members:
        if m.wants(index, seconds) and m.key not in images:
            if m.key not in converters:
                converters[m.key] = Converter(*m.key)
            images[m.key] = converters[m.key](frame)
    return images


def _feed(
    m: _Member,
    outcomes: list[Outcome | None],
    index: int,
    seconds: float,
    images: dict[tuple[Any, str], np.ndarray],
) -> bool:
    """Feed one member its image; False (its outcome the error) when ``feed`` raises."""
    started = time.perf_counter()
    try:
        m.processor.feed(index, seconds, images[m.key])
    except BaseException as exc:
        outcomes[m.slot] = frame_failure(m.processor, index, seconds, exc)
        return False
    finally:
        m.busy += time.perf_counter() - started
    return True


def frame_failure(
    processor: Processor, index: int, seconds: float, exc: BaseException
) -> BaseException:
    """What a processor raising ``exc`` on a frame ends its run with. The same frame gives
    the same error again (same pixels, same model): a failure with its reason, not a
    crash to retry. Out of memory, the system's errors (a full disk: the job waits for
    room) and the processor's own errors stay as they are."""
    if not isinstance(exc, Exception) or isinstance(exc, (ProcessorError, MemoryError, OSError)):
        return exc
    log.warning("%s failed on frame %d", processor.name, index, exc_info=exc)
    detail = str(exc).strip() or "no detail"
    return PermanentError(
        f"failed on frame {index} ({seconds:.3f} s): {type(exc).__name__}: {detail}"
    )


def _report_all(
    members: list[_Member],
    outcomes: list[Outcome | None],
    done: int,
    total: int,
    final: bool = False,
    taken: Mapping[int, tuple[dict[str, Any] | None, float]] | None = None,
) -> Stop | None:
    """Report progress (with a checkpoint where due) for every member; the first Stop.
    ``taken``, by member slot: the checkpoint already taken at ``done`` (None where none
    was due) and the CPU seconds it took."""
    first_stop = None
    for m in list(members):
        if not final and m.plan is not None and done <= m.plan.resume:
            continue  # still before its resume point: nothing new to save
        now, cpu = time.monotonic(), _save_clock()
        checkpoint, spent = None, 0.0
        try:
            if taken is not None and m.slot in taken:
                checkpoint, spent = taken[m.slot]
            elif final or now >= m.next_save:
                checkpoint = m.processor.checkpoint(done)
            m.ctx.report(done, total, checkpoint)
        except Stop as stop:
            # Job-wide: the others still save their state, then the pass ends.
            first_stop = first_stop or stop
        except BaseException as exc:
            outcomes[m.slot] = exc
            members.remove(m)
            continue
        if checkpoint is not None:
            m.saved = done
            spent += _save_clock() - cpu
            m.next_save = now + SAVE_SPACING * spent if spent > CHEAP_SAVE else 0.0
    return first_stop


def _stopped(outcomes: list[Outcome | None], active: list[_Member], stop: Stop) -> list[Outcome]:
    for m in active:
        outcomes[m.slot] = stop
    return outcomes  # type: ignore[return-value]


def _fail_all(
    outcomes: list[Outcome | None], active: list[_Member], error: ProcessorError
) -> list[Outcome]:
    for m in active:
        outcomes[m.slot] = error
    return outcomes  # type: ignore[return-value]


def _grid(seconds: float, rate: float) -> int:
    """The last multiple of 1/rate s at or before ``seconds`` (a nanosecond's slack)."""
    return math.floor(seconds * rate + 1e-9)
