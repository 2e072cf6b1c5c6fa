"""What reaches a terminal: control characters in outside text are shown, not obeyed."""

from __future__ import annotations

import logging
import sys

from momentry_edge.logs import Readable
from momentry_edge.terminal import printable, scrub


def test_control_characters_are_escaped_and_the_rest_kept() -> None:
    assert printable("\x1b[2Jclip.mp4") == "\\x1b[2Jclip.mp4"
    assert printable("\x1b]0;pwned\x07") == "\\x1b]0;pwned\\x07"
    assert printable("a\x7fb\x9bc") == "a\\x7fb\\x9bc"  # DEL and a C1 CSI
    assert printable("evil\u202egnp.mp4") == "evil\\u202egnp.mp4"  # a bidi override
    assert printable("bad\udcffname") == "bad\\udcffname"  # an undecodable byte
    assert printable("two\nlines") == "two\\x0alines"
    assert printable("two\nlines\x1b", multiline=True) == "two\nlines\\x1b"
    assert printable("Café [bold]ok[/] 🎬.mp4") == "Café [bold]ok[/] 🎬.mp4"


def test_scrub_reaches_every_string_of_a_reply() -> None:
    reply = {"jobs": [{"file_name": "\x1bx", "progress": 5, "processors": ["\x07"]}], "n": None}
    assert scrub(reply) == {
        "jobs": [{"file_name": "\\x1bx", "progress": 5, "processors": ["\\x07"]}],
        "n": None,
    }


def test_the_service_log_on_stderr_escapes_names() -> None:
    record = logging.LogRecord(
        "momentry_edge.ingest", logging.WARNING, __file__, 1, "rejected %s", ("\x1b[2J.mp4",), None
    )
    line = Readable().format(record)
    assert "\x1b" not in line and "rejected \\x1b[2J.mp4" in line


def test_a_name_with_a_line_break_cannot_forge_a_log_line() -> None:
    name = "evil\n2026-12-02 17:00:00,000 ERROR momentry_edge.worker: FAKE.mp4"
    record = logging.LogRecord(
        "momentry_edge.ingest", logging.WARNING, __file__, 1, "rejected %s", (name,), None
    )
    lines = Readable().format(record).splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "rejected evil\\x0a2026-12-02 17:00:00,000 ERROR momentry_edge.worker: FAKE.mp4"
    )
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    shown = Readable().format(record).splitlines()  # the traceback keeps its lines
    assert shown[0] == lines[0] and shown[1] == "Traceback (most recent call last):"
