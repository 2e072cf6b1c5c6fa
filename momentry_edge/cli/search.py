"""`momentry-edge search WORDS`: the moments found, one a line: file, time code, snippet."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..terminal import printable
from .client import ApiClient


def command(api: ApiClient, args: argparse.Namespace) -> int:
    found = api.search(args.query, args.limit, source=args.source, folder=args.folder)
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    for hit in found["hits"]:
        print(printable(line(hit)))
    shown = len(found["hits"])
    about = "" if found.get("total_exact", True) else "at least "
    print(f"{shown} of {about}{found['total']} found")
    if not found.get("index", {}).get("complete", True):
        waiting = found["index"].get("waiting")
        print(f"the index is still being built ({waiting} results to go): more may be found")
    return 0


def line(hit: dict[str, Any]) -> str:
    """``folder/name  0:01:02.5  [asr]  the **budget** was cut``."""
    where = "/".join(filter(None, (hit["file"].get("folder"), hit["file"]["name"])))
    snippet = "".join(
        f"**{part['text']}**" if part.get("match") else part["text"] for part in hit["snippet"]
    )
    return (
        f"{where}  {timecode(hit.get('start'))}  [{hit['processor']}]  {' '.join(snippet.split())}"
    )


def timecode(seconds: float | None) -> str:
    """H:MM:SS.s, or ``-`` for a file found by its name."""
    if seconds is None:
        return "-"
    minutes, rest = divmod(float(seconds), 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{rest:04.1f}"
