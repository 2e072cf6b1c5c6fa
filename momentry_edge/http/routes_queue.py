"""Routes of the queue: deep scans, pause and resume, clear, priority, concurrency, dead jobs."""

from __future__ import annotations

import logging

import bottle
from bottle import response

from .. import jobs, store
from ..errors import Invalid
from ..jobs import folders, order, views
from ..store import FileState, JobStatus
from .core import Core
from .openapi import DEEP_SCAN_KEYS
from .parsing import (
    csv_query,
    interface,
    json_body,
    media_file,
    not_at,
    paging,
    scan_options,
)

log = logging.getLogger(__name__)


def add(app: bottle.Bottle, service: Core) -> None:
    @app.post("/api/v1/file/<file_uuid>/deep-scan")
    def deep_scan(file_uuid: str) -> dict:
        body = json_body()
        if unknown := sorted(set(body) - DEEP_SCAN_KEYS):
            # A misspelt key (say "priorty") would otherwise be queued as if not asked.
            raise Invalid(f"unknown key {unknown[0]!r}; known: {', '.join(sorted(DEEP_SCAN_KEYS))}")
        record = media_file(file_uuid)
        if record.state != FileState.PRESENT:
            raise Invalid(f"file {file_uuid} is {record.state}: {record.reason or 'not on disk'}")
        job, created = service.submit(
            record,
            body.get("processors", list(service.config.ingest.processors)),
            body.get("priority", "normal"),
            options=not_at(service.url, scan_options(body)),
        )
        response.status = 202 if created else 200
        return queued(service, job) | {"deduplicated": not created}

    @app.get("/api/v1/queue/status")
    def queue_status() -> dict:
        return service.queue_status(*paging(), shown=waiting_shown())

    @app.post("/api/v1/queue/pause")
    def pause() -> dict:
        return {"success": True, "paused": jobs.set_paused(True).paused}

    @app.post("/api/v1/queue/resume")
    def resume() -> dict:
        state = jobs.set_paused(False)
        return {"success": True, "paused": state.paused}

    @app.post("/api/v1/queue/clear")
    def clear() -> dict:
        folder = folder_body()
        cleared = folders.cancel_waiting(folder)
        where = f" in folder {folder!r}" if folder else ""
        log.info(
            "queue cleared through %s: %d waiting job(s)%s cancelled", interface(), cleared, where
        )
        return {"success": True, "cleared": cleared}

    @app.post("/api/v1/queue/retry")
    def retry_failed() -> dict:
        folder = folder_body()
        done = folders.retry_failed(folder)
        where = f" in folder {folder!r}" if folder else ""
        log.info(
            "failed jobs%s retried through %s: %d back in line, %d refused",
            where,
            interface(),
            done["retried"],
            len(done["refused"]),
        )
        return {"success": True, **done}

    @app.post("/api/v1/queue/prioritize/<file_uuid>")
    def prioritize(file_uuid: str) -> dict:
        job = jobs.prioritize(jobs.waiting_job(media_file(file_uuid).file_uuid))
        return {"success": True, "task_id": job.task_id, "position": jobs.position(job)}

    @app.put("/api/v1/queue/task/<task_id>/priority")
    def set_priority(task_id: str) -> dict:
        body = json_body(required=True)
        job = jobs.set_priority(jobs.find_job(task_id), jobs.parse_priority(body.get("priority")))
        return {"success": True, "task_id": job.task_id, "position": jobs.position(job)}

    @app.delete("/api/v1/queue/task/<task_id>")
    def delete_task(task_id: str) -> dict:
        return cancel_job(task_id)

    @app.put("/api/v1/queue/concurrency")
    def concurrency() -> dict:
        body = json_body(required=True)
        if "max_concurrent" not in body and "dynamic_concurrency" not in body:
            raise Invalid("give max_concurrent and/or dynamic_concurrency")
        state = jobs.set_concurrency(
            body.get("max_concurrent"),
            body.get("dynamic_concurrency"),
            ceiling=service.config.queue.worker_threads,
            node=service.node,  # this node's: machines sharing a queue differ
        )
        return {
            "success": True,
            "max_concurrent": state.max_concurrent,
            "dynamic_concurrency": state.dynamic_concurrency,
            "effective_concurrency": service.effective_limit(),
        }

    @app.post("/api/v1/node/drain")
    def drain() -> dict:
        running = service.drain(True, interface())
        return {"success": True, "node": service.node, "drained": True, "running": running}

    @app.delete("/api/v1/node/drain")
    def undrain() -> dict:
        running = service.drain(False, interface())
        return {"success": True, "node": service.node, "drained": False, "running": running}

    @app.get("/api/v1/queue/dead")
    def dead() -> dict:
        limit, offset = paging()
        return views.dead_jobs(limit, offset)


def waiting_shown() -> order.Shown:
    """The waiting jobs a status page lists: ``?status=pending,retrying`` and ``?folder=``
    (as the file list names folders; its subfolders too)."""
    statuses = csv_query("status", {JobStatus.PENDING, JobStatus.RETRYING})
    folder = folders.parse(bottle.request.query.getunicode("folder"))
    folders.check_known(folder)
    return order.Shown(
        tuple(statuses) or order.EVERY_WAITING_JOB.statuses,
        None if folder is None else folders.files_in(folder),
    )


def folder_body() -> str | None:
    """The folder a bulk action is limited to (body ``{"folder": "..."}``), None for all."""
    body = json_body()
    if unknown := sorted(set(body) - {"folder"}):
        raise Invalid(f"unknown key {unknown[0]!r}; known: folder")
    if "folder" in body and body["folder"] is None:  # a folder, or the key left out: all
        raise Invalid("folder must be a string: a folder as the file list names it, e.g. 'day 1'")
    return folders.parse(body.get("folder"))


def cancel_job(ref: str) -> dict:
    """Cancel a job (DELETE /api/v1/queue/task/..., POST /api/v1/jobs/.../cancel)."""
    job = jobs.find_job(ref)
    was = jobs.cancel(job)
    # A running job stops at its next report; "status" tells the two cases apart.
    status = "cancelling" if was == JobStatus.PROCESSING else JobStatus.CANCELLED
    log.info(
        "job %s (%s, was %s) cancelled through %s",
        job.task_id,
        job.file.name,
        was,
        interface(),
        extra={"task_id": job.task_id},
    )
    return {"success": True, "message": "Task cancelled", "status": status}


def queued(service: Core, job: store.Job) -> dict:
    job, position, estimated_start = views.queue_place(job.id, service.here())
    return {
        "success": True,
        "task_id": job.task_id,
        "status": "queued" if job.status == JobStatus.PENDING else job.status,
        "position": position,
        "estimated_start": estimated_start,
    }
