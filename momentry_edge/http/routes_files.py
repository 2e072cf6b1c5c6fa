"""Routes of files: register (and the SFTPGo hook), rescan, list, detail, results, thumbnails,
forget."""

from __future__ import annotations

from typing import Any

import bottle
from bottle import response

from .. import forget, jobs, outputs, stored_results
from ..errors import Invalid, NotFound
from ..ingest import upload_hooks
from ..jobs import views
from ..store import FileState
from .core import Core
from .parsing import (
    csv_query,
    json_body,
    media_file,
    not_at,
    paging,
    register_fields,
    text_query,
)


def add(app: bottle.Bottle, service: Core) -> None:
    @app.post("/api/v1/files/register")
    def register() -> dict:
        body = json_body(required=True)
        raw = body.get("path")
        if not isinstance(raw, str) or not raw:
            raise Invalid("path is required" if raw is None else "path must be a non-empty string")
        fields = register_fields(body)
        not_at(service.url, fields["options"])
        record, job, created = service.register(raw, **fields)
        response.status = 201 if created else 200
        reply = {
            "success": True,
            "file_uuid": record.file_uuid,
            "state": record.state,
            "reason": record.reason,
            "task_id": None,
            "position": None,
            # Not created: the same unchanged file was registered before; its job is returned.
            "deduplicated": job is not None and not created,
        }
        if job is not None:
            reply |= {"task_id": job.task_id, "position": jobs.position(job)}
        return reply

    @app.post("/api/v1/hooks/sftpgo")
    def sftpgo_hook() -> dict:
        upload = upload_hooks.sftpgo_upload(json_body(required=True), service.config.service.watch)
        if upload is None:
            return {"success": True, "ignored": True, "reason": "not an upload"}
        if not upload.ok and not upload.path.exists():
            # SFTPGo removes what a failed (e.g. over-quota) upload left: nothing to record.
            return {"success": True, "ignored": True, "reason": "the failed upload left no file"}
        if (kept := upload_hooks.untouched(upload)) is not None:
            # SFTPGo's atomic upload mode: the failed one never replaced the file.
            reason = f"the failed upload left {kept.name} as it was registered: nothing changed"
            return {"success": True, "ignored": True, "reason": reason}
        record, job, created = service.register(str(upload.path), upload_ok=upload.ok)
        response.status = 201 if created else 200
        return {
            "success": True,
            "file_uuid": record.file_uuid,
            "state": record.state,
            "reason": record.reason,
            "task_id": job.task_id if job else None,
            "position": jobs.position(job) if job else None,
            "deduplicated": job is not None and not created,
        }

    @app.post("/api/v1/files/rescan")
    def rescan() -> dict:
        return {"success": True, **service.rescan()}

    @app.get("/api/v1/files")
    def list_files() -> dict:
        states = csv_query("state", set(FileState))
        limit, offset = paging()
        return views.list_files(states, limit, offset, text_query("name"))

    @app.get("/api/v1/files/<file_uuid>")
    def file_detail(file_uuid: str) -> dict:
        record = media_file(file_uuid)
        names = sorted(service.processor_names)
        summary = stored_results.summary(record, names)
        if missing := [name for name in names if name not in summary]:  # results from before
            folders = outputs.result_folders(service.config.data_dir, record)
            summary |= outputs.results_summary(folders, missing, record.fingerprint)
        return views.file_detail(record) | {"results": dict(sorted(summary.items()))}

    @app.get("/api/v1/files/<file_uuid>/results/<processor>")
    def results(file_uuid: str, processor: str) -> Any:
        record = media_file(file_uuid)
        if processor not in service.processor_names:
            raise NotFound(f"unknown processor {processor!r}")
        document = stored_results.read_document(record, processor)
        if document is None:  # a result written before the database kept them
            folders = outputs.result_folders(service.config.data_dir, record)
            document = outputs.read_result(folders, processor, record.fingerprint)
        if document is None:
            raise NotFound(f"{processor} has no output for file {file_uuid} yet")
        response.content_type = "application/json"
        return document

    @app.post("/api/v1/files/<file_uuid>/forget")
    def forget_file(file_uuid: str) -> dict:
        record = media_file(file_uuid)
        body = json_body()
        if set(body) - {"delete_source"}:
            raise Invalid(f"unknown field {sorted(set(body) - {'delete_source'})[0]!r}")
        delete_source = body.get("delete_source", False)
        if not isinstance(delete_source, bool):
            raise Invalid("delete_source must be true or false")
        done = forget.forget(
            service.config.data_dir,
            record,
            delete_source=delete_source,
            stopping=service.stopping.is_set,
            in_hand=service.jobs_in_hand,
        )
        return done.as_dict()

    @app.get("/api/v1/files/<file_uuid>/thumbnails/<index>")
    def thumbnail(file_uuid: str, index: str) -> Any:
        record = media_file(file_uuid)
        picture = stored_results.scene_thumbnail(record, index)
        if picture is None:  # a result written before the database kept them
            folders = outputs.result_folders(service.config.data_dir, record)
            picture = outputs.scene_thumbnail(folders, index)
        if picture is None:
            raise NotFound(f"file {file_uuid} has no thumbnail for scene {index!r}")
        response.content_type = "image/jpeg"
        return picture
