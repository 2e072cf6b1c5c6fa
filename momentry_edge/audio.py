"""Audio decode with PyAV: a media file's audio tracks as 16 kHz mono float32."""

# Speech models want exactly this, and a whole track at 16 kHz is small (3.8 MB
# per minute), so a run decodes it once, up front, and works on the array.
# Sample 0 is the start of the file's timeline (the container start), the same
# origin frame timestamps use, so times from audio and video agree. Every channel
# (stereo, 5.1) is mixed into the one, at any source rate.

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from .media import _AV_ERRORS, MediaError, MediaNotFoundError, _message, _open, decode_tolerant

SAMPLE_RATE = 16_000
_BLOCK = 500_000  # source samples per resample call


def decode(path: Path | str, track: int = 0) -> np.ndarray | None:
    """Audio track ``track`` (0: the first), resampled; None when there is no such track.

    Raises ``MediaError`` (``MediaNotFoundError`` for a missing file).
    """
    with _open(path) as container:
        if track >= len(container.streams.audio):
            return None
        stream = container.streams.audio[track]
        origin = container.start_time or 0  # microseconds (av.time_base)
        # 16-bit, as faster-whisper's own decode_audio has it: Whisper's text can hinge on
        # the last bit of the samples, and it must match the library's own call's.
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        # Decoded frames are gathered in a FIFO and resampled in large blocks: one
        # resample call per ~10 s instead of one per 20 ms frame (half the time).
        fifo = av.AudioFifo()
        chunks: list[np.ndarray] = []
        first_at: float | None = None  # seconds from the container start

        def resample(frame: av.AudioFrame | None) -> None:
            chunks.extend(
                f.to_ndarray().reshape(-1).astype(np.float32) / 32768.0
                for f in resampler.resample(frame)
            )

        try:
            for frame in decode_tolerant(container, stream):
                if first_at is None and frame.pts is not None and frame.time_base:
                    first_at = float(frame.pts * frame.time_base) - origin / av.time_base
                frame.pts = None  # the FIFO checks continuity; times are kept above
                try:
                    fifo.write(frame)
                except ValueError:  # the format changed mid-stream: flush, start anew
                    if fifo.samples:
                        resample(fifo.read())
                    fifo = av.AudioFifo()
                    fifo.write(frame)
                if fifo.samples >= _BLOCK:
                    resample(fifo.read())
            if fifo.samples:
                resample(fifo.read())
            resample(None)
        except FileNotFoundError:
            raise MediaNotFoundError(f"file not found: {path}") from None
        except _AV_ERRORS as e:
            reason = f"truncated or corrupt: decoding audio failed: {_message(e)}"
            raise MediaError(reason) from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    # A track that starts late is padded so its samples sit at their real time;
    # encoder priming before the start (negative) is dropped.
    shift = round((first_at or 0.0) * SAMPLE_RATE)
    if shift > 0:
        samples = np.concatenate([np.zeros(shift, np.float32), samples])
    elif shift < 0:
        samples = samples[-shift:]
    return np.ascontiguousarray(samples, dtype=np.float32)


def decode_tracks(path: Path | str) -> list[np.ndarray]:
    """Every audio track, in the file's order; empty when there is none."""
    with _open(path) as container:
        count = len(container.streams.audio)
    return [pcm for track in range(count) if (pcm := decode(path, track)) is not None]
