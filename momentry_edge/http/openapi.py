"""The OpenAPI 3.0.3 document of the HTTP API (API.md), as data. Served at /openapi.json."""

# One piece (~610 lines): the OpenAPI document, one schema per route, beside its builder.

from __future__ import annotations

import copy
import re
from typing import Any

Schema = dict[str, Any]


def _ref(name: str, kind: str = "schemas") -> Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def _obj(props: Schema, required: str = "") -> Schema:
    """An object schema; ``required`` names the always-present keys, "*" for all of them."""
    schema: Schema = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(props) if required == "*" else required.split()
    return schema


def _arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _null(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def _ok(**props: Schema) -> Schema:
    """An action's reply: {"success": true, ...props}, every key always present."""
    return _obj({"success": {"type": "boolean", "enum": [True]}, **props}, "*")


STR, INT, NUM, BOOL = ({"type": t} for t in ("string", "integer", "number", "boolean"))
TIME = {"type": "string", "format": "date-time", "nullable": True}  # ISO 8601 UTC with Z
PCT = {"type": "integer", "minimum": 0, "maximum": 100}
NAMES = _arr({"type": "string", "example": "asr"})  # processor names (plugins may add more)
TASK_ID = {"type": "string", "pattern": "^task_[0-9a-f]{12}$"}
FILE_UUID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
HEX32 = "[0-9a-fA-F]{32}"
DASHED_UUID = "[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"

_ENTRY = {  # the fields every job representation shares
    "id": INT,
    "task_id": TASK_ID,
    "file_uuid": FILE_UUID,
    "file_name": STR,
    "status": _ref("JobStatus"),
    "priority": _ref("Priority"),
    "processors": NAMES,
}
_FILE = {
    "file_uuid": FILE_UUID,
    "file_name": STR,
    "path": {"type": "string", "description": "relative to its watched folder"},
    "state": _enum("present", "missing", "rejected", "ignored"),
    "reason": _null(STR),
    "size": INT,
    "status": {"allOf": [_ref("JobStatus")], "nullable": True},
}

_ENTRY_KEYS = " ".join(_ENTRY)
_RUN_OF_RESULT = {  # what a result document says of the run that wrote it
    "status": _enum("completed", "failed", "partial"),
    "task_id": _null(TASK_ID),
    "completed_at": TIME,
    "error": _null(STR),
    "last_checkpoint": _null({"type": "object", "additionalProperties": True}),
}
_SCAN = {  # the deep-scan options a request body may carry
    "processors": NAMES | {"minItems": 1},
    "priority": _ref("Priority"),
    "retry_on_failure": BOOL,
    "callback_url": {"type": "string", "format": "uri", "maxLength": 2048},
    "force": {"type": "boolean", "description": "re-run processors whose output is up to date"},
    "max_retries": {
        "type": "integer",
        "minimum": 0,
        "maximum": 100,
        "description": "automatic retries for this job (default: queue.max_retries)",
    },
    "task_timeout": {
        "type": "number",
        "minimum": 1,
        "maximum": 604800,
        "description": "seconds this job may run (default: queue.task_timeout)",
    },
    "not_before": {
        "type": "string",
        "format": "date-time",
        "description": "ISO 8601; the job waits in line until then (no zone: UTC)",
    },
}
DEEP_SCAN_KEYS = frozenset(_SCAN)  # any other key in a deep-scan body is refused

_ERROR_CODES = (
    "bad_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "conflict",
    "payload_too_large",
    "busy",
)

SCHEMAS: dict[str, Schema] = {
    "Error": _obj(
        {
            "success": {"type": "boolean", "enum": [False]},
            "error": _obj({"code": _enum(*_ERROR_CODES), "message": STR}, "*"),
        },
        "*",
    ),
    "Priority": _enum("low", "normal", "high"),
    "JobStatus": _enum(
        "pending", "processing", "retrying", "completed", "partial", "failed", "cancelled"
    ),
    "QueueEntry": _obj(
        _ENTRY
        | {
            "started_at": TIME,
            "progress": PCT,
            "node": _null(STR),
            "estimated_end": TIME | {"description": "when a running job should end, if known"},
            "progress_at": TIME | {"description": "a running job's last progress report"},
            "stalled": BOOL
            | {"description": "a running job without progress for queue.stall_seconds"},
            "queued_at": TIME,
            "position": {"type": "integer", "minimum": 1},
            "estimated_start": TIME,
            "next_attempt_at": TIME,
            "error": _null(STR),
            "retry_count": INT,
            "not_before": TIME,
            "stranded": _null(STR | {"description": "a waiting job no live node can run: why"}),
        },
        _ENTRY_KEYS,
    ),
    "Node": _obj(
        {
            "id": STR,
            "host": STR,
            "processors": NAMES,
            "active": INT,
            "max_concurrent": INT,
            "last_seen": TIME | {"description": "its last heartbeat"},
            "online": BOOL | {"description": "false: its heartbeat stopped (lease passed)"},
            "worker": _enum("on", "off", "drained")
            | {"description": "whether it takes jobs: off with queue.worker_enabled = false"},
        }
    ),
    "QueueStatus": _obj(
        {
            "active_count": INT,
            "max_concurrent": INT,
            "effective_concurrency": INT,
            "dynamic_concurrency": BOOL,
            "pending_count": INT,
            "retrying_count": INT,
            "paused": BOOL,
            "queue": _arr(_ref("QueueEntry")),
            "statistics": _obj(
                {
                    "total_processed": INT,
                    "total_failed": INT,
                    "total_partial": INT,
                    "total_cancelled": INT,
                    "average_time": _null(NUM | {"description": "seconds per finished job"}),
                }
            ),
            "resources": _obj(
                {"cpu_percent": _null(NUM), "memory_percent": _null(NUM), "gpu_percent": _null(NUM)}
            ),
            "nodes": _arr(_ref("Node") | {"description": "only with a shared PostgreSQL queue"}),
            "models": _arr(_ref("ModelPull")),
            "warnings": _arr(STR | {"description": "e.g. a watched folder that does not exist"}),
            "disk": _arr(
                _obj(
                    {"folder": STR, "free_mb": INT, "total_mb": INT, "min_free_mb": NUM},
                    "*",
                )
                | {"description": "free space of each disk the service writes to"}
            ),
            "last_backup": _null(
                _obj({"folder": STR, "created_at": TIME, "scheduled": BOOL}, "*")
                | {"description": "the newest complete backup in <data_dir>/backups"}
            ),
            "drained": BOOL
            | {"description": "the node answering is drained: it starts no job (POST /node/drain)"},
            "worker_enabled": BOOL
            | {"description": "false: the node answering runs no jobs (queue.worker_enabled)"},
            "shown_count": INT
            | {"description": "the waiting jobs that ?status and ?folder select, for paging"},
            "drop_folders": _arr(STR | {"description": "the folders the node answering watches"}),
            "upload_address": _null(STR | {"description": "where uploaders reach them"}),
        },
        "active_count max_concurrent effective_concurrency dynamic_concurrency pending_count"
        " paused queue statistics resources",
    ),
    "ProcessorRun": _obj(
        {
            "status": _enum("pending", "running", "completed", "failed", "skipped"),
            "attempts": INT,
            "progress": PCT,
            "current": INT,
            "total": INT,
            "output_path": STR,
            "started_at": TIME,
            "completed_at": TIME,
            "error": STR,
            "reason": STR,
            "backend": STR,
            "model": STR,
            "last_checkpoint": _obj({"frame": INT, "timestamp": NUM}),
        },
        "status",
    ),
    "JobSummary": _obj(
        _ENTRY
        | {
            "progress": PCT,
            "completed": NAMES,
            "failed": NAMES,
            "created_at": TIME,
            "error": _null(
                STR | {"description": "failed, partial and cancelled jobs only: why it ended"}
            ),
            "resolved_by": _null(
                TASK_ID | {"description": "a later job of the file that completed"}
            ),
        },
        f"{_ENTRY_KEYS} progress completed failed created_at",
    ),
    "JobDetail": _obj(
        _ENTRY
        | {
            "position": _null({"type": "integer", "minimum": 1}),
            "estimated_start": TIME,
            "stranded": _null(STR | {"description": "a waiting job no live node can run: why"}),
            "progress": PCT,
            "estimated_end": TIME | {"description": "when a running job should end"},
            "retry_count": INT,
            "max_retries": INT,
            "task_timeout": _null(NUM | {"description": "seconds; null: queue.task_timeout"}),
            "not_before": TIME,
            "crash_count": INT,
            "cancel_requested": BOOL,
            "node": _null(STR),
            "next_attempt_at": TIME,
            "options": {"type": "object", "additionalProperties": True},
            "processors": {"type": "object", "additionalProperties": _ref("ProcessorRun")},
            "created_at": TIME,
            "queued_at": TIME,
            "started_at": TIME,
            "completed_at": TIME,
            "error_message": _null(STR),
        },
        "*",
    ),
    "DeadJob": _obj(
        _ENTRY
        | {
            "retry_count": INT,
            "completed_at": TIME,
            "error_message": _null(STR),
            "failed": {
                "type": "object",
                "additionalProperties": _obj({"error": _null(STR), "attempts": INT}),
            },
        },
        "*",
    ),
    "FileSummary": _obj(_FILE, "*"),
    "FileDetail": _obj(
        _FILE
        | {
            "duration": _null(NUM),
            "width": _null(INT),
            "height": _null(INT),
            "fps": _null(NUM),
            "video_codec": _null(STR),
            "audio_codec": _null(STR),
            "hdr": _null(_enum("pq", "hlg")) | {"enum": ["pq", "hlg", None]},  # null: SDR
            "sample_aspect_ratio": _null(
                STR | {"pattern": "^[0-9]+:[0-9]+$", "example": "64:45"}
            ),  # null: square pixels
            "mirrored": _null(BOOL),  # null: probed before the field existed, or not at all
            "fingerprint": _null(STR),
            "registered_at": TIME,
            "jobs": _arr(
                _obj({"task_id": TASK_ID, "status": _ref("JobStatus"), "created_at": TIME}, "*")
            ),
            "results": {  # by processor: what its results route serves, of its run
                "type": "object",
                "additionalProperties": _obj(
                    _RUN_OF_RESULT
                    | {
                        "output_path": STR,
                        "later_run": _null(_obj(_RUN_OF_RESULT, "*")),  # as LaterRun
                    },
                    "*",
                ),
            },
        },
        "*",
    ),
    # A newer run of a processor that failed or was cancelled beside its complete result.
    "LaterRun": _obj(_RUN_OF_RESULT, "*"),
    "SearchHit": _obj(
        {
            "file": _obj({"file_uuid": FILE_UUID, "name": STR, "folder": STR}, "*"),
            "processor": _enum("asr", "asrx", "ocr", "yolo", "name"),
            "start": _null(NUM),  # seconds; null for a file found by its name
            "end": _null(NUM),
            "text": STR,
            "snippet": _arr(_obj({"text": STR, "match": BOOL}, "*")),
            "score": _null(NUM),
            "thumbnail_url": _null(STR),  # the keyframe of the scene the moment starts in
        },
        "*",
    ),
    "SearchResults": _obj(
        {
            "query": STR,
            "hits": _arr(_ref("SearchHit")),
            "total": INT,
            "total_exact": BOOL,  # false: at least total (ranked among the newest matches)
            "limit": INT,
            "offset": INT,
            "mode": _enum("words", "meaning"),
            "index": _obj({"complete": BOOL, "waiting": INT}, "*"),
        },
        "*",
    ),
    "ProcessorInfo": _obj(
        {
            "backend": {"type": "string", "example": "faster-whisper"},
            "model": _null(STR),
            "version": _null(STR),
            "ready": BOOL,
            "reason": _null(STR),
            "loaded": {
                "type": "integer",
                "description": "instances holding a loaded model in this process now",
            },
            "pull": _ref("ModelPull") | {"description": "only while its model is pulled at start"},
        },
        "backend model version ready reason",
    ),
    "ModelPull": _obj(  # a model pulled at start ([models] auto_pull)
        {
            "model": STR,
            "state": _enum("queued", "pulling", "ready", "failed"),
            "done": {"type": "integer", "description": "bytes"},
            "total": _null(INT),
            "percent": _null(PCT),
            "error": _null(STR),
            "retry_at": TIME,
        },
        "*",
    ),
    "DeepScanRequest": _obj(_SCAN) | {"additionalProperties": False},
    "PriorityRequest": _obj({"priority": _ref("Priority")}, "*"),
    "FolderRequest": _obj(
        {
            "folder": STR
            | {"description": "as the file list names it, with its subfolders; '.': all"}
        }
    )
    | {"additionalProperties": False},
    "ForgetRequest": _obj({"delete_source": BOOL}) | {"additionalProperties": False},
    "ConcurrencyRequest": _obj(  # either key, or both
        {"max_concurrent": {"type": "integer", "minimum": 1}, "dynamic_concurrency": BOOL}
    )
    | {"minProperties": 1},
    "RegisterRequest": _obj(
        {
            "path": {"type": "string", "minLength": 1},
            "upload_status": {"type": "integer", "default": 1, "description": "not 1: rejected"},
            "scan": {"type": "boolean", "default": True},
        }
        | _SCAN,
        "path",
    ),
    "SftpgoEvent": _obj(  # SFTPGo's own hook payload; its other fields are accepted and unused
        {
            "action": {"type": "string", "example": "upload", "description": "not upload: ignored"},
            "username": STR,
            "path": {"type": "string", "description": "the file's full filesystem path"},
            "virtual_path": {"type": "string", "description": "the path the SFTP user sees"},
            "file_size": INT,
            "status": {
                "type": "integer",
                "description": "1 ok; 2 error, 3 quota exceeded: rejected",
            },
            "timestamp": {"type": "integer", "description": "the event's time, ns since the epoch"},
            "elapsed": {"type": "integer", "description": "the upload's duration, milliseconds"},
        },
        "action",
    ),
}

_QUEUED = _ok(task_id=TASK_ID, status=STR, position=_null(INT), estimated_start=TIME)
_QUEUED["properties"]["deduplicated"] = BOOL | {
    "description": "true: an active job of this file already runs these processors, or the "
    "waiting one took on those it lacked; that job is returned"
}
_REGISTERED = _ok(
    file_uuid=FILE_UUID,
    state=STR,
    reason=_null(STR),
    task_id=_null(TASK_ID),
    position=_null(INT),
    deduplicated=BOOL,
)
_IGNORED = _ok(ignored={"type": "boolean", "enum": [True]}, reason=STR)
_RESCANNED = _ok(
    new=INT | {"description": "files registered for the first time"},
    changed=INT | {"description": "known files re-registered: new content, or back on disk"},
    missing=INT | {"description": "known files now gone from disk"},
    unchanged=INT | {"description": "known files unchanged: same stat, or read and same content"},
    settling=INT | {"description": "written too recently; registered once settled"},
    ignored=INT | {"description": "files of a kind not taken, listed with state ignored"},
)
_PAGING = ("limit", "offset")
_CANCELLED = _ok(message=_enum("Task cancelled"), status=_enum("cancelled", "cancelling"))

ERRORS = {
    "400": ("BadRequest", "a malformed request (bad_request)"),
    "401": ("Unauthorized", "missing or wrong bearer token (unauthorized)"),
    "404": ("NotFound", "no such job, file or processor output (not_found)"),
    "409": (
        "Conflict",
        "the job's status does not allow this; or a search by meaning on a node without"
        " its sentence model, the message the commands that put it in place (conflict)",
    ),
    "413": ("PayloadTooLarge", "the body is larger than 1 MiB (payload_too_large)"),
    "503": ("Busy", "too many event streams are open; try again later (busy)"),
}


def _param(name: str, where: str, schema: Schema, text: str) -> Schema:
    return {"name": name, "in": where, "required": where == "path", "schema": schema} | (
        {"description": text} if text else {}
    )


PARAMETERS = {
    name: _param(name, where, schema, text)
    for name, where, schema, text in (
        (
            "file_uuid",
            "path",
            {"type": "string", "pattern": f"^{HEX32}$|^{DASHED_UUID}$"},
            "a file's file_uuid (also taken in the dashed form 8-4-4-4-12)",
        ),
        ("task_id", "path", TASK_ID, "a job's task_id"),
        ("job", "path", STR, "a job's task_id, integer id, or file_uuid (its newest job)"),
        (
            "processor",
            "path",
            STR,
            "a processor name, e.g. asr; for subtitles also one source's: asr.track1, "
            "asr.track0.left",
        ),
        ("index", "path", INT | {"minimum": 0}, "a scene's index in cut's result"),
        ("limit", "query", INT | {"minimum": 1, "maximum": 1000, "default": 50}, ""),
        ("offset", "query", INT | {"minimum": 0, "default": 0}, ""),
        ("status", "query", STR, "comma-separated job statuses, e.g. failed,partial"),
        ("state", "query", STR, "comma-separated file states: present, missing, rejected, ignored"),
        (
            "name",
            "query",
            STR | {"maxLength": 1000},
            "a part of the file name, in any case, with or without accents",
        ),
        ("q", "query", STR | {"maxLength": 1000}, 'words, "a phrase", a prefix*'),
        (
            "mode",
            "query",
            _enum("words", "meaning"),
            "words (default): the words typed, their forms, phrases, prefixes; meaning: moments"
            " whose sense is near the query's, by a sentence model",
        ),
        ("source", "query", _enum("asr", "asrx", "ocr", "yolo", "name"), "where the words are"),
        ("folder", "query", STR, "a folder of the drop folder: its files and those below"),
        ("file", "query", FILE_UUID, "one file's file_uuid"),
        # ISO 8601, a date alone too (2026-01-01, as docs/api.md shows): not RFC 3339's
        # date-time, which wants a time and a zone.
        ("since", "query", STR, "files registered from then on (ISO 8601; UTC without a zone)"),
        ("until", "query", STR, "files registered before then (ISO 8601; UTC without a zone)"),
        ("asset", "path", STR, "one of the console's files: app.js, app.css"),
        ("format", "path", _enum("srt", "vtt"), "the subtitle format"),
    )
}


def _json(schema: Schema, description: str = "OK") -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _text(media: str, description: str) -> Schema:
    return {"description": description, "content": {media: {"schema": STR}}}


def _op(
    op_id: str,
    summary: str,
    ok: Schema,
    errors: str = "",
    *,
    query: tuple[str, ...] = (),
    body: str | None = None,
    status: str = "200",
    more: dict[str, Schema] | None = None,
) -> Schema:
    """One operation. ``ok`` is a schema or a whole response; ``errors`` e.g. "404 409".

    Path parameters come from the path (see openapi_document); a body adds 400 and 413.
    """
    op: Schema = {"operationId": op_id, "summary": summary, "parameters": list(query)}
    if body:
        op["requestBody"] = {"content": {"application/json": {"schema": _ref(body)}}}
        errors += " 400 413"
    op["responses"] = {status: ok if "content" in ok else _json(ok)} | (more or {})
    for code in sorted(set(errors.split())):
        op["responses"][code] = _ref(ERRORS[code][0], "responses")
    return op


def _list(key: str, item: str) -> Schema:
    return _obj({key: _arr(_ref(item)), "total": INT}, "*")


_CHANGED = "404 409"
OPERATIONS: dict[str, Schema] = {  # "method path": operation, one per route in http/app.py
    "get /healthz": _op(
        "healthz",
        "Liveness and version; to a loopback client also whose service it is",
        _obj({"status": _enum("ok"), "version": STR, "account": STR, "data_dir": STR}),
    ),
    "get /openapi.json": _op("openapi", "This OpenAPI document", {"type": "object"}),
    "get /metrics": _op("metrics", "Prometheus metrics", _text("text/plain", "Prometheus text")),
    "get /api/v1/processors": _op(
        "processors",
        "Processors, their backends and readiness",
        _obj({"processors": {"type": "object", "additionalProperties": _ref("ProcessorInfo")}}),
    ),
    "get /api/v1/events": _op(
        "events",
        "Server-Sent Events: one data line per job or queue change",
        _text("text/event-stream", "event stream"),
        "503",
    ),
    "post /api/v1/file/{file_uuid}/deep-scan": _op(
        "deep_scan",
        "Queue a deep scan of a file",
        _json(_QUEUED, "queued"),
        "404 409",  # 409: an active job runs part of it with settings it cannot share
        body="DeepScanRequest",
        status="202",
        more={"200": _json(_QUEUED, "an active job of this file covers it (deduplicated)")},
    ),
    "get /": _op("console", "The web console", _text("text/html", "the console's page")),
    "get /console/static/{asset}": _op(
        "console_asset",
        "A file of the web console's page",
        {
            "description": "the script or the style sheet",
            "content": {"text/javascript": {"schema": STR}, "text/css": {"schema": STR}},
        },
        "404",
    ),
    "get /api/v1/queue/status": _op(
        "queue_status",
        "Queue state: the running jobs and a page of the waiting ones, with counts",
        _ref("QueueStatus"),
        "400 404",  # limit or offset out of range; a folder no known file is in
        query=("status", "folder", *_PAGING),
    ),
    "post /api/v1/queue/pause": _op("pause", "Pause the queue", _ok(paused=BOOL)),
    "post /api/v1/queue/resume": _op("resume", "Resume the queue", _ok(paused=BOOL)),
    "post /api/v1/queue/clear": _op(
        "clear",
        "Cancel all pending/retrying jobs, or those of a folder",
        _ok(cleared=INT),
        "404",  # no known file in that folder
        body="FolderRequest",
    ),
    "post /api/v1/node/drain": _op(
        "drain",
        "Drain the node answering: its running jobs finish, it starts no new one",
        _ok(node=STR, drained=BOOL, running=INT),
    ),
    "delete /api/v1/node/drain": _op(
        "undrain",
        "Undo a drain: the node answering starts jobs again",
        _ok(node=STR, drained=BOOL, running=INT),
    ),
    "post /api/v1/queue/retry": _op(
        "retry_failed",
        "Re-queue every failed and partial job (not resolved later), or those of a folder",
        _ok(
            retried=INT,
            task_ids=_arr(TASK_ID),
            refused=_arr(_obj({"task_id": TASK_ID, "reason": STR}, "*")),
        ),
        "404",
        body="FolderRequest",
    ),
    "post /api/v1/queue/prioritize/{file_uuid}": _op(
        "prioritize",
        "Move a file's waiting job to position 1",
        _ok(task_id=TASK_ID, position=INT),
        _CHANGED,
    ),
    "put /api/v1/queue/task/{task_id}/priority": _op(
        "set_priority",
        "Change a job's priority",
        _ok(task_id=TASK_ID, position=_null(INT)),
        _CHANGED,
        body="PriorityRequest",
    ),
    "delete /api/v1/queue/task/{task_id}": _op("delete_task", "Cancel a job", _CANCELLED, _CHANGED),
    "put /api/v1/queue/concurrency": _op(
        "concurrency",
        "Set max_concurrent and/or dynamic_concurrency",
        _ok(max_concurrent=INT, dynamic_concurrency=BOOL, effective_concurrency=INT),
        body="ConcurrencyRequest",
    ),
    "get /api/v1/queue/dead": _op(
        "dead",
        "Jobs out of retries, newest first",
        _list("jobs", "DeadJob"),
        "400",
        query=_PAGING,
    ),
    "get /api/v1/jobs": _op(
        "list_jobs",
        "Jobs, newest first",
        _list("jobs", "JobSummary"),
        "400 404",
        query=("status", "folder", *_PAGING),
    ),
    "get /api/v1/jobs/{job}": _op("job_detail", "One job", _ref("JobDetail"), "404"),
    "get /api/v1/jobs/{job}/log": _op(
        "job_log",
        "The log lines about a job, from the answering node's log",
        _obj({"task_id": TASK_ID, "node": STR, "lines": _arr(STR)}, "*"),
        "400 404",
        query=("limit",),
    ),
    "post /api/v1/jobs/{job}/retry": _op(
        "retry",
        "Re-queue what did not complete of a failed, partial or cancelled job",
        _ok(task_id=TASK_ID, status=_ref("JobStatus"), position=_null(INT)),
        _CHANGED,
    ),
    "post /api/v1/jobs/{job}/cancel": _op("cancel", "Cancel a job", _CANCELLED, _CHANGED),
    "post /api/v1/jobs/{job}/dismiss": _op(
        "dismiss",
        "Remove a failed, partial or cancelled job's record (its results stay)",
        _ok(task_id=TASK_ID, dismissed=BOOL),
        _CHANGED,
    ),
    "post /api/v1/files/register": _op(
        "register",
        "Record a file in a watched folder and queue its deep scan",
        _json(_REGISTERED, "registered"),
        "409",  # a failed upload reported while a job runs on the file, or settings clash
        body="RegisterRequest",
        status="201",
        more={"200": _json(_REGISTERED, "already registered and unchanged")},
    ),
    "post /api/v1/hooks/sftpgo": _op(
        "sftpgo_hook",
        "SFTPGo's upload notification as SFTPGo sends it: registers (or rejects) the file",
        _json(_REGISTERED, "registered, or recorded rejected (status other than 1)"),
        "409",  # the file has fewer bytes than file_size (still being written), or as register
        body="SftpgoEvent",
        status="201",
        more={
            "200": _json(
                {"oneOf": [_REGISTERED, _IGNORED]},
                "already registered and unchanged; or ignored (not an upload, or a failed "
                "upload that left no file or left the registered file as it was)",
            )
        },
    ),
    "post /api/v1/files/rescan": _op(
        "rescan",
        "Reconcile the watched folders with the database now",
        _RESCANNED,
    ),
    "get /api/v1/files": _op(
        "list_files",
        "Known files, newest first",
        _list("files", "FileSummary"),
        "400",
        query=("state", "name", *_PAGING),
    ),
    "get /api/v1/search": _op(
        "search",
        "Moments (transcript lines, on-screen text, objects) and files found by words,"
        " or moments found by meaning",
        _ref("SearchResults"),
        "400 409",
        query=("q", "mode", "source", "folder", "file", "since", "until", *_PAGING),
    ),
    "get /api/v1/search.csv": _op(
        "search_csv",
        "The same search's hits as CSV (file, folder, file_uuid, source, start, end, time)",
        _text("text/csv", "one row a hit, after a header row"),
        "400 409",
        query=("q", "mode", "source", "folder", "file", "since", "until", *_PAGING),
    ),
    "get /api/v1/files/{file_uuid}": _op(
        "file_detail", "One file, its media details and jobs", _ref("FileDetail"), "404"
    ),
    "get /api/v1/files/{file_uuid}/results/{processor}": _op(
        "results",
        "A processor's last complete JSON output for a file (a newer failed or cancelled"
        " run as later_run)",
        {
            "type": "object",
            "properties": {"later_run": _ref("LaterRun")},
            "additionalProperties": True,
        },
        "404",
    ),
    "get /api/v1/files/{file_uuid}/results/{processor}.{format}": _op(
        "subtitles",
        "asr's or asrx's subtitles, SRT or WebVTT: all, or one track's (or channel's)",
        {
            "description": "the subtitle file (Content-Disposition: attachment)",
            "content": {"application/x-subrip": {"schema": STR}, "text/vtt": {"schema": STR}},
        },
        "404",
    ),
    "post /api/v1/files/{file_uuid}/forget": _op(
        "forget",
        "Forget a file: cancel its jobs, remove its results, rows and log lines; name the "
        "backups that still hold it",
        _ok(
            file_uuid=FILE_UUID,
            jobs=_arr(TASK_ID),
            results_removed=_arr(STR),
            source_removed=BOOL,
            log_lines_removed=INT,
            backups=_arr(STR),
        ),
        # 409: the file is still in the watched folder (without delete_source), or one of
        # its jobs has not stopped yet
        _CHANGED,
        body="ForgetRequest",
    ),
    "get /api/v1/files/{file_uuid}/thumbnails/{index}": _op(
        "thumbnail",
        "The JPEG keyframe of one scene that cut found",
        {"description": "the scene's middle frame", "content": {"image/jpeg": {"schema": STR}}},
        "404",
    ),
}


def openapi_document(version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route, operation in copy.deepcopy(OPERATIONS).items():
        method, path = route.split(" ")
        names = [*re.findall(r"{(\w+)}", path), *operation.pop("parameters")]
        if names:
            operation["parameters"] = [_ref(name, "parameters") for name in names]
        if path.startswith("/api/"):
            operation["security"] = [{"bearerAuth": []}]
            operation["responses"]["401"] = _ref("Unauthorized", "responses")
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "momentry-edge",
            "version": version,
            "description": "Edge video-ingest service: files, deep-scan queue and jobs.",
        },
        "paths": paths,
        "components": copy.deepcopy(
            {
                "schemas": SCHEMAS,
                "parameters": PARAMETERS,
                "responses": {name: _json(_ref("Error"), text) for name, text in ERRORS.values()},
                "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            }
        ),
    }
