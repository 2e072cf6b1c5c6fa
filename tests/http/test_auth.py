"""The API token: made at first start into a file only the service's account reads, asked
for on loopback too; the CLI finds it there; wrong ones are logged (sparingly); nothing
that needed it is left in a cache; off only when said so, with a warning."""

from __future__ import annotations

import getpass
import json
import os
import pty
import re
import select
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServiceProcess, wait_for
from test_api_errors import assert_error

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
# Routes that answer with queue or result data, one of each kind.
PRIVATE = ("/api/v1/queue/status", "/api/v1/files", "/api/v1/events", "/metrics")
OPEN = ("/healthz", "/openapi.json", "/", "/console/static/app.js")


def cli(
    *args: str, env: dict[str, str] | None = None, wrapper: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`momentry-edge ARGS` as a user types it: no MOMENTRY_* variable, no token given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    proc = subprocess.run(
        [*wrapper, sys.executable, "-m", "momentry_edge.cli", *args],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder any account may look into, as a home folder often is: what keeps another
    account from the token is the token file's own mode, not a folder above it."""
    root = Path(tempfile.mkdtemp(prefix="momentry-auth-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@SQLITE
def test_a_default_service_asks_for_the_token_it_made_on_loopback_too(start_service):
    svc = start_service()
    token_file = svc.data_dir / "api-token"
    token = token_file.read_text().strip()
    assert svc.token == token and len(token) >= 43  # secrets.token_urlsafe(32)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

    anonymous = httpx.Client(base_url=svc.url, timeout=10)
    for path in PRIVATE:
        reply = anonymous.get(path)
        assert_error(reply, 401, "unauthorized", "bearer token")
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert_error(anonymous.post("/api/v1/queue/pause"), 401, "unauthorized")
    wrong = {"Authorization": "Bearer " + token[:-1]}
    assert_error(anonymous.get("/api/v1/queue/status", headers=wrong), 401, "unauthorized")
    for path in OPEN:  # no data in them: probes and the sign-in page need no token
        assert anonymous.get(path).status_code == 200, path
    assert svc.status()["paused"] is False

    # The token file's token opens every route; metrics as a scraper sends it.
    assert svc.client.get("/metrics").text.count("momentry_jobs{") >= 5
    with svc.client.stream("GET", "/api/v1/events") as stream:
        assert stream.status_code == 200

    # A restart keeps it; it is never written to the log, nor to stdout without a terminal.
    svc.restart()
    assert svc.client.get("/api/v1/queue/status").status_code == 200
    assert token_file.read_text().strip() == token
    assert token not in svc.log()
    assert "console:  " in svc.log() and "`momentry-edge open`" in svc.log()


def test_another_account_cannot_read_the_token_nor_use_the_api(shared_root):
    svc = ServiceProcess(shared_root / "svc", "", {})
    try:
        svc.start()
        token_file = svc.data_dir / "api-token"
        nobody = ("runuser", "-u", "nobody", "--")
        read = subprocess.run([*nobody, "cat", str(token_file)], capture_output=True, text=True)
        assert read.returncode != 0 and "Permission denied" in read.stderr
        assert svc.token not in read.stdout
        # What any account can do on loopback: ask without the token.
        for path in PRIVATE:
            asked = subprocess.run(
                [*nobody, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", svc.url + path],
                capture_output=True,
                text=True,
            )
            assert asked.stdout == "401", (path, asked.stdout, asked.stderr)
        assert svc.status()["paused"] is False
    finally:
        svc.stop()


@SQLITE
def test_the_cli_finds_the_token_and_another_account_is_told_whose_service_it_is(
    start_service, unprivileged
):
    svc = start_service()
    config = ("--config", str(svc.config_path))
    # No --token, no variable: read from the service's data dir, found as its URL is.
    assert cli(*config, "pause").returncode == 0
    assert svc.status()["paused"] is True
    assert json.loads(cli(*config, "status", "--json").stdout)["paused"] is True
    assert cli(*config, "status", "--token", "wrong-token").returncode == 1  # --token wins
    link = cli(*config, "open", "--print")
    assert link.returncode == 0 and link.stdout == f"{svc.url}/#token={svc.token}\n"

    # The file belongs to another account (the service's), as it would for anyone else's
    # CLI: this one cannot read it, and is told whose service it is and what to do.
    os.chown(svc.data_dir / "api-token", 65534, 65534)
    for command in (("status",), ("open", "--print")):
        refused = cli(*config, *command, "--url", svc.url, wrapper=tuple(unprivileged))
        assert refused.returncode == 1, refused.stderr
        assert "missing or wrong bearer token" in refused.stderr
        assert "this service belongs to account nobody" in refused.stderr
        assert "run the command as nobody, or pass --token" in refused.stderr
        assert svc.token not in refused.stdout + refused.stderr


@SQLITE
def test_doctor_and_status_of_a_fresh_account_say_whose_service_answers(start_service, tmp_path):
    svc = start_service()
    me = getpass.getuser()
    home = tmp_path / "fresh"
    home.mkdir()
    port = svc.url.rsplit(":", 1)[1]
    # A fresh account "nobody": a home of its own with nothing in it, and the default port
    # (here the service's) taken by another account's service. The account is the one
    # its login names (USER, LOGNAME), as for any account: this machine's Python is not
    # one another account may run.
    login = {"USER": "nobody", "LOGNAME": "nobody"}
    fresh = {"HOME": str(home), "MOMENTRY_SERVICE_PORT": port} | login

    doctor = cli("doctor", env=fresh)
    service = next(line for line in doctor.stdout.splitlines() if "service" in line[:12])
    assert "running at" not in service and "another account's service" in doctor.stdout
    assert f"account {me}'s, data dir {svc.data_dir}" in service, doctor.stdout
    assert "not this account's (nobody)" in service, doctor.stdout

    status = cli("status", env=fresh)
    assert f"the service at {svc.url} is account {me}'s, data dir {svc.data_dir}" in status.stderr
    assert "not this account's (nobody)" in status.stderr
    assert status.returncode == 1 and "bearer token" in status.stderr  # and its queue unseen

    # Its own account is told it is its own, and where its data is.
    mine = cli("--config", str(svc.config_path), "status")
    assert f"this account's, data dir {svc.data_dir}" in mine.stdout.splitlines()[0], mine.stdout


def test_the_run_command_on_a_terminal_prints_the_console_link(tmp_path):
    svc = ServiceProcess(tmp_path / "svc", "", {})
    main, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path), "run"],
        env=svc.env,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=subprocess.DEVNULL,
    )
    os.close(terminal)
    said = b""
    try:

        def linked() -> re.Match[bytes] | None:
            nonlocal said
            assert proc.poll() is None, said
            if select.select([main], [], [], 0.2)[0]:
                said += os.read(main, 4096)
            return re.search(rb"console:  (http://\S+/#token=(\S+))\r?\n", said)

        found = wait_for(linked, timeout=60)
        token = (svc.data_dir / "api-token").read_text().strip()
        assert found.group(2).decode() == token
        url = found.group(1).decode().split("/#")[0]
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/api/v1/queue/status", headers=headers).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        os.close(main)


@SQLITE
def test_auth_off_is_said_at_start_and_in_doctor(start_service):
    svc = start_service(service={"auth": False})
    assert not (svc.data_dir / "api-token").exists() and svc.token == ""
    assert httpx.get(f"{svc.url}/api/v1/queue/status").status_code == 200
    assert re.search(
        r"WARNING \S+: service.auth = false \(config file\): the API asks no", svc.log()
    )
    doctor = cli("--config", str(svc.config_path), "doctor", "--json")
    auth = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}["auth"]
    assert auth["level"] == "warning" and "service.auth = false" in auth["detail"]

    # Without a token, a page of another site gets none of the data, nor a stream's slot
    # (under names like a.localhost, each with connections of its own, it could take all).
    port = httpx.URL(svc.url).port
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Host": f"b.localhost:{port}"},
        {"Origin": f"http://a.localhost:{port}", "Host": f"b.localhost:{port}"},
    ):
        for path in ("/api/v1/events", "/api/v1/queue/status", "/metrics"):
            assert_error(svc.client.get(path, headers=headers), 403, "forbidden")
    with svc.client.stream("GET", "/api/v1/events", headers={"Sec-Fetch-Site": "same-origin"}) as s:
        assert s.status_code == 200  # the console's own page


def _start_failing(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\nwatch = []\n{settings}',
        encoding="utf-8",
    )
    return cli("--config", str(config), "run")


def test_a_short_token_is_refused_when_listening_beyond_loopback(tmp_path):
    short = "x" * 31
    done = _start_failing(tmp_path, f'host = "0.0.0.0"\ntoken = "{short}"\n')
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "momentry-edge: configuration error: service.token: 31 characters guard an API open "
        "to the network on '0.0.0.0': at least 32 are needed (e.g. `openssl rand -hex 16`) "
        "(config file)\n"
    )
    both = _start_failing(tmp_path, 'auth = false\ntoken = "a-token"\n')
    assert both.returncode == 2 and "service.auth: false, but service.token is set" in both.stderr
    off = _start_failing(tmp_path, 'host = "0.0.0.0"\nauth = false\n')
    assert off.returncode == 2 and "without service.token" in off.stderr


@SQLITE
def test_wrong_tokens_are_logged_once_a_minute_per_address_and_still_refused(start_service):
    svc = start_service()
    wrong = httpx.Client(base_url=svc.url, headers={"Authorization": "Bearer guess"})
    for _ in range(12):  # past the few after which each refusal waits
        assert_error(wrong.get("/api/v1/queue/status"), 401, "unauthorized")
    for _ in range(3):  # nor did those hold up the service's own account
        assert svc.status()["paused"] is False
    logged = svc.log().split("--- stderr ---")[0]  # the log file's lines
    said = [line for line in logged.splitlines() if "wrong API token" in line]
    assert len(said) == 1, said
    assert said[0].startswith("warning ") and said[0].endswith(
        ": wrong API token from 127.0.0.1: 1 refused since last said (said at most once a "
        "minute per address)"
    )


@SQLITE
def test_answers_behind_the_token_are_kept_out_of_caches(start_service):
    svc = start_service()
    task = svc.submit("kept.mp4", ["noop"])["task_id"]
    uuid = svc.wait_status(task, "completed")["file_uuid"]
    for path in (*PRIVATE, f"/api/v1/files/{uuid}", "/api/v1/no/such/route"):
        with svc.client.stream("GET", path) as reply:
            assert reply.headers["Cache-Control"] == "no-store", path
            assert reply.headers["Pragma"] == "no-cache", path
    refused = httpx.get(f"{svc.url}/api/v1/files")
    assert refused.status_code == 401 and refused.headers["Cache-Control"] == "no-store"
    for path in ("/", "/console/static/app.js"):  # nothing private: may be cached
        assert svc.client.get(path).headers["Cache-Control"] == "no-cache"
