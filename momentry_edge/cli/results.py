"""`momentry-edge results NAME|UUID`: where a file's results are, processor by processor,
and (--text) its transcript. Everything comes from the service's API."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..terminal import printable, scrub
from ..words import fold
from .client import ApiClient, ApiError

UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)
TRANSCRIPTS = ("asrx", "asr")  # asrx's has word timings besides; either holds the text
PAGE = 1000


class NotFound(Exception):
    """No file, or more than one, answers to the name given."""


def command(api: ApiClient, args: argparse.Namespace) -> int:
    try:
        record = find_file(api, args.file)
    except NotFound as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 1
    if args.text:
        return _print_transcript(api, record)
    newest = record["jobs"][0]["task_id"] if record["jobs"] else None
    job = api.job_detail(newest) if newest else None
    if args.json:
        print(json.dumps({"file": record, "job": job}, indent=2))
        return 0
    render(scrub(record), scrub(job) if job else None)
    return 0


def find_file(api: ApiClient, ref: str) -> dict[str, Any]:
    """The file ``ref`` names: its uuid, or its name or path in the drop folder."""
    if UUID.fullmatch(ref.strip()):
        try:
            return api.file(ref.strip())
        except ApiError as exc:
            if exc.status != 404:
                raise
    # Names compared as searches compare them: "eclair" is "Éclair", typed composed or not.
    wanted = {fold(ref), fold(Path(ref).name)}
    matches, offset = [], 0
    while True:  # the service lists at most PAGE a request
        page = api.files(PAGE, offset, name=Path(ref).name)
        matches += [f for f in page["files"] if f["path"] == ref or fold(f["file_name"]) in wanted]
        offset += len(page["files"])
        if not page["files"] or offset >= page["total"]:
            break
    exact = [f for f in matches if f["path"] == ref] or matches
    if not exact:
        raise NotFound(f"no file named {ref!r} is known; `momentry-edge jobs` lists them")
    if len(exact) > 1:
        names = "; ".join(f"{f['path']} ({f['file_uuid']})" for f in exact[:10])
        raise NotFound(f"{len(exact)} files are named {ref!r}: {names}; give the path or uuid")
    return api.file(exact[0]["file_uuid"])


def render(record: dict[str, Any], job: dict[str, Any] | None) -> None:
    print(printable(f"{record['path']} ({record['file_uuid']}), {record['state']}"))
    if job is None:
        print("no job yet: `momentry-edge submit PATH` queues one")
        return
    print(printable(f"job {job['task_id']}: {job['status']}"))
    for name, run in sorted(job["processors"].items()):
        where = run.get("output_path") or ""
        why = run.get("reason") or run.get("error") or ""
        line = f"  {name:<6} {run.get('status', '?'):<10} {where}"
        print(printable((line + (f"  ({why})" if why else "")).rstrip()))


def _print_transcript(api: ApiClient, record: dict[str, Any]) -> int:
    for processor in TRANSCRIPTS:
        try:
            document = api.result(record["file_uuid"], processor)
        except ApiError as exc:
            if exc.status == 404:
                continue
            raise
        if document.get("status") not in (None, "completed"):
            print(printable(f"({processor}: {document['status']})"), file=sys.stderr)
        document = document.get("result") or {}  # the processor's own part of the document
        segments = document.get("segments")
        if isinstance(segments, list):
            lines = [str(s.get("text", "")).strip() for s in segments if isinstance(s, dict)]
        else:
            lines = [str(document.get("text", "")).strip()]
        print(printable("\n".join(line for line in lines if line), multiline=True))
        return 0
    print(
        printable(f"error: {record['path']} has no transcript (asr has not run on it)"),
        file=sys.stderr,
    )
    return 1
