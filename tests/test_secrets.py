"""Passwords and keys in the settings' URLs are never shown: not by `config show`, a
failed start or the log, nor on the command line of the pg_dump a backup runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_for

DB_PW, REDIS_PW, ALERT_KEY, USER_KEY = "db-pw-4821", "redis-pw-9034", "alert-key-5120", "nt-7731"


def cli(*args: str, env: dict[str, str], config: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_config_show_masks_every_secret_in_a_url(tmp_path: Path) -> None:
    config = tmp_path / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 1\n'
        f'redis_url = "redis://:{REDIS_PW}@127.0.0.1:1/0"\n'
        f'[alerts]\nurl = "https://{USER_KEY}@ntfy.example/topic?auth={ALERT_KEY}&x=1"\n'
    )
    env = {"DATABASE_URL": f"postgresql://edge@127.0.0.1:1/queue?sslmode=disable&password={DB_PW}"}
    shown = cli("config", "show", env=env, config=config)
    as_json = cli("config", "show", "--json", env=env, config=config)
    for proc in (shown, as_json):
        assert proc.returncode == 0, proc.stderr
        for secret in (DB_PW, REDIS_PW, ALERT_KEY, USER_KEY):
            assert secret not in proc.stdout + proc.stderr
    rows = {row["key"]: row["value"] for row in json.loads(as_json.stdout)["settings"]}
    assert rows["service.database_url"] == (
        "postgresql://edge@127.0.0.1:1/queue?sslmode=disable&password=***"
    )
    assert rows["service.redis_url"] == "redis://:***@127.0.0.1:1/0"
    assert rows["alerts.url"] == "https://***@ntfy.example/topic?auth=***&x=1"


def test_a_failed_start_masks_the_database_password(tmp_path: Path) -> None:
    config = tmp_path / "momentry.toml"
    config.write_text(f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\nwatch = []\n')
    url = f"postgresql://edge@127.0.0.1:1/queue?connect_timeout=2&password={DB_PW}"
    proc = cli("run", env={"DATABASE_URL": url}, config=config)
    assert proc.returncode == 1, proc.stderr
    assert "cannot connect to the database at postgresql://edge@127.0.0.1:1/queue" in proc.stderr
    assert "password=***" in proc.stderr
    logged = "".join(p.read_text() for p in (tmp_path / "data" / "logs").glob("*"))
    assert DB_PW not in proc.stderr + proc.stdout + logged


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_pg_dump_gets_the_password_in_its_environment_not_its_command_line(
    start_service, database_url: str, tmp_path: Path
) -> None:
    """Each pg_dump (a scheduled backup, one taken by hand) is started through a stand-in
    first on PATH that records what any account would see in ps, then runs the real one."""
    real = subprocess.run(["which", "pg_dump"], capture_output=True, text=True).stdout.strip()
    if not real:
        pytest.skip("pg_dump is not installed")
    bin_dir, seen = tmp_path / "bin", tmp_path / "pg_dump.argv"
    bin_dir.mkdir()
    stand_in = bin_dir / "pg_dump"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "argv: $*" "PGPASSWORD: ${{PGPASSWORD:-}}" >> {seen}\n'
        f'exec {real} "$@"\n'
    )
    stand_in.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    # The test server trusts loopback: the password is carried, not checked.
    url = f"{database_url}?password={DB_PW}"
    svc: ServiceProcess = start_service(
        service={"database_url": url, "backup_interval": 0.5}, env={"PATH": path}
    )
    wait_for(lambda: seen.exists() and "argv:" in seen.read_text(), timeout=60)
    by_hand = cli("backup", "--json", env={"PATH": path}, config=svc.config_path)
    assert by_hand.returncode == 0, by_hand.stderr
    svc.stop()
    lines = seen.read_text().splitlines()
    argvs = [line for line in lines if line.startswith("argv: ")]
    assert len(argvs) >= 2  # the scheduled one and the one by hand
    assert all(DB_PW not in line and "--dbname" in line for line in argvs), argvs
    assert all(line == f"PGPASSWORD: {DB_PW}" for line in lines if line.startswith("PGP"))
    assert DB_PW not in svc.log()
