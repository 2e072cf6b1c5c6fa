"""The tables (peewee models), their states and JSON fields, and how a file's content is told."""

from __future__ import annotations

import enum
import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import peewee as pw


class JobStatus(enum.StrEnum):
    """A job's status; jobs/ is the only package that changes it."""

    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = (JobStatus.COMPLETED, JobStatus.PARTIAL, JobStatus.FAILED, JobStatus.CANCELLED)


ACTIVE_STATES = (JobStatus.PENDING, JobStatus.PROCESSING, JobStatus.RETRYING)


class RunStatus(enum.StrEnum):
    """One processor run's status within its job."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


RUN_DONE = (RunStatus.COMPLETED, RunStatus.SKIPPED)


class FileState(enum.StrEnum):
    """A registered file's state."""

    PRESENT = "present"
    MISSING = "missing"
    REJECTED = "rejected"
    IGNORED = "ignored"  # of a kind not taken ([ingest].extensions): shown, never queued


PRIORITIES = {"low": 0, "normal": 1, "high": 2}


PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}


class NotJSON(ValueError):
    """A value strict JSON cannot carry: NaN or Infinity (strict parsers and PostgreSQL's
    json type refuse them), or one that is no JSON at all (a set, a cycle)."""


def to_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)``, but strict: NotJSON, saying
    why, for what JSON cannot carry."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, **options)
    except ValueError as exc:
        if str(exc).startswith("Out of range float"):
            raise NotJSON("it holds NaN or Infinity, which JSON cannot carry") from None
        raise NotJSON(str(exc)) from None  # a circular reference
    except TypeError as exc:  # e.g. "Object of type set is not JSON serializable"
        raise NotJSON(str(exc)) from None
    except RecursionError:
        raise NotJSON("it is nested too deep to be written") from None
    return utf8(text)


def utf8(text: str) -> str:
    """``text``, or NotJSON if UTF-8 cannot carry it (a lone surrogate such as '\\udc80':
    neither a file nor the database could store the text)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise NotJSON(f"it holds {bad!a}, which UTF-8 cannot carry") from None
    return text


class JSONField(pw.TextField):
    def db_value(self, value: Any) -> str | None:
        return None if value is None else to_json(value)

    def python_value(self, value: str | None) -> Any:
        return None if value is None else json.loads(value)


class BaseModel(pw.Model):
    # peewee's implicit primary key (an AutoField), for models that declare none: a Field
    # on the class (Job.id.in_(...)), an int on a row.
    id: Any

    class Meta:
        legacy_table_names = False


class QueueState(BaseModel):
    """One row: the operator's settings that must survive restarts. On a shared
    PostgreSQL queue the concurrency settings are each node's own (Node.own_*): only
    the pause is the queue's."""

    id = pw.IntegerField(primary_key=True, default=1)
    paused = pw.BooleanField(default=False)
    max_concurrent = pw.IntegerField()
    dynamic_concurrency = pw.BooleanField()
    # The config file's values when these were last taken from it: an edited file
    # wins over an older runtime change, an unchanged file does not undo one.
    config_max_concurrent = pw.IntegerField()
    config_dynamic_concurrency = pw.BooleanField()
    updated_at = pw.DoubleField(default=time.time)
    # This queue's identity, made once: the Redis mirror marks the keys it writes with it,
    # so queues of other machines sharing one Redis keep theirs. Nodes of one PostgreSQL
    # queue share it, as they share its jobs.
    queue_id = pw.CharField(max_length=32, default=lambda: uuid.uuid4().hex)


class MediaFile(BaseModel):
    file_uuid = pw.CharField(max_length=32, unique=True)
    path = pw.TextField(unique=True)  # absolute
    watch_root = pw.TextField()
    rel_path = pw.TextField()
    name = pw.TextField()
    # The name as searches compare it (words.fold: no accents or case, NFC), so
    # that "dia" finds "Día" however it was written; null only before it was filled in.
    folded_name = pw.TextField(null=True)
    size = pw.BigIntegerField(default=0)
    mtime = pw.DoubleField(default=0)
    # With size and mtime, what tells that the file may hold other content since it was
    # read (see ``holds``): the inode (another one when a file is renamed over it) and
    # the ctime (moves on every write, and its uploader cannot set it). Null in records
    # older than these columns until a rescan fills them in.
    inode = pw.BigIntegerField(null=True)  # st_ino as a signed 64-bit number
    ctime = pw.DoubleField(null=True)
    fingerprint = pw.CharField(max_length=80, null=True)
    state = pw.CharField(max_length=16, default=FileState.PRESENT, index=True)
    reason = pw.TextField(null=True)
    # Rejected for a cause that can pass without the file changing (permissions, storage):
    # looked at again at each rescan, register and watcher event instead of recognised.
    transient = pw.BooleanField(default=False)
    # blake2b of the whole content, computed when a result is about to be shared by
    # content (the fingerprint only samples it); cleared whenever the file is re-read.
    content_hash = pw.CharField(max_length=64, null=True)
    duration = pw.DoubleField(null=True)
    width = pw.IntegerField(null=True)
    height = pw.IntegerField(null=True)
    fps = pw.DoubleField(null=True)
    video_codec = pw.CharField(max_length=32, null=True)
    audio_codec = pw.CharField(max_length=32, null=True)
    hdr = pw.CharField(max_length=8, null=True)  # "pq" or "hlg" (MediaInfo.hdr)
    # The stored pixels' width:height ("64:45"), null when square (or not video); width
    # and height are already in square pixels, this says the file was not stored so.
    sample_aspect_ratio = pw.CharField(max_length=24, null=True)
    # Whether a player flips the stored picture (MediaInfo.mirrored); null when not
    # probed, or probed before this column existed (not known, so not said false).
    mirrored = pw.BooleanField(null=True)
    registered_at = pw.DoubleField(default=time.time)
    updated_at = pw.DoubleField(default=time.time)

    def holds(self, st: os.stat_result) -> bool:
        """Whether the file ``st`` describes is still the one read for this record, as far
        as its stat tells (see ``unchanged``)."""
        return unchanged((self.size, self.mtime, self.inode, self.ctime), st)


_FINGERPRINT_SAMPLE = 1 << 20  # bytes hashed at head, middle and tail


def fingerprint(path: Path, size: int) -> str:
    """Size plus a hash of three samples: quick on multi-GB files, changes when content does."""
    digest = hashlib.blake2b(digest_size=16)
    sample = _FINGERPRINT_SAMPLE
    with path.open("rb") as f:
        for offset in sorted({0, max(size // 2 - sample // 2, 0), max(size - sample, 0)}):
            f.seek(offset)
            digest.update(f.read(sample))
    return f"{size}:{digest.hexdigest()}"


def stamp(st: os.stat_result) -> dict[str, Any]:
    """The MediaFile fields a file's stat gives: size, mtime, inode, ctime."""
    inode = st.st_ino - (1 << 64) if st.st_ino >= 1 << 63 else st.st_ino  # fits a BIGINT
    return {"size": st.st_size, "mtime": st.st_mtime, "inode": inode, "ctime": st.st_ctime}


def unchanged(recorded: tuple[int, float, int | None, float | None], st: os.stat_result) -> bool:
    """Whether a file's stat ``st`` still matches the recorded (size, mtime, inode, ctime):
    then it holds the content read for the record, unread. Any change (a chmod or a
    ``touch -a`` moves the ctime too) means only reading it again tells. An inode or
    ctime not recorded yet (a record older than them) is not compared."""
    seen = tuple(stamp(st).values())
    return recorded[:2] == seen[:2] and all(
        known is None or known == now for known, now in zip(recorded[2:], seen[2:], strict=True)
    )


def written(before: os.stat_result, after: os.stat_result) -> bool:
    """Written to, replaced or touched between two looks at one path (to the nanosecond)."""
    return (before.st_size, before.st_mtime_ns, before.st_ino, before.st_ctime_ns) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
        after.st_ctime_ns,
    )


class Job(BaseModel):
    task_id = pw.CharField(max_length=20, unique=True)
    file = pw.ForeignKeyField(MediaFile, backref="jobs", on_delete="CASCADE")
    file_id: Any  # the foreign key's column, as peewee adds it
    runs: Any  # ProcessorRun.job's backref, as peewee adds it
    DoesNotExist: type[Exception]  # as peewee makes it, for each model
    status = pw.CharField(max_length=16, default=JobStatus.PENDING, index=True)
    priority = pw.SmallIntegerField(default=PRIORITIES["normal"])
    seq = pw.BigIntegerField(index=True)  # place in line within a priority (FIFO)
    processors = JSONField()  # list of names, in run order
    # force, retry_on_failure, callback_urls (callback_url: the first of them, as older rows have)
    options = JSONField(default=dict)
    progress = pw.SmallIntegerField(default=0)
    retry_count = pw.IntegerField(default=0)  # automatic retries used
    max_retries = pw.IntegerField()
    crash_count = pw.IntegerField(default=0)  # runs ended by a process crash, not a failure
    cancel_requested = pw.BooleanField(default=False)
    lease_owner = pw.CharField(max_length=120, null=True, index=True)
    lease_until = pw.DoubleField(null=True)
    node = pw.CharField(max_length=120, null=True)
    next_attempt_at = pw.DoubleField(null=True)
    created_at = pw.DoubleField(default=time.time)
    queued_at = pw.DoubleField(default=time.time)
    started_at = pw.DoubleField(null=True)
    completed_at = pw.DoubleField(null=True)
    error_message = pw.TextField(null=True)
    # A job-end callback still owed: when it is due (null: none), and the attempts so far.
    callback_due = pw.DoubleField(null=True, index=True)
    callback_attempts = pw.IntegerField(default=0)
    callback_done = JSONField(null=True)  # callback URLs delivered for the job's current ending
    # Per-job settings a request may give: seconds per run (null: queue.task_timeout), and
    # the time before which the job is not started (null: as soon as its turn comes).
    task_timeout = pw.DoubleField(null=True)
    not_before = pw.DoubleField(null=True)


class ProcessorRun(BaseModel):
    """One processor of one job (the seeds' processor_results)."""

    job = pw.ForeignKeyField(Job, backref="runs", on_delete="CASCADE")
    job_id: Any  # the foreign key's column, as peewee adds it
    processor = pw.CharField(max_length=32)
    position = pw.SmallIntegerField()  # run order within the job
    status = pw.CharField(max_length=16, default=RunStatus.PENDING)
    progress_current = pw.BigIntegerField(default=0)
    progress_total = pw.BigIntegerField(default=0)
    last_checkpoint = JSONField(null=True)
    output_path = pw.TextField(null=True)
    error = pw.TextField(null=True)
    transient = pw.BooleanField(default=True)  # whether the last error may go away on retry
    reason = pw.TextField(null=True)  # why it was skipped
    attempts = pw.IntegerField(default=0)
    backend = pw.CharField(max_length=32, null=True)
    model = pw.CharField(max_length=64, null=True)
    started_at = pw.DoubleField(null=True)
    completed_at = pw.DoubleField(null=True)
    updated_at = pw.DoubleField(default=time.time)

    class Meta:
        indexes = ((("job", "processor"), True),)


class Node(BaseModel):
    """A service process working on this queue; its heartbeat keeps ``last_seen`` fresh."""

    node_id = pw.CharField(max_length=120, primary_key=True)
    host = pw.CharField(max_length=255)
    pid = pw.IntegerField()
    owner = pw.CharField(max_length=120)  # the lease owner id of its current process
    processors = JSONField(default=list)  # the processors it can run (ready here)
    max_concurrent = pw.IntegerField(default=0)  # its effective limit at its last heartbeat
    # Whether it takes jobs: "on"; "drained" (until undone: it comes back); "off"
    # (queue.worker_enabled = false: it serves the API only). What the waiting line is
    # told when no live node can run a job (jobs/capacity.py).
    worker = pw.CharField(max_length=16, default="on")
    # On a shared PostgreSQL queue, its own concurrency settings, as QueueState's are on
    # SQLite (machines differ), with its config file's values when last taken from it.
    # Null on SQLite, and until the node's first start with them.
    own_max_concurrent = pw.IntegerField(null=True)
    own_dynamic_concurrency = pw.BooleanField(null=True)
    config_max_concurrent = pw.IntegerField(null=True)
    config_dynamic_concurrency = pw.BooleanField(null=True)
    started_at = pw.DoubleField(default=time.time)
    last_seen = pw.DoubleField(default=time.time, index=True)


class ResultPart(BaseModel):
    """A file a processor run wrote to the results folder, kept in the queue database so
    that every node sharing it serves it (nodes share no disk): the run's document
    (``<processor>.json``, whatever its status), its subtitles (``asr.srt``) and its
    thumbnails (``cut.thumbnails/<name>.jpg``). As on disk, each file and processor keeps
    its newest completed run's parts and the newest failed or partial one's beside them."""

    file = pw.ForeignKeyField(MediaFile, on_delete="CASCADE")
    file_id: Any  # the foreign key's column, as peewee adds it
    run_id = pw.BigIntegerField(null=True)  # the ProcessorRun (kept when its job is pruned)
    processor = pw.CharField(max_length=32)
    status = pw.CharField(max_length=16)  # the run's document's: completed, failed, partial
    name = pw.TextField()  # as in the results folder
    content = pw.BlobField()
    stored_at = pw.DoubleField(default=time.time, index=True)

    class Meta:
        indexes = ((("file", "name", "id"), False),)


class SearchEntry(BaseModel):
    """One moment a search can find: a transcript segment, an on-screen text line or an
    object label over the span of time it was seen, from a file's newest complete result
    of that processor. ``terms`` is what the full-text index holds (words.py); the
    index itself (FTS5 on SQLite, a tsvector on PostgreSQL) is made by the migration."""

    file = pw.ForeignKeyField(MediaFile, on_delete="CASCADE")
    file_id: Any  # the foreign key's column, as peewee adds it
    processor = pw.CharField(max_length=32)
    start = pw.DoubleField(null=True)
    end = pw.DoubleField(null=True)
    text = pw.TextField()
    terms = pw.TextField()

    class Meta:
        indexes = ((("file", "processor"), False),)


class SearchIndexed(BaseModel):
    """A file's result that is in the search index (with no entries, if it had no words):
    what the index holds, and so what the upgrade's indexing has still to do."""

    file = pw.ForeignKeyField(MediaFile, on_delete="CASCADE")
    file_id: Any
    processor = pw.CharField(max_length=32)

    class Meta:
        indexes = ((("file", "processor"), True),)


class SearchVector(BaseModel):
    """A moment's meaning, for a search by meaning: its text embedded by the sentence
    model (search/encoder.py), 384 float16 numbers. Deleted with its entry."""

    entry = pw.ForeignKeyField(SearchEntry, primary_key=True, on_delete="CASCADE")
    entry_id: Any
    vector = pw.BlobField()


class JobLog(BaseModel):
    """The log lines a node wrote about a job (JSON lines, as in its log file), its last
    JOB_LOG_BYTES of them: nodes share no disk, so a job's log is read from here by every
    node, also while the node that ran it is off. Kept on PostgreSQL only (a SQLite queue
    has one node, whose log file holds them all)."""

    job = pw.ForeignKeyField(Job, on_delete="CASCADE")
    job_id: Any  # the foreign key's column, as peewee adds it
    node = pw.CharField(max_length=120)
    lines = pw.TextField(default="")
    updated_at = pw.DoubleField(default=time.time)

    class Meta:
        indexes = ((("job", "node"), True),)


MODELS = (
    QueueState,
    MediaFile,
    Job,
    ProcessorRun,
    Node,
    ResultPart,
    SearchEntry,
    SearchIndexed,
    SearchVector,
    JobLog,
)
