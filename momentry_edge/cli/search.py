"""`momentry-edge search WORDS [--meaning]`: the moments found, one a line: file, time
code, snippet."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..terminal import printable
from .client import ApiClient


def command(api: ApiClient, args: argparse.Namespace) -> int:
    mode = "meaning" if getattr(args, "meaning", False) else None
    found = api.search(args.query, args.limit, source=args.source, folder=args.folder, mode=mode)
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    for hit in found["hits"]:
        print(printable(line(hit, scored=mode is not None)))
    shown = len(found["hits"])
    about = "" if found.get("total_exact", True) else "at least "
    print(f"{shown} of {about}{found['total']} found")
    if not found.get("index", {}).get("complete", True):
        waiting = found["index"].get("waiting")
        what = "moments to embed" if mode else "results to go"
        print(f"the index is still being built ({waiting} {what}): more may be found")
    return 0


def line(hit: dict[str, Any], scored: bool = False) -> str:
    """``folder/name  0:01:02.5  [asr]  the **budget** was cut`` (by meaning, the
    likeness after the source: ``[asr 0.42]``)."""
    where = "/".join(filter(None, (hit["file"].get("folder"), hit["file"]["name"])))
    snippet = "".join(
        f"**{part['text']}**" if part.get("match") else part["text"] for part in hit["snippet"]
    )
    source = hit["processor"]
    if scored and hit.get("score") is not None:
        source += f" {hit['score']:.2f}"
    return f"{where}  {timecode(hit.get('start'))}  [{source}]  {' '.join(snippet.split())}"


def timecode(seconds: float | None) -> str:
    """H:MM:SS.s, or ``-`` for a file found by its name."""
    if seconds is None:
        return "-"
    minutes, rest = divmod(float(seconds), 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{rest:04.1f}"
