"""Routes of jobs: list, detail, retry, cancel."""

from __future__ import annotations

import bottle

from .. import jobs, logs, store
from ..jobs import folders, views
from .core import Core
from .parsing import (
    csv_query,
    paging,
)
from .routes_queue import cancel_job


def add(app: bottle.Bottle, service: Core) -> None:
    @app.get("/api/v1/jobs")
    def list_jobs() -> dict:
        statuses = csv_query("status", {*store.FINAL_STATES, *store.ACTIVE_STATES})
        folder = folders.parse(bottle.request.query.getunicode("folder"))
        folders.check_known(folder)
        limit, offset = paging()
        files = None if folder is None else folders.files_in(folder)
        return views.list_jobs(statuses, limit, offset, files)

    @app.get("/api/v1/jobs/<job>")
    def job_detail(job: str) -> dict:
        return views.job_detail(jobs.find_job(job), service.here())

    @app.get("/api/v1/jobs/<job>/log")
    def job_log(job: str) -> dict:
        found = jobs.find_job(job)
        limit, _ = paging()
        folder = service.config.data_dir / "logs"
        others = jobs.other_nodes_log(found.id, service.node)  # nodes share no disk
        lines = logs.job_lines(folder, found.task_id, limit, others)
        return {"task_id": found.task_id, "node": service.node, "lines": lines}

    @app.post("/api/v1/jobs/<job>/retry")
    def retry(job: str) -> dict:
        retried = jobs.retry(jobs.find_job(job))
        return {
            "success": True,
            "task_id": retried.task_id,
            "status": retried.status,
            "position": jobs.position(retried),
        }

    @app.post("/api/v1/jobs/<job>/cancel")
    def cancel(job: str) -> dict:
        return cancel_job(job)
