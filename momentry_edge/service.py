"""`momentry-edge run`: database + workers + HTTP in one process, started and stopped in order."""

# One piece (~710 lines): the Service that wires the parts, and the start-up's own
# checks and messages.

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import secrets
import signal
import socket
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from . import (
    __version__,
    afresh,
    apitoken,
    cluster,
    datalock,
    jobs,
    logs,
    outputs,
    privacy,
    redact,
    registry,
    runfile,
    settings,
    store,
    watch_folders,
    weights,
)
from .clock import iso
from .config import Config, ConfigError
from .errors import Conflict, Invalid
from .events import bus
from .http.app import make_app
from .http.server import BaseWSGIServer, start_server, stop_server
from .ingest import intake, paths
from .ingest.watcher import Watcher
from .jobs import order, views
from .jobs.capacity import Here, StrandWatch
from .jobs.stalls import StallWatch
from .processors import Registry
from .provision import Provisioner
from .search import index as search_index
from .search import meaning as search_meaning
from .sidecars.alerts import AlertSender
from .sidecars.callbacks import CallbackSender
from .store import Job, JobStatus, MediaFile
from .upkeep import backup, dbcheck, housekeeping
from .worker.dispatch import Workers
from .worker.gate import Gate, disk_space

if TYPE_CHECKING:
    from .sidecars.mirror import RedisMirror

log = logging.getLogger(__name__)

TICK = 1.0  # main loop period, seconds
SAMPLE_EVERY = 2.0  # resource monitor period
HEALTH_EVERY = 10.0  # worker thread health check period
SWEEP_EVERY = 3600.0  # retention sweep period
BACKUP_STOP_WAIT = 30.0  # at stop, for a scheduled backup to end (backup.STOP_GRACE, cleanup)
DAY = 86400.0


class Service:
    # One piece (~440 lines): start, the main loop and stop wire the same parts.
    def __init__(self, config: Config) -> None:
        check_bind_address(config)
        self.config = config
        self.stopping = threading.Event()
        self._held: int | None = None  # the data dir's lock (datalock), while this runs
        self.node = config.service.node_id or socket.gethostname()
        self.owner = f"{self.node}/{os.getpid()}/{secrets.token_hex(3)}"
        weights.use_data_dir(config.data_dir)  # before any processor looks for its model
        self.registry = _registry(config)
        self.gate = Gate(config.queue)
        self._failing = logs.Repeats(log)  # housekeeping steps failing at every tick
        self.job_lines = logs.JobLines()  # each job's lines, for the database (PostgreSQL)
        # Missing models the processors need are pulled in the background (provision.py);
        # a node that runs no jobs has no use for them.
        auto_pull = config.models.auto_pull and config.queue.worker_enabled
        self.provision = Provisioner(
            self.registry,
            config.processors,
            auto_pull,
            self._models_changed,
            keep_free=int(config.queue.min_free_disk_mb * weights.MB),
        )
        self.workers = Workers(
            config, self.registry, self.gate, self.node, self.owner, self.provision
        )
        # Drop folders: settled files and rescans go through the intake (intake.py).
        self.intake = intake.Intake(
            config.service.watch,
            config.ingest.extensions,
            config.ingest.settle_seconds,
            _default_processors(self.registry, config),
            config.queue.max_retries,
        )
        self.watcher = Watcher(self.intake, config.ingest.settle_seconds)
        self.server: BaseWSGIServer | None = None
        self._http: threading.Thread | None = None  # the server's loop
        self.notifier: cluster.Notifier | None = None
        self.callbacks = CallbackSender(self._callback_payload, own_port=lambda: self.port)
        # Optional outside copies and notices; each runs on its own thread, fed by the bus.
        self.mirror = _redis_mirror(config.service.redis_url)
        self.alerts = AlertSender(config.alerts.url, self.node) if config.alerts.url else None
        self.node_watch = cluster.NodeWatch(self.node, config.queue.lease_seconds)
        queue = config.queue
        self.stall_watch = StallWatch(self.node, queue.lease_seconds, queue.stall_seconds)
        self.strand_watch = StrandWatch(self.here, grace=queue.lease_seconds)
        # Leases and last_seen on a thread of their own: no housekeeping step holds them up.
        self.heartbeat = cluster.Heartbeat(self._beat, config.queue.lease_seconds / 3)
        self._backup: threading.Thread | None = None  # the scheduled backup under way
        # Results made before the search index existed, indexed in the background.
        self.search_backfill = search_index.Backfill(config.data_dir)
        # Moments' meanings, embedded in the background once the sentence model is in place.
        self.search_embedder = search_meaning.Embedder()
        self.url = ""
        self.port: int | None = None  # the API's, once it listens
        self.token = ""  # what the API requires (apitoken.effective), set at start
        self._threads: list[threading.Thread] = []
        self.exit_code = 0  # what `run` returns once stopped
        # Idle with its models let go (models.idle_restart): `run` then starts afresh,
        # handing the new image the API's listening socket (kept open here).
        self.restart = False
        self.listener: int | None = None

    # -- what the API calls (api.Core) ----------------------------------------------------------

    @property
    def processor_names(self) -> tuple[str, ...]:
        return tuple(self.registry.names)

    def effective_limit(self) -> int:
        """Jobs this node may run at once now."""
        return self.workers.effective_limit()

    def here(self) -> Here:
        """This node as the waiting line's estimates see it (jobs/capacity.py)."""
        return Here(self.node, self.workers.effective_limit(), self.config.queue.lease_seconds)

    def drain(self, drained: bool, via: str) -> int:
        """Drain this node (its running jobs finish, it starts no new one), or undo that;
        how many jobs it runs. Kept until undone or the service stops."""
        self.workers.drained = drained
        # Other nodes read it from the node's row: what they say of jobs only it can run.
        if self.config.queue.worker_enabled:
            cluster.set_worker(self.node, self.owner, "drained" if drained else "on")
            cluster.heartbeat(self.node, self.owner, self.workers.effective_limit())
        running = len(self.workers.in_hand())
        if drained:
            log.info(
                "node %s drained through %s: %d running job(s) finish, none starts here",
                self.node,
                via,
                running,
            )
        else:
            log.info("node %s takes jobs again (drain undone through %s)", self.node, via)
            self.workers.kick()
        return running

    def jobs_in_hand(self) -> set[int]:
        """Ids of the jobs this node's workers run now."""
        return self.workers.in_hand()

    def submit(
        self,
        record: MediaFile,
        processors: Any,
        priority: Any,
        options: dict[str, Any] | None = None,
    ) -> tuple[Job, bool]:
        names = self.registry.validate(processors)
        return jobs.submit(
            record,
            names,
            priority=jobs.parse_priority(priority),
            max_retries=self.config.queue.max_retries,
            options=options,
        )

    def register(
        self,
        raw_path: str,
        *,
        upload_ok: bool = True,
        scan: bool = True,
        processors: Any = None,
        priority: Any = "normal",
        options: dict[str, Any] | None = None,
    ) -> tuple[MediaFile, Job | None, bool]:
        """Record a file from a watched folder and (unless scan is False) queue its deep scan."""
        if processors is not None:
            processors = self.registry.validate(processors)
        level = jobs.parse_priority(priority)
        path, root = paths.resolve_in_watch(raw_path, self.config.service.watch)
        admitted = self.intake.register(
            path,
            root,
            upload_ok=upload_ok,
            scan=scan,
            processors=processors,
            priority=level,
            options=options,
        )
        return admitted.record, admitted.job, admitted.created

    def rescan(self) -> dict[str, int]:
        """Reconcile the watched folders with the database now (the rescan route)."""
        return self.watcher.rescan()

    def _callback_payload(self, task_id: str) -> tuple[list[str], dict[str, Any]]:
        job = jobs.find_job(task_id)
        urls = jobs.owed_callbacks(job)
        if not urls:
            return [], {}
        detail = views.job_detail(job, self.here())
        return urls, {"event": "job.finished", "job": detail}

    def queue_status(
        self, limit: int = 50, offset: int = 0, shown: order.Shown = order.EVERY_WAITING_JOB
    ) -> dict[str, Any]:
        extra = {
            "nodes": cluster.node_rows(within=self.config.queue.lease_seconds),
            "blocked_reason": self.gate.blocked_reason,  # why nothing starts, besides a pause
            "models": self.provision.status(),  # models pulled at this start, and how far
            "warnings": watch_folders.problems(self.config.service.watch) + self.watcher.warnings(),
            "disk": disk_space(self.config, *outputs.written_folders(self.config.data_dir)),
            "last_backup": backup.last_backup(self.config.data_dir),
            "drained": self.workers.drained,  # this node's: it starts no job (drain)
            "worker_enabled": self.config.queue.worker_enabled,  # this node's
            # Where files go, for the console to say while it has none.
            "drop_folders": [str(folder) for folder in self.config.service.watch],
            "upload_address": self.config.service.upload_address or None,
        }
        stall = self.config.queue.stall_seconds
        return views.queue_status(
            self.here(),
            self.gate.load,
            extra,
            self.node,
            limit,
            offset,
            stall_after=stall,
            shown=shown,
        )

    def processors(self) -> dict[str, dict[str, Any]]:
        """``GET /api/v1/processors``: readiness, and the pull of a model still coming."""
        return self.provision.describe(self.workers.explain(self.registry.describe()))

    def _listed(self) -> list[str]:
        """The processors this node's row lists: none where it runs no jobs, so that no
        other node leaves a job waiting for it."""
        return sorted(self.workers.can_run) if self.config.queue.worker_enabled else []

    def _models_changed(self) -> None:
        """A pulled model is in place (or a pull failed): run what can run now."""
        self.workers.update_processors()  # wakes the workers, if they run
        try:  # the node row other nodes read (provision starts after register_node)
            cluster.set_processors(self.node, self.owner, self._listed())
        finally:
            store.release_connection()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the database, recover what a crash left, then start serving and working."""
        # Before anything is written: the database, logs, backups are private.
        gid = privacy.apply(self.config)
        _prepare_data_dir(self.config)
        try:
            logs.setup(self.config.data_dir, self.config.service.log_level)
        except OSError as exc:  # e.g. <data_dir>/logs is a file
            raise self.config.error(
                "service.data_dir", f"cannot write logs to {exc.filename}: {exc.strerror}"
            ) from None
        # Before the database opens: SQLite gives its -wal and -shm the database's mode.
        privacy.secure_data_dir(
            self.config.data_dir, outputs.results_root(self.config.data_dir), gid
        )
        self._hold_data_dir()
        q = self.config.queue
        # The database's own errors at start (a file that cannot be opened or written, a
        # full disk, a server that is down) become one line here, not one try per step.
        try:
            # A damaged SQLite file stops the start here, before anything reads or writes it.
            database = dbcheck.connect_checked(self.config)
            cluster.sync_clock(database)  # before anything is stamped with the queue's time
            try:
                worker = "on" if q.worker_enabled else "off"
                cluster.register_node(self.node, self.owner, self._listed(), worker=worker)
            except Conflict as exc:  # not a setting: the holder may be stopping still
                raise NodeIdInUse(f"cannot start: service.node_id: {exc.message}") from None
            if store.is_postgres(database) and datalock.restoring(database):
                where = store.safe_url(self.config.service.database_url)
                raise StartFailed(
                    f"cannot start: a restore into {where} is under way; start the service "
                    "once it has ended"
                )
            # Into its row; one kept from the API is cut to the threads there are now.
            jobs.init_queue_state(
                q.max_concurrent, q.dynamic_concurrency, self.node, ceiling=q.worker_threads
            )
        # Operational errors only: any other is a bug, and its traceback is wanted.
        except (OSError, sqlite3.OperationalError, *store.OUTAGE_ERRORS) as exc:
            raise database_error(self.config, exc) from None
        self.token = self._api_token()  # after the database: a full disk is said of it first
        if store.is_postgres(database):  # nodes share no disk: each job's lines go there too
            logging.getLogger().addHandler(self.job_lines)
        self.notifier = cluster.Notifier(database, on_wake=self.workers.kick)
        bus.listen(self.notifier.on_event)
        bus.listen(self.callbacks.on_event)
        self.callbacks.start()
        if self.alerts is not None:
            bus.listen(self.alerts.on_event)  # before the first disk check, so it can alert
            self.alerts.start()
        if self.mirror is not None:
            bus.listen(self.mirror.on_event)
            self.mirror.start()  # its first act is a full resync from the job table
        self.gate.check_disk(*outputs.written_folders(self.config.data_dir))
        self.heartbeat.start()  # before any job is in hand
        recovered = jobs.reap(self.node, self.owner, self.workers.policy)
        self.workers.document_failures(recovered)
        if recovered:
            log.warning(
                "recovered %d job(s) a previous run left unfinished: %s",
                len(recovered),
                ", ".join(recovered),
            )
        self._start_http()
        self.provision.start()  # in the background: the API and the workers do not wait
        if q.worker_enabled:
            self.workers.start()
            self.notifier.start()
        self.watcher.start()  # its first act is the start-up rescan
        self.search_backfill.start()
        self.search_embedder.start()
        self._write_run_file()
        log.info("momentry-edge %s listening on %s (node %s)", __version__, self.url, self.node)
        self._announce()

    def _api_token(self) -> str:
        try:
            token = apitoken.effective(self.config)
        except OSError as exc:
            where = apitoken.path(self.config.data_dir)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # may pass: exit 1, tried again
                raise StartFailed(f"cannot start: the disk holding {where} is full") from None
            raise self.config.error(
                "service.data_dir",
                f"cannot keep the API token in {where}: {exc.strerror}",
            ) from None
        if not token:
            log.warning(
                "service.auth = false (%s): the API asks no token; any account on this "
                "machine can read every result and steer the queue",
                self.config.origin("service.auth"),
            )
        return token

    def _announce(self) -> None:
        """Where it listens and what it watches, on stdout even without a terminal (the
        log on stderr keeps to problems then): the first thing an operator looks for."""
        watch = self.config.service.watch
        watching = ", ".join(map(str, watch)) if watch else "nothing (a processing-only node)"
        lines = [
            f"momentry-edge {__version__} listening on {self.url}",
            f"  watching: {watching}",
            f"  data dir: {self.config.data_dir} (log: logs/momentry-edge.log)",
            f"  settings: {self.config.source or 'defaults and environment'}",
        ]
        if not self.config.queue.worker_enabled:
            lines.append("  runs no jobs (queue.worker_enabled = false)")
        lines.append(f"  console:  {self._console_link()}")
        print("\n".join(lines), flush=True)

    def _console_link(self) -> str:
        """The console's address, signed in (the token in the fragment, which no server
        log keeps) when a person reads it on a terminal; else how to get that link, as
        stdout may go to a log file other accounts can read."""
        if not self.token:
            return f"{self.url}/ (no token: service.auth = false)"
        if self.config.service.token:
            return f"{self.url}/ (sign in with service.token)"
        if sys.stdout.isatty():
            return f"{self.url}/#token={self.token}"
        return f"{self.url}/ (`momentry-edge open` opens it signed in)"

    def run_forever(self) -> None:
        """The main thread's loop: housekeeping until a signal sets ``stopping``."""
        # The watcher did the start-up rescan; the next one is a full interval away.
        due: dict[str, float] = {"rescan": time.monotonic() + self.config.ingest.rescan_interval}
        every = {
            "sample": SAMPLE_EVERY,
            "database_file": SAMPLE_EVERY,
            "nodes": self.config.queue.lease_seconds / 3,
            "run_file": self.config.queue.lease_seconds / 3,
            "reap": self.config.queue.poll_interval,
            "poll": self.config.queue.poll_interval,
            "health": HEALTH_EVERY,
            "models": TICK,
            "rescan": self.config.ingest.rescan_interval,
            "sweep": SWEEP_EVERY,
            "job_log": TICK,
        }
        if self.config.service.backup_interval:
            every["backup"] = self.config.service.backup_interval
            due["backup"] = time.monotonic() + self.config.service.backup_interval
        while not self.stopping.wait(min(TICK, self.config.queue.poll_interval)):
            now = time.monotonic()
            for name, period in every.items():
                if now >= due.get(name, 0):
                    due[name] = now + period
                    self._housekeeping(name)

    def _beat(self) -> None:
        """The heartbeat (cluster.Heartbeat's thread): the leases of the jobs in hand, and
        this node's last_seen with the limit it runs by."""
        try:
            self.workers.renew_leases()
            cluster.heartbeat(self.node, self.owner, self.workers.effective_limit())
        except Exception as exc:
            if not store.disk_full(exc):
                raise  # said by the heartbeat's thread
            # The queue database's disk: said by the gate (once a minute), which holds
            # starts back until a write gets through.
            self.workers.note_database_full(exc)
        else:
            self.gate.database_writable()  # a write to the database got through

    def _housekeeping(self, task: str) -> None:
        try:
            if task == "sample":
                # The disk first: it needs no database, which may be what is failing.
                # queue.unblocked wakes the workers.
                self.gate.check_disk(*outputs.written_folders(self.config.data_dir))
                self.gate.sample(jobs.queue_state(self.node).max_concurrent)
            elif task == "database_file":
                if problem := store.file_replaced():
                    self._stop_for(problem)
            elif task == "nodes":
                self.node_watch.check()  # a node whose heartbeat stopped: node.lost
                self.stall_watch.check()  # a running job with no progress: job.stalled
                self.strand_watch.check()  # waiting jobs no node can run: queue.stranded
                cluster.sync_clock(store.Job._meta.database)  # a clock set right meanwhile
            elif task == "reap":
                reaped = jobs.reap(
                    self.node, self.owner, self.workers.policy, in_hand=self.workers.in_hand()
                )
                self.workers.document_failures(reaped)
            elif task == "run_file":
                self._keep_run_file()
            elif task == "poll":
                self.workers.poll()
            elif task == "health" and self.config.queue.worker_enabled:
                self.workers.check_health()
            elif task == "models":
                if self.workers.release_models() and self.config.models.idle_restart:
                    self._start_afresh()
            elif task == "sweep":
                # Also at the first tick, for what a crash left; retention_days 0 keeps all
                # results, not the temp files.
                days = self.config.service.retention_days
                housekeeping.sweep(self.config.data_dir, days * DAY if days else None)
            elif task == "rescan":
                self.watcher.request_rescan()  # runs on the ingest thread, not this one
            elif task == "backup":
                self._start_backup()
            elif task == "job_log":
                jobs.keep_log(self.job_lines, self.node)
        except Exception as exc:
            if store.disk_full(exc) and task not in ("sweep", "run_file"):
                # The queue database's disk: said by the gate (once a minute), which holds
                # starts back until a write gets through; the next tick tries again.
                self.workers.note_database_full(exc)
                return
            # The database may be briefly unreachable, the descriptors or the disk run
            # out; the next tick tries again (the same failure said once a minute).
            self._failing.failed(f"housekeeping step {task!r}", exc)
        else:
            self._failing.worked(f"housekeeping step {task!r}")

    def _start_backup(self) -> None:
        """The scheduled backup, on a thread of its own: a pg_dump waiting for a lock or a
        long copy holds up no other housekeeping step. One at a time."""
        if self._backup is not None and self._backup.is_alive():
            log.info("scheduled backup not started: the last one is still under way")
            return
        self._backup = threading.Thread(target=self._take_backup, name="backup", daemon=True)
        self._backup.start()

    def _take_backup(self) -> None:
        try:
            backup.scheduled(self.config, stop=self.stopping)  # the stop cuts it short
        except Exception as exc:
            self._failing.failed("scheduled backup", exc)
        else:
            self._failing.worked("scheduled backup")

    def _stop_for(self, problem: str) -> None:
        """Stop with exit code 1, which the service manager restarts after (not 2)."""
        log.error("%s; stopping, to be started again on the file now there", problem)
        self.exit_code = 1
        self.stopping.set()

    def _start_afresh(self) -> None:
        """Stop, then start again in this process: what the model libraries keep once used
        (some 300 MiB) goes back to the system. Not while a job is in hand."""
        if self.workers.in_hand():
            return
        log.info(
            "idle, models let go: starting afresh (pid %d stays) to give back the memory "
            "their libraries keep; the next job loads them again",
            os.getpid(),
        )
        self.restart = True
        self.stopping.set()

    def stop(self) -> None:
        """Shut down in order, each step bounded."""
        self.stopping.set()
        bus.publish("service.stopping")  # wakes event-stream readers so they end
        # 0. Stop watching: nothing new is registered while we shut down.
        self.watcher.stop()
        # 1. Stop taking requests.
        if self.server is not None:
            if self.restart:  # the new image listens on it: requests meanwhile wait
                self.listener = os.dup(self.server.socket.fileno())
            stop_server(self.server, self._http)
        self.provision.stop()  # a pull in progress stops; the next start resumes it
        self.search_backfill.stop()
        self.search_embedder.stop()
        # 2. Running processors stop at their next report and go back to the line.
        if self.workers.started:
            self.workers.stop()
        if self.notifier is None:
            self._let_go()
            return  # start-up failed before the database was ready
        self.notifier.stop()
        self.callbacks.stop()
        # No beat after the node has left (it would look alive again), nor renewing the
        # leases of the jobs about to go back in line.
        self.heartbeat.stop()
        # 3. Anything still held (a processor that never reported) goes back too.
        try:
            held = Job.select().where(
                Job.lease_owner == self.owner, Job.status == JobStatus.PROCESSING
            )
            for job in list(held):
                jobs.requeue(job, self.owner)
            cluster.leave(self.node, self.owner)
            logging.getLogger().removeHandler(self.job_lines)
            jobs.keep_log(self.job_lines, self.node)  # the last lines, their stop's too
        except store.OUTAGE_ERRORS as exc:
            # The next start-up (or another node, once the leases run out) recovers them.
            log.error("could not return running jobs to the line at stop: %s", exc)
        if self.mirror is not None:
            self.mirror.stop()  # after the requeues above, which it writes on its way out
        if self.alerts is not None:
            self.alerts.stop()
        # 4. A scheduled backup under way saw ``stopping``: it ends its pg_dump or copy and
        # removes its unfinished folder, before the data dir is let go (restore waits).
        if self._backup is not None:
            self._backup.join(BACKUP_STOP_WAIT)
            if self._backup.is_alive():
                log.warning("the scheduled backup did not end within %g s", BACKUP_STOP_WAIT)
        runfile.remove(self.config.data_dir, self.owner)
        registry.unregister(self.owner)
        store.Job._meta.database.close()
        self._let_go()
        log.info("stopped")

    def _hold_data_dir(self) -> None:
        """Held until the stop: a restore is refused meanwhile, and one under way now
        refuses this start, from its first step to its last."""
        try:
            self._held = datalock.share(self.config.data_dir)
        except datalock.Held:
            raise StartFailed(
                f"cannot start: a restore into {self.config.data_dir} is under way; start "
                "the service once it has ended"
            ) from None
        except OSError as exc:
            raise self.config.error(
                "service.data_dir", f"cannot open {self.config.data_dir}: {exc.strerror}"
            ) from None

    def _let_go(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def _start_http(self) -> None:
        host, port = self.config.service.host, self.config.service.port
        try:
            self.server, bound = start_server(make_app(self), host, port)
        except OSError as exc:
            raise _bind_error(self.config, exc) from None
        self.url, self.port = f"http://{_url_host(host)}:{bound}", bound
        self._http = threading.Thread(target=self.server.run, name="http", daemon=True)
        self._http.start()
        self._threads.append(self._http)

    def _write_run_file(self) -> None:
        runfile.write(self.config.data_dir, self._run_info())
        registry.register(self._registry_entry())

    def _keep_run_file(self) -> None:
        """Write run.json again if no live process holds it: services sharing a data dir,
        the last started has it, and once that one has stopped and removed it, another."""
        if runfile.holder(self.config.data_dir) is None:
            runfile.write(self.config.data_dir, self._run_info())
        if not registry.registered():  # e.g. the folder was emptied by hand
            registry.register(self._registry_entry())

    def _registry_entry(self) -> dict[str, Any]:
        config = self.config
        return self._run_info() | {
            "data_dir": str(config.data_dir),
            "config": str(config.source) if config.source else None,
            "settings": settings.effective(config),
        }

    def _run_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "url": self.url,
            "node": self.node,
            "owner": self.owner,  # whose file it is: only that process removes it
            "started_at": iso(time.time()),
        }


def run(config: Config) -> int:
    """Run the service until SIGINT/SIGTERM; returns the exit code."""
    service = Service(config)

    def on_signal(signum: int, frame: Any) -> None:
        if not service.stopping.is_set():
            service.stopping.set()  # the main loop does the rest
            return
        # A second Ctrl-C: the user will not wait for the orderly shutdown. Leave now; jobs
        # this process holds go back in line when their lease expires, as after kill -9.
        os.write(2, b"momentry-edge: interrupted again, exiting without waiting\n")
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        service.start()
        service.run_forever()
    finally:
        service.stop()
    if service.restart:
        afresh.start_afresh(service.listener)  # returns only if that failed
        return 1  # the service manager starts it again
    return service.exit_code


class StartFailed(Exception):
    """A state of the machine stops the start (a full disk, a database server that is
    down), not a setting: exit 1, and the service manager tries again later."""


class PortInUse(StartFailed):
    """The API's port is taken. Not a configuration error: the holder may be an instance
    that is stopping, so a restart (the service manager's, after exit 1) can help."""


class NodeIdInUse(StartFailed):
    """A live process on this host holds the node id: as with the port, it may be an
    instance that is stopping (the service restarted at once), so exit 1."""


def database_error(config: Config, exc: Exception) -> Exception:
    """What an error opening the queue database at start means, in one line: a
    ConfigError (exit 2) when a setting or the files' permissions must change, else
    StartFailed (exit 1) for what may pass (a full disk, a server that is down)."""
    url = config.service.database_url
    key = "service.database_url" if url else "service.data_dir"
    text = redact.scrub(_one_line(exc), url)
    if url.startswith(("postgres://", "postgresql://")):
        where = store.safe_url(url)
        text = text.split("; ")[0]  # libpq's hint lines ("Is the server running ...") aside
        if "authentication failed" in text or "does not exist" in text:
            return config.error(key, f"{where}: {text}")
        return StartFailed(
            f"cannot connect to the database at {where}: {text}; check that the server is "
            f"running and reachable, and {key} ({config.origin(key)})"
        )
    path = backup.sqlite_path(config)
    code = getattr(exc, "errno", None)
    lowered = text.lower()
    if code in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in lowered:
        return StartFailed(f"cannot start: the disk holding {path} is full; free some space")
    if code in (errno.EACCES, errno.EPERM):
        name = getattr(exc, "filename", None) or path
        return config.error(key, f"cannot open {name}: {getattr(exc, 'strerror', text)}")
    if code == errno.EISDIR or (path is not None and os.path.isdir(path)):
        return config.error(key, f"{path} is a directory, not a database file")
    if "readonly" in lowered:
        return config.error(
            key, f"{path} is read-only: the service's user must be able to write it and its folder"
        )
    if "unable to open" in lowered and path is not None:
        if not os.path.isdir(path.parent):
            return config.error(key, f"cannot open {path}: the folder {path.parent} does not exist")
        return config.error(
            key,
            f"cannot open {path}: the service's user must be able to read and write it and "
            "its folder",
        )
    # An I/O error, a lock held past the timeout: what a restart may get past.
    return StartFailed(f"cannot open the database {path}: {text}")


def _one_line(exc: Exception) -> str:
    """A driver's message (psycopg's run over lines) as one line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _bind_error(config: Config, exc: OSError) -> Exception:
    """What a failure to listen means: a port in use may free up; the rest never will."""
    host, port = config.service.host, config.service.port
    where = f"{_url_host(host)}:{port}"
    if isinstance(exc, socket.gaierror):
        return config.error("service.host", f"{host!r} does not resolve: {exc.strerror}")
    if exc.errno == errno.EADDRINUSE:
        return PortInUse(
            f"cannot listen on {where}: the port is in use (by another momentry-edge or "
            f"another program); stop it or change service.port ({config.origin('service.port')})"
        )
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EACCES:
        return config.error("service.port", f"not allowed to listen on {where}: {reason}")
    return config.error("service.host", f"cannot listen on {where}: {reason}")


def _prepare_data_dir(config: Config) -> None:
    """Make the data dir, or say why it cannot be one (a restart would not help)."""
    path = config.data_dir
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise config.error("service.data_dir", f"{path} is not a directory") from None
    except OSError as exc:
        raise config.error("service.data_dir", f"cannot create {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise config.error("service.data_dir", f"{path} is not writable")


def _registry(config: Config) -> Registry:
    try:
        registry = Registry(config.service.plugins, config.processors)
    except ValueError as exc:  # a plugin that cannot be imported, or is not a Processor
        raise config.error("service.plugins", str(exc)) from None
    for name, problem in registry.settings_problems().items():  # the first, if any
        raise ConfigError(f"processors.{name}: {problem} (config file)")
    return registry


def _redis_mirror(url: str) -> RedisMirror | None:
    if not url:
        return None  # redis-py not loaded either
    from .sidecars.mirror import RedisMirror

    try:
        return RedisMirror(url)
    except ValueError as exc:  # redis-py's word for a URL it cannot use
        raise ConfigError(f"service.redis_url: {exc}") from None


def _default_processors(registry: Registry, config: Config) -> list[str]:
    """[ingest].processors, checked at start-up rather than at the first dropped file."""
    if not config.ingest.processors:
        return []  # register dropped files, queue nothing
    try:
        return registry.validate(list(config.ingest.processors))
    except Invalid as exc:
        raise ConfigError(f"ingest.processors: {exc.message}") from None


def check_bind_address(config: Config) -> None:
    host, token = config.service.host, config.service.token
    if not config.service.auth and token:
        raise config.error(
            "service.auth", "false, but service.token is set: remove one or the other"
        )
    if _is_loopback(host):
        return
    if not token:
        raise ConfigError(
            f"service.host: refusing to listen on {host!r} without service.token "
            "(set MOMENTRY_API_TOKEN, or bind 127.0.0.1)"
        )
    if len(token) < apitoken.MIN_REMOTE_LENGTH:
        # The token itself is not repeated: the message goes to logs and terminals.
        raise config.error(
            "service.token",
            f"{len(token)} characters guard an API open to the network on {host!r}: at "
            f"least {apitoken.MIN_REMOTE_LENGTH} are needed (e.g. `openssl rand -hex 16`)",
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
