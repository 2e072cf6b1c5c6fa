"""Which processors of a job share their work, and running them together: the frame
processors share one decode pass (frame_pass.run_shared), asr and asrx with the same settings
one transcription (transcription.run_shared); any other processor runs on its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .base import Processor, RunContext

# The processors' own modules (numpy, PyAV, the model libraries) load when a job needs them:
# a service that runs only other processors, or none yet, never loads them.

# An instance of a processor to look at (its class, its settings), not to run; None if broken.
Peek = Callable[[str], Processor | None]


def groups(names: Sequence[str], peek: Peek) -> list[list[int]]:
    """The positions of a job's processors (``names``, in order), one per group, except
    for work that is shared: in one group, at its first member's place."""
    frame = [i for i, name in enumerate(names) if _in_frame_pass(peek(name))]
    speech = [i for i, name in enumerate(names) if name in ("asr", "asrx")]
    if len(speech) != 2 or not _can_share(peek("asr"), peek("asrx")):
        speech = []
    grouped = []
    for i in range(len(names)):
        group = next((g for g in (frame, speech) if i in g), None)
        if group is None:
            grouped.append([i])
        elif i == group[0]:
            grouped.append(group)
    return grouped


def _in_frame_pass(processor: Processor | None) -> bool:
    return processor is not None and processor.frame_pass


def _can_share(first: Processor | None, second: Processor | None) -> bool:
    from . import asr

    return first is not None and second is not None and asr.can_share(first, second)


def frame_pass_threads(names: Sequence[str], peek: Peek, budget: int) -> int | None:
    """The threads a group gets if it is the frame pass (None if it is not): the pass is a
    job's long part, so it gets the job's whole budget (frame_pass.run_shared adds its decode
    thread) when a member's frames are independent (shared out), else one per member."""
    if not names or not _in_frame_pass(peek(names[0])):
        return None
    if any(getattr(peek(name), "independent_frames", False) for name in names):
        return budget
    return max(1, min(budget, len(names)))


def run_together(
    media_path: Path,
    members: list[tuple[Processor, RunContext]],
    threads: int,
    spare: Callable[[int], Processor],
) -> list[Any]:
    """Each member's result, or the exception it ended with: a group of ``groups`` run
    as one (``spare(i)`` another instance of member ``i``'s processor, for the frame pass)."""
    if members and members[0][0].frame_pass:
        from . import frame_pass

        return frame_pass.run_shared(
            media_path,
            members,  # type: ignore[arg-type]
            threads=threads,
            spare=spare,  # type: ignore[arg-type]
        )
    if len(members) > 1:
        from . import transcription

        return transcription.run_shared(media_path, members)  # type: ignore[arg-type]
    return [outcome(processor, ctx) for processor, ctx in members]


def outcome(processor: Processor, ctx: RunContext) -> Any:
    """``processor.run(ctx)``'s result, or the exception it raised."""
    try:
        return processor.run(ctx)
    # Whatever it raises (a library's sys.exit, a KeyboardInterrupt) ends the run, not the thread.
    except BaseException as exc:
        return exc
