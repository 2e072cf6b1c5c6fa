"""The queue's settings: paused, concurrency (the cluster's, or one node's own)."""

from __future__ import annotations

import logging
from typing import Any

from .. import clock, store
from ..errors import Invalid
from ..events import bus
from ..store import Node, QueueState

log = logging.getLogger(__name__)


def init_queue_state(
    max_concurrent: int, dynamic: bool, node: str | None = None, ceiling: int | None = None
) -> QueueState:
    """Create the settings row, or take the config file's values where the file changed.

    On a shared PostgreSQL queue the values are ``node``'s own (its row, registered
    first): nodes of one queue run on machines of their own sizes. A kept max_concurrent
    above ``ceiling`` (queue.worker_threads, lowered since it was set) is cut to it.
    """
    database = QueueState._meta.database
    with store.write_transaction(database):
        state = QueueState.get_or_none(QueueState.id == 1)
        if state is None:
            state = QueueState.create(
                id=1,
                max_concurrent=max_concurrent,
                dynamic_concurrency=dynamic,
                config_max_concurrent=max_concurrent,
                config_dynamic_concurrency=dynamic,
            )
        if _own_settings(node):
            own = Node.get_by_id(node)
            if own.config_max_concurrent != max_concurrent:
                own.own_max_concurrent = own.config_max_concurrent = max_concurrent
            if own.config_dynamic_concurrency != dynamic:
                own.own_dynamic_concurrency = own.config_dynamic_concurrency = dynamic
            if own.own_max_concurrent is not None:  # set with config_max_concurrent above
                own.own_max_concurrent = _capped(own.own_max_concurrent, ceiling)
            own.save()
        else:
            if state.config_max_concurrent != max_concurrent:
                state.max_concurrent = state.config_max_concurrent = max_concurrent
            if state.config_dynamic_concurrency != dynamic:
                state.dynamic_concurrency = state.config_dynamic_concurrency = dynamic
            state.max_concurrent = _capped(state.max_concurrent, ceiling)
            state.save()
    return queue_state(node)


def _capped(kept: int, ceiling: int | None) -> int:
    """A kept max_concurrent, at most ``ceiling``: no more jobs run than there are threads,
    and the status, /metrics and the API's range must say what runs."""
    if ceiling is None or kept <= ceiling:
        return kept
    log.warning(
        "max_concurrent %d (set through the API) is more than queue.worker_threads %d: now %d",
        kept,
        ceiling,
        ceiling,
    )
    return ceiling


def _own_settings(node: str | None) -> bool:
    """Whether ``node`` keeps concurrency settings of its own: on PostgreSQL, where several
    nodes share the queue. SQLite's one node keeps them in the queue's row, whatever its id."""
    return node is not None and store.is_postgres(QueueState._meta.database)


def _state_sql(node: str | None) -> tuple[str, tuple[str | None, ...]]:
    """The statement reading the queue's state as ``node`` works by it: the queue's pause
    with the node's own settings in the place of the queue's, where it has its own."""
    if not _own_settings(node):
        return "SELECT * FROM queue_state WHERE id = 1", ()
    sql = (
        "SELECT q.id, q.paused, n.own_max_concurrent AS max_concurrent,"
        " n.own_dynamic_concurrency AS dynamic_concurrency FROM queue_state q"
        " JOIN node n ON n.node_id = ? WHERE q.id = 1"
    )
    return sql, (node,)


@store.retried  # read as a job starts: a dropped connection must not give the job back
def queue_state(node: str | None = None) -> QueueState:
    """The pause, and ``node``'s max_concurrent and dynamic_concurrency (see _state_sql)."""
    # Read before every claim: written out (see store.fetch) rather than built by peewee.
    sql, params = _state_sql(node)
    return store.fetch(QueueState, sql, *params)[0]


def set_paused(paused: bool) -> QueueState:
    QueueState.update(paused=paused, updated_at=clock.now()).where(QueueState.id == 1).execute()
    bus.publish("queue.paused" if paused else "queue.resumed", paused=paused)
    return queue_state()


def set_concurrency(
    max_concurrent: int | None, dynamic: bool | None, ceiling: int, node: str | None = None
) -> QueueState:
    """Change the concurrency settings ``node`` works by: its own on a shared PostgreSQL
    queue (see _own_settings), so a change through one node leaves the others as they are."""
    changes: dict[str, Any] = {}
    if max_concurrent is not None:
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise Invalid("max_concurrent must be a whole number")
        if not 1 <= max_concurrent <= ceiling:
            raise Invalid(f"max_concurrent must be between 1 and {ceiling} (queue.worker_threads)")
        changes["max_concurrent"] = max_concurrent
    if dynamic is not None:
        if not isinstance(dynamic, bool):
            raise Invalid("dynamic_concurrency must be true or false")
        changes["dynamic_concurrency"] = dynamic
    if not changes:  # both null: answered as changed, it would have changed nothing
        raise Invalid("give max_concurrent and/or dynamic_concurrency")
    if _own_settings(node):
        own = {getattr(Node, f"own_{name}"): value for name, value in changes.items()}
        Node.update(own).where(Node.node_id == node).execute()
    else:
        QueueState.update(changes, updated_at=clock.now()).where(QueueState.id == 1).execute()
    state = queue_state(node)
    bus.publish(
        "queue.concurrency",
        max_concurrent=state.max_concurrent,
        dynamic_concurrency=state.dynamic_concurrency,
    )
    return state
