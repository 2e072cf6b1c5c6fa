"""Text from outside (file names, paths, reasons, errors) made safe to show on a terminal."""

# A file may be named ``"\x1b[2Jclip.mp4"``: printed raw, it clears the screen, retitles
# the window or fakes output. Every CLI and TUI line built from such text goes through
# ``printable`` (or ``scrub`` for a whole API reply), which shows control characters as
# escapes instead; the JSON log lines go through ``json_line``. Rich markup is a separate
# matter: pass such text as ``rich.text.Text``, never as a markup string.

from __future__ import annotations

import json
import re
from typing import Any

# C0 controls, DEL and C1 controls; bidirectional overrides, which make a name read
# differently from what it is; lone surrogates (undecodable bytes in a file name), which
# cannot even be encoded for output.
_OTHERS = "\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHERS}]")
_UNSAFE_IN_JSON = re.compile(f"[{_OTHERS}]")  # json.dumps escapes C0 itself


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object, multiline: bool = False) -> str:
    """``value`` as text that changes nothing on the terminal it is shown on: one line,
    unless ``multiline`` keeps its line breaks (for a report, never for a name)."""
    return (_UNSAFE_BUT_NEWLINE if multiline else _UNSAFE).sub(_escape, str(value))


def json_line(value: Any) -> str:
    """``value`` as one line of JSON that changes nothing on a terminal (a log file someone
    tails): the unsafe characters as ``\\uXXXX``, other text readable (not ASCII-escaped)."""
    return json_shielded(json.dumps(value, ensure_ascii=False))


def json_shielded(text: str) -> str:
    """JSON text (``ensure_ascii=False``) with the unsafe characters as ``\\uXXXX``."""
    # Raw, those characters can only be inside JSON strings, where \uXXXX means the same.
    return _UNSAFE_IN_JSON.sub(_json_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def scrub(value: Any) -> Any:
    """An API reply with every string in it (keys too) made ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value
