"""What reaches a terminal: control characters in outside text are shown, not obeyed."""

from __future__ import annotations

import logging

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
