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
    wanted = {ref, Path(ref).name}
    matches, offset = [], 0
    while True:  # the service lists at most PAGE a request
        page = api.files(PAGE, offset)
        matches += [f for f in page["files"] if f["path"] == ref or f["file_name"] in wanted]
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
