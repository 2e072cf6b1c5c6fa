"""Nodes sharing one queue: registration, heartbeats, and wake-ups across processes."""

# Each service process is a node. It registers what it can run, renews
# ``last_seen`` with its heartbeat, and is considered gone once that is older
# than the lease. On PostgreSQL a node LISTENs on a channel that every node
# NOTIFYs when work may have become claimable, so an idle node on another
# machine starts a job within milliseconds; SQLite (one machine) relies on the
# in-process wake-up and the periodic kick.

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import peewee as pw
import psutil

from . import clock, store
from .clock import iso
from .errors import Conflict
from .events import Event, bus
from .logs import Repeats
from .store import JobStatus, Node, dbusers

log = logging.getLogger(__name__)

CHANNEL = "momentry_jobs"
# Local events after which another node may find a job it can start.
WAKE_EVENTS = {
    "job.queued",
    "job.prioritized",
    "job.recovered",
    "job.requeued",
    "queue.resumed",
    "queue.concurrency",
}


# How far this machine's clock may be from the database server's before it is worth a warning.
CLOCK_WARN_SECONDS = 1.0


def sync_clock(database: pw.Database) -> float:
    """Take the database server's time as the queue's (clock.now); returns how far this
    machine's clock is behind it, in seconds. On SQLite the queue is on this machine
    and so is its clock."""
    if not store.is_postgres(database):
        return 0.0
    database.connect(reuse_if_open=True)  # a new connection's set-up is not the server's time
    before = time.time()
    (server,) = database.execute_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()
    after = time.time()
    offset = float(server) - (before + after) / 2  # the query's round trip split evenly
    if abs(offset) <= after - before:
        offset = 0.0  # within what the round trip lets one tell: the same clock
    # Said at start-up, and again only when it has moved (a clock set right meanwhile).
    if abs(offset) > CLOCK_WARN_SECONDS and abs(offset - clock.offset()) > CLOCK_WARN_SECONDS:
        log.warning(
            "this machine's clock is %.1f s %s the database server's; the queue keeps the"
            " server's time",
            abs(offset),
            "behind" if offset > 0 else "ahead of",
        )
    clock.set_offset(offset)
    return offset


def register_node(
    node_id: str,
    owner: str,
    processors: list[str],
    now: float | None = None,
    worker: str = "on",
) -> None:
    """Claim ``node_id`` for this process; refuse if a live process on this host holds it.
    ``worker``: whether it takes jobs (Node.worker); one that takes none lists no processors,
    so that no other node leaves a job waiting for it."""
    now = clock.now() if now is None else now
    host = socket.gethostname()
    with store.write_transaction(Node._meta.database):
        current = Node.get_or_none(Node.node_id == node_id)
        if current is not None and current.owner != owner and _alive_here(current, host):
            raise Conflict(
                f"node id {node_id!r} is in use by process {current.pid} on this host, a "
                "momentry-edge that runs or is still stopping: stop it, or give each its own "
                "service.node_id"
            )
        values = {
            "host": host,
            "pid": os.getpid(),
            "owner": owner,
            "processors": processors if worker != "off" else [],
            "worker": worker,
            "started_at": now,
            "last_seen": now,
        }
        if current is None:
            Node.create(node_id=node_id, **values)
        else:
            Node.update(values).where(Node.node_id == node_id).execute()


def _alive_here(node: Node, host: str) -> bool:
    """Whether the process that registered ``node`` still runs here, on this database. A
    process with its pid started after the row was written is another program: the pid
    was given again after that one was killed or the machine restarted. One that uses
    another database (this one is a copy of its, restored) holds nothing here."""
    if node.host != host or node.pid == os.getpid():
        return False
    try:
        process = psutil.Process(node.pid)
        created = process.create_time()
    except psutil.Error:
        return False
    # started_at is on the queue's clock, create_time on this machine's (and rounded).
    if created > node.started_at - clock.offset() + 1:
        return False
    return dbusers.uses(process, Node._meta.database)


def heartbeat(node_id: str, owner: str, max_concurrent: int) -> None:
    Node.update(last_seen=clock.now(), max_concurrent=max_concurrent).where(
        Node.node_id == node_id, Node.owner == owner
    ).execute()


def set_processors(node_id: str, owner: str, processors: list[str]) -> None:
    """What this node can run changed (a model it was pulling is in place)."""
    Node.update(processors=processors).where(Node.node_id == node_id, Node.owner == owner).execute()


def set_worker(node_id: str, owner: str, worker: str) -> None:
    """This node was drained ("drained") or takes jobs again ("on")."""
    Node.update(worker=worker).where(Node.node_id == node_id, Node.owner == owner).execute()


def leave(node_id: str, owner: str) -> None:
    """A clean stop: this node no longer counts as able to run anything."""
    Node.update(last_seen=0, max_concurrent=0).where(
        Node.node_id == node_id, Node.owner == owner
    ).execute()


def live_nodes(within: float, now: float | None = None) -> list[Node]:
    now = clock.now() if now is None else now
    return list(Node.select().where(Node.last_seen >= now - within).order_by(Node.node_id))


@store.retried  # read as a job finishes: a dropped connection must not give the job back
def cluster_processors(within: float) -> set[str]:
    """Every processor some live node can run (read before every claim: written out)."""
    rows = store.execute("SELECT processors FROM node WHERE last_seen >= ?", clock.now() - within)
    return {name for (processors,) in rows.fetchall() for name in json.loads(processors)}


# A node whose heartbeat stopped (kill -9, a power cut, a lost network) stays in the list,
# offline, this long; one that stopped cleanly leaves it at once (leave()).
OFFLINE_SHOWN = 24 * 3600.0


def node_rows(within: float, now: float | None = None) -> list[dict[str, Any]]:
    """The ``nodes`` list of the queue status: the live nodes, and those whose heartbeat
    stopped within OFFLINE_SHOWN (``online`` false), with their last heartbeat."""
    now = clock.now() if now is None else now
    active = dict(
        store.rows(
            store.Job.select(store.Job.node, pw.fn.COUNT(store.Job.id))
            .where(store.Job.status == JobStatus.PROCESSING)
            .group_by(store.Job.node)
        )
    )
    return [
        {
            "id": node.node_id,
            "host": node.host,
            "processors": node.processors,
            "active": active.get(node.node_id, 0),
            "max_concurrent": node.max_concurrent,
            "last_seen": iso(node.last_seen),
            "online": node.last_seen >= now - within,
            "worker": node.worker,
        }
        for node in live_nodes(OFFLINE_SHOWN, now)
    ]


HEARTBEAT_STOP_WAIT = 30.0  # seconds a stop waits for a beat under way


class Heartbeat:
    """The node's heartbeat on a thread of its own: ``beat`` (renew the leases of the
    jobs in hand and the node's ``last_seen``) every ``every`` seconds.

    Not a housekeeping step: a step that takes long (a backup whose pg_dump waits for a
    lock, a sweep of a slow disk) would hold it up past the lease, and another node would
    take the running jobs of this live one. The thread keeps its own pooled connection.
    """

    def __init__(self, beat: Callable[[], None], every: float) -> None:
        self.beat = beat
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._failing = Repeats(log)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No beat after this returns: a node that leaves must not look alive again."""
        self._stop.set()
        if self._thread.is_alive():
            # A beat waits for the database its answer timeout at most (15 s by default).
            self._thread.join(timeout=HEARTBEAT_STOP_WAIT)
            if self._thread.is_alive():
                log.warning("the heartbeat did not end within %g s", HEARTBEAT_STOP_WAIT)

    def _run(self) -> None:
        try:
            # The first at once: the node's row gets its limit (register_node has none).
            while not self._stop.is_set():
                try:
                    self.beat()
                except store.OUTAGE_ERRORS as exc:
                    store.after_outage()  # the next beat on a fresh connection
                    self._failing.failed("heartbeat", exc)
                except Exception as exc:  # a bug: said, and the beat goes on
                    self._failing.failed("heartbeat", exc)
                else:
                    self._failing.worked("heartbeat")
                self._stop.wait(self.every)
        finally:
            store.close_connection()


class NodeWatch:
    """Publishes ``node.lost`` once for a node whose heartbeat stopped (a clean stop is not lost).

    Only the live node first by id reports, so a cluster of several says it once;
    nodes gone longer than ``window`` past their lease are old news and not reported.
    """

    def __init__(self, node_id: str, within: float, window: float = 600.0) -> None:
        self.node_id = node_id
        self.within = within
        self.window = window
        self._reported: set[tuple[str, float]] = set()

    def check(self, now: float | None = None) -> list[str]:
        now = clock.now() if now is None else now
        live = live_nodes(self.within, now)
        if not live or live[0].node_id != self.node_id:
            return []
        stale = now - self.within
        gone = Node.select().where(Node.last_seen < stale, Node.last_seen > stale - self.window)
        lost = [n for n in gone if (n.node_id, n.last_seen) not in self._reported]
        for node in lost:
            self._reported.add((node.node_id, node.last_seen))
            log.warning("node %s on %s stopped its heartbeat", node.node_id, node.host)
            bus.publish(
                "node.lost", node=node.node_id, host=node.host, last_seen=iso(node.last_seen)
            )
        return [n.node_id for n in lost]


class Notifier:
    """PostgreSQL LISTEN/NOTIFY: tell other nodes about new work, and hear them."""

    def __init__(self, database: pw.Database, on_wake: Callable[[], None]) -> None:
        self.database = database
        self.on_wake = on_wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="listen", daemon=True)
        self._last_sent = 0.0

    @property
    def enabled(self) -> bool:
        return store.is_postgres(self.database)

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=3)  # it wakes at least once a second

    def on_event(self, event: Event) -> None:
        """Bus listener: a local change that may free work for other nodes."""
        if self.enabled and event["type"] in WAKE_EVENTS:
            try:
                self.database.execute_sql(f"NOTIFY {CHANNEL}")
            except (pw.DatabaseError, pw.InterfaceError):
                # Runs inside whatever published the event: never let it fail that.
                log.warning("could not notify other nodes; they will poll")
                store.release_connection()

    def _listen(self) -> None:
        import psycopg

        # The URL's settings, with its connect_timeout or the service's (store.CONNECTION_DEFAULTS).
        params = self.database.connect_params
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    dbname=self.database.database, autocommit=True, **params
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.on_wake()
            except (psycopg.Error, OSError) as exc:
                log.warning("listening for other nodes failed (%s); retrying", exc)
                self._stop.wait(2.0)
