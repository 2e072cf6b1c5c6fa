"""Mirror job state into the Redis keys the rest of the Momentry system reads."""

# The Job Worker plan keeps these keys (``uuid`` is the job's ``task_id``)::
#
#     momentry:job:{uuid}                    hash: the job
#     momentry:job:{uuid}:processor:{name}   hash: one processor of the job
#     momentry:progress:{uuid}               pub/sub channel: a JSON message per change
#     momentry:jobs:active|completed|failed  sets of task ids
#
# and ``momentry:edge:mirror:{queue}`` (when the last full rewrite began), whose absence
# says Redis was emptied under a running server (FLUSHALL, FLUSHDB, an empty replica
# promoted): the run id alone only tells a restart.
#
# Machines with queues of their own (each its own SQLite file) may share one Redis: each
# job and processor hash carries its queue's identity (``edge_queue``, store.queue_id), and a
# full rewrite drops only stale keys carrying its own, changes set members one by one and
# keeps a marker per queue. Keys without ``edge_queue`` (older versions) are left alone:
# whose they are cannot be told.
#
# Redis is a copy, never the truth: the bus listener only marks a job as changed,
# and one thread reads the job table and writes Redis with short socket timeouts.
# While Redis is away nothing waits for it; once it answers again (or restarted
# empty) the whole mirror is rebuilt from the job table.
#
# A command Redis answers but refuses (a key of another type, one an ACL denies, a
# read-only replica) is no outage: it is skipped, said once, and the rest is written.
# One of the three sets found holding another type is replaced: the keys under the
# prefix are the mirror's own.

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import store
from ..clock import iso
from ..events import Event
from ..jobs import views
from ..store import Job, JobStatus, MediaFile, ProcessorRun, RunStatus
from .background import Background

log = logging.getLogger(__name__)

PREFIX = "momentry:"
# Which set a job status belongs to; other statuses (pending, retrying, cancelled) are in none.
SET_OF_STATUS: dict[str, str] = {
    JobStatus.PROCESSING: "active",
    JobStatus.COMPLETED: "completed",
    JobStatus.PARTIAL: "failed",  # some processors failed after their retries
    JobStatus.FAILED: "failed",
}
SETS = ("active", "completed", "failed")
# Redis not there, or not answering in time; any other RedisError is a command it refused.
OUTAGE = (redis.ConnectionError, redis.TimeoutError, OSError)
PROGRESS_EVERY = 1.0  # seconds: at most one progress write per job (plan §8.2)
WATCH_EVERY = 1.0  # how often running jobs are re-read (processor states change between reports)
CHECK_EVERY = 2.0  # how often Redis is asked whether it restarted or was emptied
FULL_EVERY = 600.0  # full resync anyway: catches jobs removed by the retention sweep
BATCH = 200  # jobs per pipeline in a full resync


def job_key(uuid: str) -> str:
    return f"{PREFIX}job:{uuid}"


def processor_key(uuid: str, name: str) -> str:
    return f"{PREFIX}job:{uuid}:processor:{name}"


def progress_channel(uuid: str) -> str:
    return f"{PREFIX}progress:{uuid}"


def set_key(name: str) -> str:
    return f"{PREFIX}jobs:{name}"


OWN_SETS = tuple(set_key(name) for name in SETS)


def marker_key(queue: str) -> str:
    return f"{PREFIX}edge:mirror:{queue}"


def connect(url: str, timeout: float = 1.0) -> redis.Redis:
    """A client that fails fast: the mirror retries on its own schedule. ValueError for a
    URL redis-py cannot use."""
    client = redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )
    pool = client.connection_pool
    try:
        # Made, not connected: the URL's query parameters are checked only here (redis-py
        # would raise at every first command instead).
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, redis.RedisError) as exc:
        raise ValueError(f"a query parameter redis-py cannot use ({exc})") from None
    return client


class RedisMirror(Background):
    # One piece (~310 lines): the event writer and the reconciliation share one
    # connection and one view of what Redis holds.
    def __init__(self, url: str, *, timeout: float = 1.0) -> None:
        self._client = connect(url, timeout)  # raises ValueError for a malformed URL
        super().__init__("redis-mirror", join_timeout=3.0)
        self._url = url
        self._due: dict[str, float] = {}  # task_id -> when to write it next
        self._last_write: dict[str, float] = {}
        # What each job's channel last said (without its time): a write that would say
        # the same again, e.g. a state change the previous write already showed, is not sent.
        self._last_said: dict[str, dict[str, Any]] = {}
        self._watching: set[str] = set()  # running jobs, re-read every WATCH_EVERY
        self._queue = ""  # the queue's identity, read from the database before the first write
        self._info = True  # whether Redis lets the mirror ask its run id (an ACL may not)
        self._rewrite = False  # a set of ours was replaced: its members are written again
        # Refused commands said, by what they did ("SADD momentry:jobs:failed"): each said
        # again only when its answer changes, and once when it is accepted again.
        self._refused: dict[str, str] = {}

    def stop(self) -> None:
        super().stop()
        self._client.close()

    def on_event(self, event: Event) -> None:
        """Bus listener: remember which job changed; the mirror thread does the rest."""
        task_id = event.get("task_id")
        if not task_id or not event["type"].startswith("job."):
            return
        now = time.monotonic()
        with self._cond:
            if event["type"] == "job.progress":
                if task_id in self._due:
                    return  # already due; progress is written at most once a second
                when = max(now, self._last_write.get(task_id, 0.0) + PROGRESS_EVERY)
            else:
                when = now  # a state change is written at once
            self._due[task_id] = min(when, self._due.get(task_id, when))
            self._cond.notify()

    # -- the mirror thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        run_id: str | None = None  # Redis's run id when last resynced; None = resync needed
        backoff = 0.5
        said = ""  # the reason of the outage last said
        next_check = next_full = next_watch = 0.0
        while True:
            if self._stopping.is_set():
                if run_id is not None:
                    self._flush()  # what changed while the service stopped (jobs requeued)
                return
            now = time.monotonic()
            try:
                if not self._queue:
                    self._queue = store.queue_id()
                if run_id is None or self._rewrite or now >= next_check:
                    current = self._run_id()
                    next_check = now + CHECK_EVERY
                    marker = marker_key(self._queue)
                    emptied = run_id is not None and not self._client.exists(marker)
                    if current != run_id or emptied or self._rewrite or now >= next_full:
                        if run_id is not None and (current != run_id or emptied):
                            log.warning("redis restarted or emptied; rebuilding the job mirror")
                        self._resync()
                        run_id, next_full = current, now + FULL_EVERY
                        if backoff > 0.5:
                            log.info("redis mirror is up to date again")
                        backoff = 0.5
                if now >= next_watch:
                    next_watch = now + WATCH_EVERY
                    with self._cond:
                        for task_id in self._watching:
                            last = self._last_write.get(task_id, 0.0)
                            self._due.setdefault(task_id, max(now, last + PROGRESS_EVERY))
                for task_id in self._take_due(now):
                    self._write_job(task_id, publish=True)
            except OUTAGE as exc:
                # Said once per outage, and again when its reason changes (Redis back with
                # another password says so, not the refused connection before it).
                reason = _reason(exc)
                if backoff == 0.5 or reason != said:
                    log.warning("redis unreachable (%s); jobs go on, the mirror catches up", reason)
                    said = reason
                run_id = None
                self._stopping.wait(backoff)  # not woken by job events: no busy retrying
                backoff = min(backoff * 2, 5.0)
                continue
            except redis.RedisError as exc:
                # Refused, not away (a command the mirror cannot do without): said once, and
                # tried again with a full rewrite, after a pause that trying at once does not help.
                self._refusal("a command the mirror needs", exc)
                run_id = None
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            except Exception:  # the database away for a moment: try again shortly
                log.exception("redis mirror: cannot read the job table")
                run_id = None
                self._stopping.wait(2.0)
                continue
            finally:
                store.release_connection()
            self._wait(min(next_check, next_watch, self._next_due()) - time.monotonic())

    def _run_id(self) -> str:
        """Redis's run id, new at each restart; "" where INFO is refused (an ACL user): then
        a restart is told by the marker alone, when Redis comes back empty."""
        if self._info:
            try:
                return str(cast(dict, self._client.info("server"))["run_id"])
            except redis.ResponseError as exc:
                log.warning(
                    "redis mirror: redis refuses INFO (%s); a restart of redis is noticed"
                    " only when it comes back empty, or at the next full rewrite",
                    exc,
                )
                self._info = False
        return ""

    def _flush(self) -> None:
        try:
            for task_id in self._take_due(float("inf")):
                self._write_job(task_id, publish=True)
        except Exception as exc:  # the next start resyncs anyway
            log.warning("redis mirror: last changes not written (%s)", exc)
        finally:
            store.release_connection()

    def _take_due(self, now: float) -> list[str]:
        with self._cond:
            due = [t for t, when in self._due.items() if when <= now]
            for task_id in due:
                del self._due[task_id]
                # Taken now: progress reported while it is being written waits its second.
                self._last_write[task_id] = time.monotonic()
        return due

    def _next_due(self) -> float:
        with self._cond:
            return min(self._due.values(), default=float("inf"))

    def _wait(self, seconds: float) -> None:
        with self._cond:
            if not self._stopping.is_set() and not self._any_due():
                self._cond.wait(max(min(seconds, CHECK_EVERY), 0.0))

    def _any_due(self) -> bool:
        now = time.monotonic()
        return any(when <= now for when in self._due.values())

    # -- writing --------------------------------------------------------------------------------

    def _write_job(self, task_id: str, *, publish: bool) -> None:
        job = Job.select(Job, MediaFile).join(MediaFile).where(Job.task_id == task_id).first()
        if job is None:  # removed from the table: removed from the mirror
            self._forget(task_id)
            return
        runs = list(job.runs.order_by(ProcessorRun.position))
        read = self._client.pipeline(transaction=False)
        _read(read, job, runs)
        before = read.execute(raise_on_error=False)
        pipe = self._client.pipeline(transaction=True)
        _write(pipe, job, runs, self._queue, before)
        self._send(pipe)
        message = _progress_message(job, runs)
        said = {k: v for k, v in message.items() if k != "at"}
        if publish and said != self._last_said.get(task_id):
            # After the keys, on its own: a channel an ACL denies costs the keys nothing.
            pipe = self._client.pipeline(transaction=False)
            pipe.publish(progress_channel(task_id), json.dumps(message))
            self._send(pipe)
            self._last_said[task_id] = said
        with self._cond:
            if job.status == JobStatus.PROCESSING:
                self._watching.add(task_id)
            else:
                self._watching.discard(task_id)
                if job.status in store.FINAL_STATES:
                    self._last_write.pop(task_id, None)
                    self._last_said.pop(task_id, None)

    def _forget(self, task_id: str) -> None:
        names = list(self._client.scan_iter(match=processor_key(task_id, "*")))
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(job_key(task_id), *names)
        for name in SETS:
            pipe.srem(set_key(name), task_id)
        self._send(pipe)
        with self._cond:
            self._watching.discard(task_id)
            self._last_write.pop(task_id, None)
            self._last_said.pop(task_id, None)

    def _resync(self) -> None:
        """Rewrite every job from the table; drop keys of this queue's jobs that are gone."""
        # Jobs marked as changed stay marked: written again after this, which publishes
        # nothing, their channels still tell of the change.
        self._replace_wrong_sets()
        self._rewrite = False  # this rewrite fills them
        # Set first: emptied while this runs, the marker goes too and the next check
        # starts over.
        pipe = self._client.pipeline(transaction=False)
        pipe.set(marker_key(self._queue), iso(time.time()))
        self._send(pipe)
        known: set[str] = set()
        watching: set[str] = set()
        for chunk in _job_pages(BATCH):
            runs_of: dict[int, list[ProcessorRun]] = {job.id: [] for job in chunk}
            for run in ProcessorRun.select().where(ProcessorRun.job.in_(list(runs_of))):
                runs_of[run.job_id].append(run)
            for runs in runs_of.values():
                runs.sort(key=lambda r: r.position)
            read = self._client.pipeline(transaction=False)
            for job in chunk:
                _read(read, job, runs_of[job.id])
            found = iter(read.execute(raise_on_error=False))
            pipe = self._client.pipeline(transaction=False)
            for job in chunk:
                runs = runs_of[job.id]
                before = [next(found) for _ in range(1 + len(runs))]
                # Set members one by one: the sets hold other queues' jobs too.
                _write(pipe, job, runs, self._queue, before)
                known.add(job.task_id)
                if job.status == JobStatus.PROCESSING:
                    watching.add(job.task_id)
            self._send(pipe)
        keys = self._client.scan_iter(match=f"{PREFIX}job:*", count=500)
        # A batch at a time: a list of them all held every key of the history at once.
        for names in _batches((key for key in keys if key.split(":")[2] not in known), BATCH):
            pipe = self._client.pipeline(transaction=False)
            for key in names:
                pipe.hget(key, "edge_queue")
            owners = pipe.execute(raise_on_error=False)  # a key of another kind: not ours
            stale = [key for key, owner in zip(names, owners, strict=True) if owner == self._queue]
            if stale:
                pipe = self._client.pipeline(transaction=False)
                pipe.delete(*stale)
                for name in SETS:
                    pipe.srem(set_key(name), *{key.split(":")[2] for key in stale})
                self._send(pipe)
        with self._cond:
            self._watching = watching
        log.info("redis mirror: %d job(s) written", len(known))

    def _send(self, pipe: Any) -> None:
        """Run ``pipe``'s commands. One Redis refuses is said (see _note) and skipped; the
        rest are written all the same."""
        commands = list(pipe.command_stack)
        try:
            results = pipe.execute(raise_on_error=False)
        except redis.ResponseError:
            if not pipe.transaction:
                raise
            # Refused as it was queued (an ACL): MULTI dropped them all; one by one, the
            # others are written.
            pipe = self._client.pipeline(transaction=False)
            for args, options in commands:
                pipe.execute_command(*args, **options)
            results = pipe.execute(raise_on_error=False)
        self._note([args for args, _ in commands], results)

    def _note(self, commands: list[tuple[Any, ...]], results: list[Any]) -> None:
        """Say what Redis refused; replace a set of ours another type has taken the place of."""
        wrong: set[str] = set()
        for args, result in zip(commands, results, strict=True):
            key = str(args[1]) if len(args) > 1 else ""
            what = f"{args[0]} {_kind(key)}"
            if not isinstance(result, redis.ResponseError):
                if self._refused.pop(what, None) is not None:
                    log.info("redis mirror: redis accepts %s again", what)
            elif str(result).startswith("WRONGTYPE") and key in OWN_SETS:
                wrong.add(key)  # replaced below, and said so
            else:
                self._refusal(what, result)
        if wrong:
            self._replace_wrong_sets(wrong)

    def _refusal(self, what: str, error: Exception) -> None:
        """Say a refused command once, and again only when Redis's answer changes."""
        if self._refused.get(what) != str(error):
            self._refused[what] = str(error)
            log.warning(
                "redis mirror: redis refuses %s (%s); the rest of the mirror is written",
                what,
                error,
            )

    def _replace_wrong_sets(self, keys: Iterable[str] = ()) -> None:
        """Delete any of the three sets (``keys``, else all) that holds another type (SET by
        hand, another program): they are the mirror's own, and a full rewrite (asked for
        here) fills them again."""
        keys = list(keys or OWN_SETS)
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        for key, kind in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            if kind in ("set", "none") or isinstance(kind, Exception):
                continue
            try:
                self._client.delete(key)
            except redis.ResponseError as exc:
                self._refusal(f"DEL {key}", exc)  # left as it is: its commands are refused
                continue
            log.warning(
                "redis mirror: %s held a %s, not a set of task ids; replaced it with the set",
                key,
                kind,
            )
            self._rewrite = True


def _reason(exc: Exception) -> str:
    """What an outage says: the class too where it tells more than the text (a refused
    login's "invalid username-password pair")."""
    if isinstance(exc, redis.AuthenticationError):
        return f"{type(exc).__name__}: {exc}"
    return str(exc)


def _job_pages(size: int) -> Iterable[list[Job]]:
    """Every job with its file, ``size`` at a time in id order, each page a query of its
    own: PostgreSQL hands a query's whole result to the client at once, so one query of
    them all held the whole history in memory (~100 MB at 60,000 jobs) at each rewrite."""
    after = 0
    while page := list(
        Job.select(Job, MediaFile)
        .join(MediaFile)
        .where(Job.id > after)
        .order_by(Job.id)
        .limit(size)
    ):
        yield page
        after = page[-1].id


def _batches(items: Iterable[str], size: int) -> Iterable[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _kind(key: str) -> str:
    """The key with its job's task id left out: a refusal is said once, not once a job."""
    parts = key.split(":")
    if len(parts) > 2 and parts[1] in ("job", "progress"):
        parts[2] = "{uuid}"
    return ":".join(parts)


def _read(pipe: Any, job: Job, runs: list[ProcessorRun]) -> None:
    """Queue reading the job's hash and its processors' hashes, as _write takes them."""
    pipe.hgetall(job_key(job.task_id))
    for run in runs:
        pipe.hgetall(processor_key(job.task_id, run.processor))


def _write(pipe: Any, job: Job, runs: list[ProcessorRun], queue: str, before: list[Any]) -> None:
    """Queue the commands that make the job's keys match the table (hashes replaced whole),
    each hash marked with ``queue``, the identity of the queue the job is in. ``before``:
    the hashes as _read found them."""
    uuid = job.task_id
    key = job_key(uuid)
    fields = _strings(_job_fields(job, runs) | {"edge_queue": queue})
    run_fields = [_strings(_run_fields(run) | {"edge_queue": queue}) for run in runs]
    old, *old_runs = before
    # updated_at is when the job last changed: kept while the rest reads the same.
    same = isinstance(old, dict) and {k: v for k, v in old.items() if k != "updated_at"} == fields
    if same and old_runs == run_fields and "updated_at" in old:
        fields["updated_at"] = old["updated_at"]
    else:
        fields["updated_at"] = iso(time.time())
    pipe.delete(key)
    pipe.hset(key, mapping=fields)
    for run, mapping in zip(runs, run_fields, strict=True):
        run_key = processor_key(uuid, run.processor)
        pipe.delete(run_key)
        pipe.hset(run_key, mapping=mapping)
    target = SET_OF_STATUS.get(job.status)
    for name in SETS:
        if name == target:
            pipe.sadd(set_key(name), uuid)
        else:
            pipe.srem(set_key(name), uuid)


def _job_fields(job: Job, runs: list[ProcessorRun]) -> dict[str, Any]:
    return {
        "uuid": job.task_id,
        "id": job.id,
        "task_id": job.task_id,
        "file_uuid": job.file.file_uuid,
        "file_name": job.file.name,
        "status": job.status,
        "progress": job.progress,
        "priority": store.PRIORITY_NAMES[job.priority],
        "processors": [r.processor for r in runs],
        "completed": [r.processor for r in runs if r.status in store.RUN_DONE],
        "failed": [r.processor for r in runs if r.status == RunStatus.FAILED],
        "retry_count": job.retry_count,
        "max_retries": job.max_retries,
        "node": job.node,
        "error_message": job.error_message,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "completed_at": iso(job.completed_at),
    }


def _run_fields(run: ProcessorRun) -> dict[str, Any]:
    return {"name": run.processor, **views.run_detail(run)}


def _progress_message(job: Job, runs: list[ProcessorRun]) -> dict[str, Any]:
    return {
        "uuid": job.task_id,
        "task_id": job.task_id,
        "file_uuid": job.file.file_uuid,
        "status": job.status,
        "progress": job.progress,
        "processors": {
            r.processor: {
                k: v for k, v in views.run_detail(r).items() if k in ("status", "progress")
            }
            for r in runs
        },
        "at": iso(time.time()),
    }


def _strings(fields: dict[str, Any]) -> dict[str, str]:
    """Hash values: text as is, lists and objects as JSON; empty fields are left out."""
    out = {}
    for name, value in fields.items():
        if value is None:
            continue
        out[name] = value if isinstance(value, str) else json.dumps(value)
    return out
