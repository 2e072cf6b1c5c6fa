"""`momentry-edge results NAME|UUID`: where a file's results are, processor by processor,
and (--text) its transcript. Everything comes from the service's API."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

from ..terminal import printable, scrub
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
    files, offset = [], 0
    while True:  # the service lists at most PAGE a request
        page = api.files(PAGE, offset)
        files += page["files"]
        offset += len(page["files"])
        if not page["files"] or offset >= page["total"]:
            break
    matches = matching(files, ref)
    if not matches and UUID.fullmatch(ref.strip()):
        raise NotFound(f"no file has the uuid {ref.strip()}")
    if not matches:
        paths = {loose(f["file_name"]): f["path"] for f in files}
        near = difflib.get_close_matches(loose(Path(ref).name), list(paths), n=5)
        hint = f"; names like it: {', '.join(paths[n] for n in near)}" if near else ""
        raise NotFound(
            f"no known file is named {ref!r}{hint}. A file the service has not registered: "
            "`momentry-edge submit PATH`"
        )
    if len(matches) > 1:
        names = "; ".join(f"{f['path']} ({f['file_uuid']})" for f in matches[:10])
        more = f"; and {len(matches) - 10} more" if len(matches) > 10 else ""
        raise NotFound(
            f"{len(matches)} files match {ref!r}: {names}{more}; give more of the name, "
            "the path or the uuid"
        )
    return api.file(matches[0]["file_uuid"])


# The dashes a keyboard does not type, each read as the hyphen typed in their place.
DASHES = dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe63\uff0d"), "-")


def loose(text: str) -> str:
    """``text`` as a name typed loosely matches it: any case, no accents, an en dash as a
    hyphen, runs of spaces as one."""
    text = unicodedata.normalize("NFKD", text.translate(DASHES))
    text = "".join(c for c in text if not unicodedata.combining(c))
    return " ".join(text.casefold().split())


def matching(files: list[dict[str, Any]], ref: str) -> list[dict[str, Any]]:
    """The files ``ref`` names, the closest kind of match that any has: the path; the name;
    the name typed loosely (see loose), with or without its extension; then a unique start
    of the name or a part of it. Several of the same kind are all returned."""
    typed = loose(Path(ref).name)
    names = [(f, loose(f["file_name"])) for f in files]
    kinds = (
        lambda f, name: f["path"] == ref,
        lambda f, name: f["file_name"] in (ref, Path(ref).name),
        lambda f, name: typed in (name, name.rsplit(".", 1)[0]),
        lambda f, name: name.startswith(typed),
        lambda f, name: typed in name,
    )
    for kind in kinds:
        if found := [f for f, name in names if kind(f, name)]:
            return found
    return []


def render(record: dict[str, Any], job: dict[str, Any] | None) -> None:
    """The file, its newest job, and each processor's result: the last complete one (with a
    newer run that failed or was cancelled beside it), else what there is."""
    print(printable(f"{record['path']} ({record['file_uuid']}), {record['state']}"))
    results = record.get("results") or {}
    if job is None and not results:
        print("no job yet: `momentry-edge submit PATH` queues one")
        return
    if job is not None:
        print(printable(f"job {job['task_id']}: {job['status']}"))
    runs = job["processors"] if job is not None else {}
    for name in sorted(set(runs) | set(results)):
        run, shown = runs.get(name) or {}, results.get(name)
        if shown is not None:
            status, where = shown.get("status", "?"), shown.get("output_path") or ""
            skipped = run.get("status") == "skipped"  # by the newest job: it says why
            why = shown.get("error") or (run.get("reason") if skipped else "")
        else:
            status, where = run.get("status", "?"), run.get("output_path") or ""
            why = run.get("reason") or run.get("error") or ""
        line = f"  {name:<6} {status:<10} {where}"
        print(printable((line + (f"  ({why})" if why else "")).rstrip()))
        later = (shown or {}).get("later_run")
        if later:
            error = f": {later['error']}" if later.get("error") else ""
            note = f"{'':9}a later run, {later.get('task_id')}, {later.get('status')}{error}"
            print(printable(note))


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
        if isinstance(later := document.get("later_run"), dict):
            note = f"({processor}: a later run, {later.get('task_id')}, {later.get('status')})"
            print(printable(note), file=sys.stderr)
        document = document.get("result") or {}  # the processor's own part of the document
        segments = document.get("segments")
        if isinstance(segments, list):
            lines = [_timed(s) for s in segments if isinstance(s, dict)]
        else:
            lines = [str(document.get("text", "")).strip()]
        print(printable("\n".join(line for line in lines if line), multiline=True))
        return 0
    print(
        printable(f"error: {record['path']} has no transcript (asr has not run on it)"),
        file=sys.stderr,
    )
    return 1


def _timed(segment: dict[str, Any]) -> str:
    """A segment as a line: ``[0:01.0 - 0:04.5] its words`` (the console's time codes)."""
    text = str(segment.get("text", "")).strip()
    start, end = segment.get("start"), segment.get("end")
    if not text or not isinstance(start, int | float) or not isinstance(end, int | float):
        return text
    return f"[{clock_time(start)} - {clock_time(end)}] {text}"


def clock_time(seconds: float) -> str:
    """m:ss.s, or h:mm:ss.s from an hour."""
    tenths = round(max(0.0, seconds) * 10)
    minutes, tenths = divmod(tenths, 600)
    hours, minutes = divmod(minutes, 60)
    shown = f"{minutes:02d}" if hours else f"{minutes}"
    return f"{hours}:" * bool(hours) + f"{shown}:{tenths // 10:02d}.{tenths % 10}"
