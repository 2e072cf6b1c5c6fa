"""What the jobs modules share: the lease error, the retry policy, priorities, finding a job."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import clock, store
from ..errors import Invalid, NotFound
from ..store import Job, MediaFile


class LeaseLost(Exception):
    """This worker no longer holds the job (the reaper gave it away)."""


@dataclass(frozen=True)
class RetryPolicy:
    retry_delay: float
    max_crashes: int
    lease_seconds: float


def _now(now: float | None) -> float:
    return clock.now() if now is None else now


def _seq(now: float) -> int:
    return int(now * 1e9)


def parse_priority(value: Any) -> int:
    if not isinstance(value, str) or value not in store.PRIORITIES:
        raise Invalid(f"priority must be one of low, normal, high; got {value!r}")
    return store.PRIORITIES[value]


def file_uuid_of(text: str) -> str | None:
    """A file_uuid as stored (32 lowercase hex digits), from that or the dashed form
    (8-4-4-4-12) people copy from elsewhere; None for any other text."""
    if re.fullmatch(r"[0-9a-fA-F]{32}", text):
        return text.lower()
    if re.fullmatch(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", text):
        return text.replace("-", "").lower()
    return None


def find_job(ref: str | int) -> Job:
    """A job by task_id, integer id, or file_uuid (that file's newest job)."""
    text = str(ref)
    job = None
    # Only ids of the right shape reach the database ("²".isdigit() is true, but not int()).
    if re.fullmatch(r"task_[0-9a-f]{12}", text):
        job = Job.get_or_none(Job.task_id == text)
    elif re.fullmatch(r"[0-9]{1,18}", text):
        job = Job.get_or_none(Job.id == int(text))
    elif file_uuid := file_uuid_of(text):
        job = (
            Job.select()
            .join(MediaFile)
            .where(MediaFile.file_uuid == file_uuid)
            .order_by(Job.id.desc())
            .first()
        )
    if job is None:
        raise NotFound(f"no job {text!r}")
    return job
