"""Speech to text (``asr``) and speech to text with word timings (``asrx``)."""

# The processors: settings, readiness, model loading and subtitles. The engines that run
# Whisper are in whisper.py; the transcription both processors share in transcription.py.

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from momentry_edge import weights
from momentry_edge.processors import subtitles
from momentry_edge.processors.backends import Platform, choose, importable, this_platform
from momentry_edge.processors.base import (
    PermanentError,
    Processor,
    Readiness,
    RunContext,
)
from momentry_edge.processors.transcription import run_shared
from momentry_edge.processors.whisper import BACKENDS, ENGINES, Engine, Options, forget_vad

log = logging.getLogger(__name__)


class AsrProcessor(Processor):
    name = "asr"
    version = "1"
    word_timestamps = False

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        platform: Platform | None = None,
        can_import: Callable[[str], bool] = importable,
    ) -> None:
        super().__init__(settings)
        self.engine: Engine | None = None
        self._problem: str | None = None  # why this processor cannot run, known up front
        self._bad_settings: str | None = None
        self.spec: weights.ModelSpec | None = None
        try:
            self.opts = Options.parse(self.settings)
        except (TypeError, ValueError) as e:
            self.opts = Options()
            self._problem = self._bad_settings = f"bad {self.name} settings: {e}"
        self.choice = choose(
            BACKENDS, self.opts.backend, platform=platform or this_platform(), can_import=can_import
        )
        self.backend = self.choice.name
        self.model = self.opts.model
        self.models_dir = (
            Path(self.opts.models_dir).expanduser()
            if self.opts.models_dir
            else weights.models_root()
        )
        if self._problem is None and self.choice.backend is None:
            self._problem = f"no {self.name} backend: {self.choice.reason}"
        if self._problem is None:
            self._find_model(self.backend)

    def _find_model(self, backend: str) -> None:
        try:
            catalog = weights.load_catalog()
        except weights.ModelError as e:
            self._problem = str(e)
            return
        self.spec = catalog.find(self.opts.model, backend, self.name)
        if self.spec is None:
            # A model no run here can load: the service refuses to start with it.
            self._problem = self._bad_settings = (
                f"model: {catalog.unknown(self.name, self.opts.model, backend)}"
            )
        else:
            self.model = self.spec.model

    def settings_problem(self) -> str | None:
        return self._bad_settings

    def readiness(self) -> Readiness:
        if self._problem is not None:
            return Readiness(False, self._problem)
        assert self.spec is not None
        state = weights.state(self.spec, self.models_dir)
        return Readiness(state.ready, state.reason)

    def load(self) -> None:
        state = self.readiness()
        if not state.ready:
            raise PermanentError(state.reason or "not ready")
        if self.engine is not None:
            return
        assert self.spec is not None
        folder = weights.model_dir(self.spec, self.models_dir)
        try:
            self.engine = ENGINES[self.backend](folder, self.opts)
        except Exception as e:  # verified files the library cannot read, or the library
            raise PermanentError(
                f"{self.backend} cannot load {folder}: {type(e).__name__}: {e}; "
                + weights.unloadable_fix(self.spec, self.models_dir)
            ) from e
        log.info("%s: %s model %s loaded from %s", self.name, self.backend, self.model, folder)

    def unload(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
        forget_vad()

    def run(self, ctx: RunContext) -> dict[str, Any]:
        outcome = run_shared(ctx.media_path, [(self, ctx)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def write_subtitles(
        self,
        ctx: RunContext,
        result: dict[str, Any],
        speech: Mapping[tuple[int, str | None], subtitles.Spans] | None = None,
    ) -> None:
        """``<name>.srt`` and ``.vtt`` of all the speech, cues in time order; with several
        sources (tracks, or the channels of a stereo track apart) also each source's
        own, as ``result["subtitles"]`` names them. ``speech``: where the VAD heard
        speech, by source (track, channel)."""
        norms = self.opts.norms()
        made = {
            _place(source): subtitles.cues(
                [s for s in result["segments"] if _place(s) == _place(source)],
                source["language"],
                norms,
                (speech or {}).get(_place(source), ()),
            )
            for source in result["languages"]
        }
        every = [c for found in made.values() for c in found]
        if len(made) > 1:  # the sources' cues in time order
            every.sort(key=lambda c: c.start)
        ctx.write_text(f"{self.name}.srt", subtitles.to_srt(every))
        ctx.write_text(f"{self.name}.vtt", subtitles.to_vtt(every))
        for files in result["subtitles"]:
            if files["srt"] != f"{self.name}.srt":  # a pair of its own
                ctx.write_text(files["srt"], subtitles.to_srt(made.get(_place(files), [])))
                ctx.write_text(files["vtt"], subtitles.to_vtt(made.get(_place(files), [])))


class AsrxProcessor(AsrProcessor):
    """``asr`` plus the start, end and probability of every word."""

    name = "asrx"
    word_timestamps = True


def can_share(first: Processor, second: Processor) -> bool:
    """Whether two processors of one job can share one transcription (``run_shared``):
    asr and asrx with the same settings. Otherwise each runs on its own."""
    return (
        isinstance(first, AsrProcessor)
        and isinstance(second, AsrProcessor)
        and first.opts == second.opts
        and first.backend == second.backend
    )


def _place(item: dict[str, Any]) -> tuple[int, str | None]:
    """A segment's or a source's track and channel (None: the channels mixed)."""
    return item.get("track", 0), item.get("channel")
