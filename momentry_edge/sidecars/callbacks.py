"""POST a job's summary to its ``callback_url`` when it ends, off the worker threads."""

# What is owed lives in the job table (``callback_due``, set in the same commit that
# ends the job), so a restart or a crash loses no callback, and with several nodes
# each is sent by one of them. Deliveries are retried with doubling delays; a worker
# never waits on a client's server, and one delivery takes at most ``timeout`` seconds
# per URL. ``SENDERS`` threads deliver side by side, each claiming a job of its own, so
# a server that hangs holds up the one thread posting to it, not the other jobs.

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import clock, jobs, outbound, store
from ..events import Event
from .background import Background

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

# (callback URLs still owed, payload) for a task id; no URLs when none is owed.
Summarize = Callable[[str], tuple[list[str], dict[str, Any]]]

# Callbacks delivered at once. Each hanging server holds one thread for the timeout, so
# fewer than this many never delay another job's callback or a retry's due time.
SENDERS = 4


class CallbackSender(Background):
    def __init__(
        self,
        summarize: Summarize,
        *,
        attempts: int = 6,
        first_delay: float = 1.0,
        timeout: float = 10.0,
        idle_check: float = 30.0,  # how often to look for callbacks other nodes left
        own_port: Callable[[], int | None] = lambda: None,  # the API's, once it listens
        senders: int = SENDERS,
    ) -> None:
        # Not the whole POST timeout: a delivery cut short at stop stays owed and is sent
        # again once its hold runs out, by this node after a restart or by another.
        super().__init__("callbacks", join_timeout=2.0, threads=senders)
        self._summarize = summarize
        self._attempts = attempts
        self._first_delay = first_delay
        self._timeout = timeout
        self._hold = timeout * 3  # a POST takes at most timeout (outbound.post)
        self._idle_check = idle_check
        self._own_port = own_port
        self._poked = False

    def on_event(self, event: Event) -> None:
        """Bus listener: a job ended (or a finished one was given a callback URL), so a
        callback may be owed now."""
        if event["type"] == "job.finished" and event.get("callback") is False:
            return  # this ending owes none (the event says so when it knows)
        if event["type"] in ("job.finished", "job.callback_owed"):
            with self._cond:
                self._poked = True
                self._cond.notify()

    def _loop(self) -> None:
        """One sender: claims a due callback, delivers it, and so on. Whatever goes wrong
        is logged and the loop goes on; what is owed stays in the job table meanwhile."""
        # Made when the first callback is due: a service that never posts never loads httpx.
        client: httpx.Client | None = None
        try:
            while not self._stopping.is_set():
                try:
                    due, next_due = self._claim()
                    if due is not None:
                        self._poke()  # more may be due: an idle sender looks meanwhile
                        if client is None:
                            client = outbound.client(self._timeout)
                        self._deliver(client, *due)
                        continue
                except Exception:  # the database away for a moment: try again shortly
                    log.exception("callbacks: cannot deliver what is owed")
                    next_due = clock.now() + self._first_delay
                finally:
                    store.release_connection()
                self._sleep(next_due)
        finally:
            if client is not None:
                client.close()

    def _claim(self) -> tuple[tuple[str, int] | None, float | None]:
        """(a callback claimed, or None; when the next one is due)."""
        # A read first: most jobs that end owe no callback.
        next_due = jobs.next_callback_due()
        if next_due is None or next_due > clock.now():
            return None, next_due
        return jobs.claim_callback(hold_seconds=self._hold), next_due

    def _poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify()

    def _sleep(self, next_due: float | None) -> None:
        wait = self._idle_check if next_due is None else next_due - clock.now()
        with self._cond:
            if not (self._poked or self._stopping.is_set()):
                self._cond.wait(min(max(wait, 0.0), self._idle_check))
            self._poked = False

    def _deliver(self, client: httpx.Client, task_id: str, attempt: int) -> None:
        extra = {"task_id": task_id}
        try:
            urls, payload = self._summarize(task_id)
        except store.OUTAGE_ERRORS:
            raise  # still owed: sent once the database answers and its hold has run out
        except Exception:  # a job deleted since, or a summary bug: never retried forever
            log.exception("job %s: no callback summary", task_id, extra=extra)
            jobs.settle_callback(task_id, None)
            return
        problems = {}
        for i, url in enumerate(urls):
            if i:  # held again for each URL: the hold covers one POST, not all of them
                jobs.settle_callback(task_id, clock.now() + self._hold)
            problem = self._post(client, url, payload)
            if problem is None:
                log.info("job %s: callback delivered to %s", task_id, url, extra=extra)
                jobs.callback_delivered(task_id, url)
            else:
                problems[url] = problem
        if not problems:
            jobs.settle_callback(task_id, None)
            return
        failed = "; ".join(f"{url[:200]}: {problem}" for url, problem in problems.items())
        if attempt >= self._attempts:
            log.error(
                "job %s: callback gave up after %d attempts (%s)",
                task_id,
                attempt,
                failed,
                extra=extra,
            )
            jobs.settle_callback(task_id, None)
            return
        delay = self._first_delay * 2 ** (attempt - 1)
        log.warning(
            "job %s: callback failed (%s); retrying in %.0f s", task_id, failed, delay, extra=extra
        )
        jobs.settle_callback(task_id, clock.now() + delay)

    def _post(self, client: httpx.Client, url: str, payload: dict[str, Any]) -> str | None:
        """One delivery; None when it was taken, else what went wrong. Whatever goes wrong
        (even a URL httpx cannot use) counts as a failed attempt, so the limit holds."""
        try:
            status = outbound.post(client, url, self._timeout, self._not_self, json=payload)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:500]
        return None if 200 <= status < 300 else f"HTTP {status}"

    def _not_self(self, address: str, port: int) -> str | None:
        """This service's own API, whatever name led there: the summary would act on the
        queue (pause it, clear it), not tell anyone (the API refuses the plain spellings)."""
        if port == self._own_port() and outbound.own_address(address):
            return f"{address} port {port} is this service's own API"
        return None
