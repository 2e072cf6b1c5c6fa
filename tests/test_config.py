"""momentry.toml and environment variables, and how bad settings are reported."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from momentry_edge import config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "momentry.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_the_documented_ones():
    cfg = config.load(env={"MOMENTRY_DATA_DIR": "/nonexistent-dir"})
    assert cfg.service.host == "127.0.0.1" and cfg.service.port == 8765
    assert cfg.queue.max_concurrent == 2 and cfg.queue.dynamic_concurrency is True
    assert (cfg.queue.max_retries, cfg.queue.retry_delay, cfg.queue.task_timeout) == (3, 10, 3600)
    assert cfg.ingest.settle_seconds == 5 and ".mov" in cfg.ingest.extensions
    assert cfg.ingest.processors == ("asr", "cut", "yolo", "ocr", "face", "pose")
    assert cfg.service.watch == (Path("~/momentry-drop").expanduser(),)


def test_environment_overrides_the_file(tmp_path):
    path = write(
        tmp_path,
        '[queue]\nmax_concurrent = 4\npoll_interval = 2\n[processors.asr]\nmodel = "tiny"\n',
    )
    env = {
        "MOMENTRY_MAX_CONCURRENT": "3",
        "MOMENTRY_QUEUE_DYNAMIC_CONCURRENCY": "false",
        "MOMENTRY_API_TOKEN": "t0k",
        "DATABASE_URL": "postgresql://db/queue",
        "MOMENTRY_INGEST_EXTENSIONS": ".mp4, .mxf",
    }
    cfg = config.load(path, env=env)
    assert cfg.queue.max_concurrent == 3
    assert cfg.queue.poll_interval == 2.0
    assert cfg.queue.dynamic_concurrency is False
    assert cfg.service.token == "t0k" and cfg.service.database_url == "postgresql://db/queue"
    assert cfg.ingest.extensions == (".mp4", ".mxf")
    assert cfg.processor_settings("asr") == {"model": "tiny"}


def test_config_file_is_found_in_the_data_dir(tmp_path):
    write(tmp_path, "[queue]\nmax_retries = 7\n")
    cfg = config.load(env={"MOMENTRY_DATA_DIR": str(tmp_path)})
    assert cfg.queue.max_retries == 7 and cfg.source == tmp_path / "momentry.toml"


@pytest.mark.parametrize(
    ("text", "env", "words"),
    [
        ("[queue]\nmax_concurrent = 0\n", {}, ["queue.max_concurrent", "at least 1"]),
        ('[queue]\nmax_concurrent = "two"\n', {}, ["queue.max_concurrent", "whole number"]),
        ("[queue]\nmax_concurent = 2\n", {}, ["unknown key queue.max_concurent"]),
        ("[queues]\n", {}, ["unknown section [queues]"]),
        ("[queue\n", {}, ["not valid TOML"]),
        ("", {"MOMENTRY_POLL_INTERVAL": "soon"}, ["queue.poll_interval", "MOMENTRY_POLL_INTERVAL"]),
        ("", {"MOMENTRY_WORKER_ENABLED": "maybe"}, ["queue.worker_enabled", "true or false"]),
        ('host = "0.0.0.0"\n', {}, ["service.host", "token"]),
        ("", {"MOMENTRY_SERVICE_PORT": "99999"}, ["service.port", "at most 65535"]),
        ("", {"MOMENTRY_SERVICE_PORT": "-1"}, ["service.port", "MOMENTRY_SERVICE_PORT"]),
        ("[ingest]\nsettle_seconds = nan\n", {}, ["ingest.settle_seconds", "finite"]),
        ("[queue]\nretry_delay = inf\n", {}, ["queue.retry_delay", "finite"]),
        ("", {"MOMENTRY_POLL_INTERVAL": "nan"}, ["queue.poll_interval", "finite"]),
        ("[queue]\ntask_timeout = -5.0\n", {}, ["queue.task_timeout", "at least 1"]),
        ("[queue]\ncpu_threshold = 250\n", {}, ["queue.cpu_threshold", "at most 100"]),
        ("[queue]\nmax_retries = 5000\n", {}, ["queue.max_retries", "at most 100"]),
        ("[queue]\nmax_concurrent = 20\n", {}, ["queue.max_concurrent", "worker_threads"]),
        ("retention_days = -1\n", {}, ["service.retention_days", "at least 0"]),
        ("[ingest]\nextensions = []\n", {}, ["ingest.extensions", "must not be empty"]),
        ("[ingest]\nextensions = 3\n", {}, ["ingest.extensions", "list of"]),
        ('watch = [""]\n', {}, ["service.watch", "non-empty"]),
        ("[queue]\nworker_threads = true\n", {}, ["queue.worker_threads", "whole number"]),
        ('log_level = "loud"\n', {}, ["service.log_level", "one of"]),
        # URLs no alert could be POSTed to, refused as a callback_url is.
        (
            "",
            {"MOMENTRY_ALERTS_URL": "http://[::1/alerts"},
            ["alerts.url: is not a valid URL", "MOMENTRY_ALERTS_URL"],
        ),
        ('[alerts]\nurl = "https://ntfy.sh:443a/t"\n', {}, ["alerts.url", "443a", "(config file)"]),
        ('[alerts]\nurl = "ntfy.sh/topic"\n', {}, ["alerts.url", "http:// or https://"]),
        # Found unusable at start-up, not at load: named as a bad value is.
        (
            'plugins = ["nosuch:X"]\n',
            {},
            ["service.plugins: cannot load processor 'nosuch:X'", "(config file)"],
        ),
        (
            f'host = "no.such.host.invalid"\ntoken = "{"t" * 32}"\n',
            {},
            ["service.host: 'no.such.host.invalid' does not resolve", "(config file)"],
        ),
        (
            'host = "192.0.2.1"\n',  # TEST-NET-1: no interface of this machine has it
            {"MOMENTRY_API_TOKEN": "t" * 32},
            ["service.host: cannot listen on 192.0.2.1:0", "(config file)"],
        ),
        # The node table holds 120 characters; logs, keys and answers hold no controls.
        (f'node_id = "{"n" * 121}"\n', {}, ["service.node_id", "at most 120 characters"]),
        ("", {"MOMENTRY_NODE_ID": "mini\nfake"}, ["service.node_id", "MOMENTRY_NODE_ID"]),
        ("", {"MOMENTRY_NODE_ID": "   "}, ["service.node_id", "visible characters"]),
        # A processor's settings that no run could use: found at start, not by every job.
        ('[processors.cut]\nthreshold = "high"\n', {}, ["processors.cut: bad cut settings"]),
        ("[processors.cut]\nthumbnails = 1\n", {}, ["processors.cut", "true or false"]),
        ("[processors.yolo]\nconfidence = 2\n", {}, ["processors.yolo: bad yolo settings"]),
        ("[processors.face]\nsample_fps = 0\n", {}, ["processors.face", "sample_fps > 0"]),
        ("[processors.asr]\nbeam = 5\n", {}, ["processors.asr: bad asr settings", "beam"]),
        # A model the catalog does not have for the processor: none of its runs could load it.
        (
            '[processors.asr]\nmodel = "yolov8n"\n',
            {},
            [
                "processors.asr: model: no faster-whisper model 'yolov8n' for asr in the model"
                " catalog (it is a model of yolo); asr's on faster-whisper: whisper-tiny.en,"
                " whisper-base (config file)"
            ],
        ),
        (
            '[processors.asrx]\nmodel = "whisper-bas"\n',
            {},
            [
                "processors.asrx: model: no faster-whisper model 'whisper-bas' for asrx",
                "whisper-base",
            ],
        ),
        (
            '[processors.yolo]\nmodel = "whisper-base"\n',
            {},
            [
                "processors.yolo: model: no onnxruntime model 'whisper-base' for yolo",
                "of asr, asrx",
            ],
        ),
        (
            '[processors.face]\nmodel = "yolov8n"\n',
            {},
            ["processors.face: unknown face model 'yolov8n'; known: mediapipe-face-full-range"],
        ),
        # Names each run records, longer than the queue's tables hold (PostgreSQL refuses).
        (f'[processors.yolo]\nmodel = "{"m" * 65}"\n', {}, ["processors.yolo", "at most 64"]),
        (
            'plugins = ["workloads:LongName"]\n',
            {"PYTHONPATH": str(Path(__file__).parent)},
            ["service.plugins", "at most 32 characters"],
        ),
    ],
)
def test_bad_settings_stop_the_service_with_exit_code_2(tmp_path, text, env, words):
    # Lines before any [table] belong to [service].
    path = write(tmp_path, f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\n' + text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(path), "run"],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    for word in words:
        assert word in done.stderr
    assert "Traceback" not in done.stderr


def run_service(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`momentry-edge --config PATH run`, expected to fail at start-up."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(path), "run"],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("where", ["the data dir", "a parent", "the logs folder"])
def test_a_data_dir_that_cannot_be_one_is_a_configuration_error(tmp_path, where):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    data_dir = {"the data dir": a_file, "a parent": a_file / "data"}.get(where, tmp_path / "data")
    if where == "the logs folder":
        data_dir.mkdir()
        (data_dir / "logs").write_text("not a folder\n")
    path = write(tmp_path, f'[service]\ndata_dir = "{data_dir}"\nport = 0\n')
    done = run_service(path)
    assert done.returncode == 2, done.stderr  # the service unit does not restart on 2
    assert done.stderr.startswith("momentry-edge: configuration error: service.data_dir: ")
    assert str(data_dir) in done.stderr and "(config file)" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_a_port_in_use_is_one_line_and_exit_1_so_the_unit_retries(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        path = write(tmp_path, f'[service]\ndata_dir = "{tmp_path / "data"}"\n')
        done = run_service(path, {"MOMENTRY_SERVICE_PORT": str(port)})
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"momentry-edge: cannot listen on 127.0.0.1:{port}: the port is in use (by another "
        "momentry-edge or another program); stop it or change service.port "
        "(environment variable MOMENTRY_SERVICE_PORT)\n"
    )


@pytest.mark.parametrize(
    ("text", "env", "source"),
    [
        ('token = "pässwörd"\n', {}, "(config file)"),
        ('token = "tab\\there"\n', {}, "(config file)"),
        ("", {"MOMENTRY_API_TOKEN": "pässwörd"}, "(environment variable MOMENTRY_API_TOKEN)"),
    ],
)
def test_a_token_no_http_header_can_carry_is_a_configuration_error(tmp_path, text, env, source):
    path = write(tmp_path, f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\n{text}')
    done = run_service(path, env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "momentry-edge: configuration error: service.token: must be visible ASCII characters "
        f"(no spaces, accents or control characters) {source}\n"
    )
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_relative_paths_in_the_file_are_the_files_neighbours(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    path = write(home, '[service]\ndata_dir = "reldata"\nwatch = ["drop", "../shared"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = config.load(path, env={})
    assert cfg.data_dir == home / "reldata"
    assert cfg.service.watch == (home / "drop", tmp_path / "shared")
    # Given in the environment, a relative path is where it was typed.
    cfg = config.load(path, env={"MOMENTRY_DATA_DIR": "envdata"})
    assert cfg.data_dir == elsewhere / "envdata"

    # The unit file `service install` would write runs in the same data dir.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    render = ("service", "render", "--platform", "linux")
    for cwd, config_arg in ((elsewhere, str(path)), (home, "momentry.toml")):
        shown = subprocess.run(
            [sys.executable, "-m", "momentry_edge.cli", "--config", config_arg, *render],
            env=clean,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert f"WorkingDirectory={home / 'reldata'}\n" in shown.stdout


def test_missing_config_file_is_reported(tmp_path):
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml", env={})


def test_every_number_has_a_range():
    # A new numeric setting declares its bounds, so the file and the environment check them.
    for section, cls in config.SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.type in ("int", "float"):
                limits = (f.metadata["minimum"], f.metadata["maximum"])
                assert None not in limits, f"{section}.{f.name} needs a minimum and a maximum"


def test_a_config_file_that_is_not_utf8_or_not_a_file_is_reported(tmp_path):
    path = tmp_path / "momentry.toml"
    path.write_bytes(b"[service]\nport = \xff\n")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.load(path, env={})
    with pytest.raises(config.ConfigError, match="is not a file"):
        config.load(tmp_path, env={})


def test_a_port_out_of_range_in_the_file_names_the_key(tmp_path):
    with pytest.raises(config.ConfigError, match=r"service.port: must be at most 65535"):
        config.load(write(tmp_path, "[service]\nport = 99999\n"), env={})


on_postgres = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)


@on_postgres
def test_libpq_parameters_in_the_database_url_are_honoured(start_service, database_url):
    import psycopg

    name = f"momentry-test-{os.getpid()}"
    svc = start_service(service={"database_url": f"{database_url}?application_name={name}"})
    svc.status()
    with psycopg.connect(database_url, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert count >= 1  # the service's own connections carry the URL's name


def _exit_of(tmp_path: Path, url: str) -> tuple[int, str]:
    """The exit code and log of `run` with ``url`` as service.database_url."""
    from conftest import ServiceProcess

    svc = ServiceProcess(tmp_path, url, {})
    svc.spawn()
    try:
        return svc.wait_exit(timeout=60), svc.log()
    finally:
        if svc.proc.poll() is None:
            svc.kill()


@on_postgres
def test_a_database_url_asking_for_tls_the_server_lacks_does_not_connect(tmp_path, database_url):
    # The test server has no TLS: psql with the same URL refuses too.
    code, said = _exit_of(tmp_path, f"{database_url}?sslmode=require")
    assert code != 0 and "server does not support SSL, but SSL was required" in said


@on_postgres
def test_an_unknown_database_url_parameter_is_a_configuration_error(tmp_path, database_url):
    code, said = _exit_of(tmp_path, f"{database_url}?sslmod=require")
    assert code == 2
    assert (
        'configuration error: service.database_url: invalid URI query parameter: "sslmod"' in said
    )


def momentry(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`momentry-edge ARGS` with only ``env``'s MOMENTRY_ variables (and DATABASE_URL...)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MOMENTRY_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *args],
        env=clean | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_error(done: subprocess.CompletedProcess, code: int, start: str) -> str:
    """The single line a refused start printed, checked: its exit code, its beginning."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "\\x0a" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(start), done.stderr
    return done.stderr


@pytest.mark.parametrize("command", [["status"], ["run"], ["backup"]])
@pytest.mark.parametrize(
    ("var", "value", "key"),
    [
        ("REDIS_URL", "redis://[::1", "service.redis_url: not a valid URL: Invalid IPv6 URL"),
        ("REDIS_URL", "redis://h:99999/1", "service.redis_url: not a valid URL: Port out of range"),
        ("DATABASE_URL", "postgresql://[::1", "service.database_url: not a valid URL"),
        ("DATABASE_URL", "sqlite://", "service.database_url: a sqlite URL names a file"),
        ("DATABASE_URL", "mysql://h/db", "service.database_url: unsupported scheme 'mysql'"),
        ("MOMENTRY_ALERTS_URL", "ntfy.sh/topic", "alerts.url: must be an http:// or https://"),
    ],
)
def test_a_url_that_is_no_url_is_a_configuration_error_for_every_command(
    tmp_path, command, var, value, key
):
    env = {"MOMENTRY_DATA_DIR": str(tmp_path / "data"), "MOMENTRY_SERVICE_PORT": "0", var: value}
    said = one_line_error(momentry(command, env), 2, f"momentry-edge: configuration error: {key}")
    assert f"(environment variable {var})" in said
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_an_unknown_key_in_the_environment_is_refused_naming_the_key_meant(tmp_path):
    env = {"MOMENTRY_DATA_DIR": str(tmp_path), "MOMENTRY_QUEUE_MAX_CONCURENT": "3"}
    for command in (["status"], ["run"]):
        said = one_line_error(momentry(command, env), 2, "momentry-edge: configuration error: ")
        assert said == (
            "momentry-edge: configuration error: MOMENTRY_QUEUE_MAX_CONCURENT: unknown key "
            "queue.max_concurent (environment variable); did you mean "
            "MOMENTRY_QUEUE_MAX_CONCURRENT?\n"
        )
    # A file's typo is named with the key meant too.
    path = write(tmp_path, "[queue]\nmax_concurent = 3\n")
    with pytest.raises(config.ConfigError, match=r"did you mean queue\.max_concurrent\?"):
        config.load(path, env={})


def test_momentry_variables_that_are_not_settings_keys_are_not_refused():
    # Every MOMENTRY_ name the project uses (scripts/test, scripts/build, the tests, ...):
    # those of other tools share the prefix and must not stop the service.
    root = Path(__file__).resolve().parent.parent
    found = subprocess.run(
        ["git", "grep", "-ohE", r"MOMENTRY_[A-Z0-9_]+"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # Less the typo this file and docs/configuration.md show refused.
    names = set(found) - {"MOMENTRY_", "MOMENTRY_QUEUE_MAX_CONCURENT"}
    assert {"MOMENTRY_TEST_WORKERS", "MOMENTRY_BUILD_BACKENDS", "MOMENTRY_CONFIG"} <= names
    for name in sorted(names):
        try:
            config.load(env={"MOMENTRY_DATA_DIR": "/nonexistent-dir", name: "1"})
        except config.ConfigError as exc:
            assert "unknown key" not in str(exc), name  # a bad value of a real key is fine


@pytest.mark.parametrize(
    ("args", "env", "key"),
    [
        ([], {"MOMENTRY_DATA_DIR": "/tmp/x\nExecStartPre=/bin/touch /tmp/pwn"}, "service.data_dir"),
        ([], {"MOMENTRY_SERVICE_WATCH": "/tmp/drop\x01"}, "service.watch"),
        (["--config", "/tmp/a\nb.toml"], {}, "config file"),
        ([], {"MOMENTRY_CONFIG": "/tmp/a\rb.toml"}, "config file"),
    ],
)
def test_a_path_with_a_control_character_is_refused(tmp_path, args, env, key):
    env = {"HOME": str(tmp_path), "MOMENTRY_DATA_DIR": str(tmp_path / "data")} | env
    for platform in ("linux", "macos"):
        done = momentry([*args, "service", "render", "--platform", platform], env)
        said = one_line_error(done, 2, f"momentry-edge: configuration error: {key}: ")
        assert "must not contain control characters" in said
        assert done.stdout == ""  # no unit or plist


def test_a_symlink_loop_is_named_as_one(tmp_path):
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    loop = str(tmp_path / "l1")
    for args, env, key in (
        (["run"], {"MOMENTRY_DATA_DIR": loop}, "service.data_dir"),
        (["status"], {"MOMENTRY_DATA_DIR": loop}, "service.data_dir"),
        (["run"], {"MOMENTRY_SERVICE_WATCH": loop}, "service.watch"),
        (["--config", loop, "status"], {}, f"config file {loop}"),
    ):
        env = {"MOMENTRY_DATA_DIR": str(tmp_path / "data"), "MOMENTRY_SERVICE_PORT": "0"} | env
        said = one_line_error(momentry(args, env), 2, f"momentry-edge: configuration error: {key}")
        assert f"{loop} is a symlink loop" in said or f"{loop}: is a symlink loop" in said


def test_a_home_folder_of_no_user_is_a_configuration_error(tmp_path):
    env = {"MOMENTRY_DATA_DIR": "~no-such-user-here/data"}
    said = one_line_error(momentry(["status"], env), 2, "momentry-edge: configuration error: ")
    assert "service.data_dir: cannot expand '~no-such-user-here': no such user" in said
