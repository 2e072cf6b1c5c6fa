"""Who can run the waiting line: the live nodes that take jobs, each with its limit now.

A node takes a waiting job as a claim does (jobs/claims.py): it is live, takes jobs (not
drained, not ``queue.worker_enabled = false``), and runs every processor of the job that
some live node lists. A job no such node can run waits: its entry says why ("no node can
run this: ..."), estimates leave it out, and ``queue.stranded`` (an alert) says so once.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import peewee as pw

from .. import clock, cluster, store
from ..clock import iso
from ..events import bus
from ..store import Job, MediaFile, Node
from . import order
from .estimates import Rates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Here:
    """The node answering: its id (None: the queue seen as one node of ``limit``), its
    effective limit now, and the lease after which a silent node counts as gone."""

    node: str | None
    limit: int
    within: float = 60.0


@dataclass(frozen=True)
class Taker:
    node: str
    processors: frozenset[str]
    limit: int  # its effective limit: now for the node answering, else at its last heartbeat


@dataclass(frozen=True)
class Capacity:
    takers: tuple[Taker, ...]
    listed: frozenset[str]  # every processor some live node lists (a claim defers to them)
    idle: tuple[str, ...] = field(default=())  # live nodes that take no job, and why

    def takers_of(self, processors: Iterable[str]) -> list[Taker]:
        needed = set(processors) & self.listed
        return [t for t in self.takers if needed <= t.processors]

    def why_not(self, processors: Sequence[str]) -> str | None:
        """None when some node can run a job of ``processors``; else what an operator reads."""
        if self.takers_of(processors):
            return None
        needed = sorted(set(processors) & self.listed) or sorted(processors)
        said = [
            f"{t.node} runs {', '.join(sorted(t.processors)) or 'no processor'}"
            for t in self.takers
        ]
        said += list(self.idle)
        if not self.takers:
            head = "no live node takes jobs"
        else:
            head = f"no node that takes jobs runs all of {', '.join(needed)}"
        return f"no node can run this: {head}" + (f" ({'; '.join(said)})" if said else "")


def read(here: Here, now: float | None = None) -> Capacity:
    """The nodes as they are now (a node whose heartbeat stopped is named offline)."""
    if here.node is None:  # no node to ask: one taker of everything, by the limit given
        return Capacity((Taker("", frozenset(), here.limit),), frozenset())
    now = clock.now() if now is None else now
    live = now - here.within
    # The pause is the queue's: other nodes' limits say so only at their next heartbeat.
    paused = bool(store.QueueState.select(store.QueueState.paused).scalar())
    takers: list[Taker] = []
    listed: set[str] = set()
    idle: list[str] = []
    for node in Node.select().where(Node.last_seen > 0).order_by(Node.node_id):
        if node.last_seen < live:
            if node.last_seen >= now - cluster.OFFLINE_SHOWN:  # as the node list shows it
                since = (iso(node.last_seen) or "")[:19] + "Z"  # to the second: stable
                idle.append(f"{node.node_id} is offline since {since}")
            continue
        processors = frozenset(node.processors or [])
        listed |= processors
        if node.worker == "off":
            idle.append(f"{node.node_id} runs no jobs (queue.worker_enabled = false)")
        elif node.worker == "drained":
            idle.append(f"{node.node_id} is drained")
        else:
            limit = here.limit if node.node_id == here.node else node.max_concurrent
            takers.append(Taker(node.node_id, processors, 0 if paused else limit))
    return Capacity(tuple(takers), frozenset(listed), tuple(idle))


def stranded(capacity: Capacity) -> list[tuple[list[str], int, str]]:
    """The waiting jobs no node can run, by processor set: (processors, how many, why)."""
    rows = store.execute(
        "SELECT processors, COUNT(*) FROM job WHERE status = ? GROUP BY processors",
        store.JobStatus.PENDING,
    ).fetchall()
    found = []
    for names, count in rows:
        processors = json.loads(names) if isinstance(names, str) else list(names)
        why = capacity.why_not(processors)
        if why is not None:
            found.append((processors, count, why))
    return found


class StrandWatch:
    """Says once, in the log and as ``queue.stranded`` (an alert), that waiting jobs have
    had no node to run them for ``grace`` seconds (a node restarting is no news); again
    only once that has passed and come back. Only the live node first by id reports."""

    def __init__(self, here: Callable[[], Here], grace: float) -> None:
        self.here = here
        self.grace = grace
        self._since: dict[str, float] = {}  # why -> when first seen
        self._said: set[str] = set()

    def check(self, now: float | None = None) -> list[str]:
        """The reasons said now."""
        now = clock.now() if now is None else now
        here = self.here()
        live = cluster.live_nodes(here.within, now)
        if not live or live[0].node_id != here.node:
            return []
        found = {why: (processors, count) for processors, count, why in stranded(read(here, now))}
        for gone in set(self._since) - set(found):
            del self._since[gone]
            self._said.discard(gone)
        said = []
        for why, (processors, count) in found.items():
            since = self._since.setdefault(why, now)
            if why in self._said or now - since < self.grace:
                continue
            self._said.add(why)
            said.append(why)
            names = ", ".join(processors)
            log.warning("%d waiting job(s) of %s: %s", count, names, why)
            bus.publish("queue.stranded", count=count, processors=processors, reason=why)
        return said


def slots(
    capacity: Capacity, running: Iterable[tuple[str | None, float]], now: float
) -> dict[str, list[float]]:
    """When each of each taker's ``limit`` slots frees: at the ends of the jobs it runs
    (``running``: node, expected end), the latest ones while it runs more than its limit
    (the limit came down meanwhile); now where it runs fewer."""
    ends: dict[str, list[float]] = {}
    alone = len(capacity.takers) == 1 and capacity.takers[0].node == ""
    for node, end in running:
        ends.setdefault("" if alone else node or "", []).append(end)
    free = {}
    for taker in capacity.takers:
        if taker.limit > 0:
            mine = sorted(ends.get(taker.node, []))
            free[taker.node] = mine[max(len(mine) - taker.limit, 0) :] + [now] * max(
                taker.limit - len(mine), 0
            )
    return free


def estimated_starts(
    waiting: Sequence[tuple[Sequence[str], float | None]],
    free: dict[str, list[float]],
    nodes: Capacity,
    rates: Rates,
) -> list[float | None]:
    """When each waiting job (its processors and its media's duration, in line order)
    should start: on the node of those that can run it (``nodes``) whose slot frees first
    (``free``: capacity.slots), each job then holding its slot for its expected time
    (Rates). None for a job no node can start, and from the first job of no
    known time on."""
    heaps = {node: sorted(times) for node, times in free.items()}
    starts: list[float | None] = []
    for processors, duration in waiting:
        seconds = rates.job_seconds(processors, duration)
        if seconds is None:
            return starts + [None] * (len(waiting) - len(starts))
        mine = [t.node for t in nodes.takers_of(processors) if heaps.get(t.node)]
        if not mine:
            starts.append(None)
            continue
        first = min(mine, key=lambda node: heaps[node][0])
        start = heapq.heappop(heaps[first])
        starts.append(start)
        heapq.heappush(heaps[first], start + seconds)
    return starts


def level(free: dict[str, list[float]], work: float) -> dict[str, list[float]]:
    """Every node's slots (``free``) once ``work`` seconds are shared out among them all,
    each taking on work from when it frees."""
    labelled = sorted((at, node) for node, times in free.items() for at in times)
    slots = [at for at, _ in labelled]
    levelled = slots
    for k in range(1, len(slots) + 1):
        level = (work + sum(slots[:k])) / k
        if k == len(slots) or level <= slots[k]:
            levelled = [max(slot, level) for slot in slots]
            break
    out: dict[str, list[float]] = {node: [] for node in free}
    for (_, node), at in zip(labelled, levelled, strict=True):
        out[node].append(at)
    return out


def starts_at(
    positions: Sequence[int],
    waiting: Sequence[tuple[Sequence[str], float | None]],
    free: dict[str, list[float]],
    nodes: Capacity,
    rates: Rates,
) -> list[float | None]:
    """Estimated starts of jobs at ``positions`` of the line (rising; a filtered page),
    each behind the work of every job before it: as views._starts_after does each, but from one
    read of the line up to the last of them, the work levelled in gap by gap (sharing out
    work in two parts leaves the slots as sharing it out at once does)."""
    if not free or not positions:
        return [None] * len(waiting)
    names = pw.Cast(Job.processors, "text")
    query = order.pending_in_order().select(names, MediaFile.duration).join(MediaFile)
    ahead = store.rows(query.limit(max(positions[-1] - 1, 0)))
    parsed: dict[str, list[str]] = {}
    starts: list[float | None] = []
    done = 0
    for place, one in zip(positions, waiting, strict=True):
        work = 0.0
        for text, duration in ahead[done : place - 1]:
            processors = parsed.setdefault(text, json.loads(text))
            seconds = rates.job_seconds(processors, duration)
            if seconds is None:  # a job of no known time ahead: none after it is known
                return starts + [None] * (len(waiting) - len(starts))
            work += seconds
        done = max(done, place - 1)
        free = level(free, work)
        starts.append(estimated_starts([one], free, nodes, rates)[0])
    return starts
