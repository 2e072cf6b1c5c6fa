"""Each job's log lines in the queue database (JobLog), so that a job's log reads alike on
every node, also once the node that ran it is off: nodes share the database, not a disk.

Chosen over asking the node that ran the job for its log file: that node may be off
(the case that matters most, a node that died with the job), and nodes know no address of
each other. A node keeps its lines about a job (logs.JobLines holds them as they are
logged; the main loop writes them here every second), its last JOB_LOG_BYTES; the rows go
with their job (foreign key, cascade). Only on PostgreSQL: a SQLite queue has one node,
whose own log file holds every line.
"""

from __future__ import annotations

import time

from .. import store
from ..logs import JOB_LOG_BYTES, JobLines
from ..store import Job, JobLog


def keep_log(held: JobLines, node: str) -> int:
    """Write the lines ``held`` has taken to this node's rows of their jobs; returns how
    many. Lines of a job no longer in the table are dropped; when the database fails, the
    rest go back to ``held`` for the next call."""
    taken = held.take()
    if not taken or not store.is_postgres(Job._meta.database):
        return 0
    kept = 0
    tasks = list(taken)
    try:
        found = Job.select(Job.task_id, Job.id).where(Job.task_id.in_(tasks))
        ids: dict[str, int] = {job.task_id: job.id for job in found}
        for task in tasks:
            if task in ids:
                _append(ids[task], node, taken[task])
                kept += len(taken[task])
            del taken[task]
    except store.OUTAGE_ERRORS:
        held.put_back(taken)  # said by what else fails meanwhile, not by each second here
    return kept


def _append(job_id: int, node: str, lines: list[str]) -> None:
    added = "".join(f"{line}\n" for line in lines)
    database = Job._meta.database
    with database.atomic():
        row = JobLog.select().where(JobLog.job == job_id, JobLog.node == node).for_update().first()
        text = (row.lines if row else "") + added
        if len(text) > JOB_LOG_BYTES:  # the last whole lines within the bound
            cut = text.find("\n", len(text) - JOB_LOG_BYTES)
            text = text[cut + 1 :]
        if row is None:
            JobLog.insert(job=job_id, node=node, lines=text, updated_at=time.time()).on_conflict(
                conflict_target=[JobLog.job, JobLog.node],
                update={JobLog.lines: text, JobLog.updated_at: time.time()},
            ).execute()
        else:
            JobLog.update(lines=text, updated_at=time.time()).where(JobLog.id == row.id).execute()


def other_nodes_log(job_id: int, node: str) -> list[str]:
    """The JSON lines the other nodes kept about the job (this node's are in its log file)."""
    rows = JobLog.select(JobLog.lines).where(JobLog.job == job_id, JobLog.node != node)
    return [line for row in rows for line in row.lines.splitlines() if line]
