"""A queue database that cannot be opened at start: one line, and the right exit code.

Exit 2 (a configuration error, the unit does not restart) when a setting or the files'
permissions must change; exit 1 (the unit tries again) for what may pass by itself.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import ServiceProcess
from disks import fill, small_filesystem


def refused(svc: ServiceProcess) -> tuple[int, str]:
    """The exit code and the stderr of a start that fails."""
    svc.spawn()
    try:
        code = svc.wait_exit(timeout=60)
    finally:
        if svc.proc.poll() is None:
            svc.kill()
    return code, (svc.root / "service.log").read_text()


def assert_one_line(said: str, start: str) -> None:
    assert "Traceback" not in said and "\\x0a" not in said, said
    assert len(said.splitlines()) == 1, said
    assert said.startswith(start), said


def a_database(data_dir: Path) -> Path:
    """A queue database as a stopped service leaves it."""
    data_dir.mkdir(parents=True)
    path = data_dir / "momentry.db"
    sqlite3.connect(path).execute("CREATE TABLE job (id INTEGER PRIMARY KEY)").connection.close()
    return path


@pytest.mark.parametrize(
    ("url", "code", "start"),
    [
        ("sqlite:///nonexistent-dir/x/y.db", 2, "service.database_url: cannot open"),
        ("sqlite://", 2, "service.database_url: a sqlite URL names a file"),
        ("sqlite:///etc/passwd", 2, "service.database_url: /etc/passwd is not an SQLite database"),
        ("sqlite:///tmp", 2, "service.database_url: /tmp is a directory, not a database file"),
        ("postgresql://127.0.0.1:99999/db", 2, "service.database_url: the port must be 1..65535"),
        ("postgresql://[::1", 2, "service.database_url: not a valid URL: Invalid IPv6 URL"),
        ("postgresql://u@h/db?foo=bar", 2, "service.database_url: invalid URI query parameter"),
    ],
)
def test_a_database_url_that_cannot_work_is_a_configuration_error(tmp_path, url, code, start):
    exit_code, said = refused(ServiceProcess(tmp_path, url, {}))
    assert exit_code == code, said
    assert_one_line(said, f"momentry-edge: configuration error: {start}")


def test_a_database_server_that_is_down_is_one_line_naming_the_url_and_exit_1(tmp_path):
    url = "postgresql://edge:s3cret@127.0.0.1:1/queue"  # nothing listens on port 1
    code, said = refused(ServiceProcess(tmp_path, url, {}))
    assert code == 1, said  # it may come up: the unit tries again
    assert_one_line(said, "momentry-edge: cannot connect to the database at ")
    assert "postgresql://edge:***@127.0.0.1:1/queue" in said and "s3cret" not in said
    assert "Connection refused" in said and "service.database_url (config file)" in said


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: path.chmod(0o444), "is read-only"),
        (lambda path: path.chmod(0), "cannot open {path}: Permission denied"),
        (lambda path: (path.unlink(), path.mkdir()), "{path} is a directory, not a database file"),
    ],
    ids=["read-only", "unreadable", "a folder"],
)
def test_a_database_file_the_service_cannot_use_is_a_configuration_error(
    tmp_path, unprivileged, make, problem
):
    svc = ServiceProcess(tmp_path, "", {}, wrapper=unprivileged)
    path = a_database(svc.data_dir)
    make(path)
    code, said = refused(svc)
    assert code == 2, said
    assert_one_line(said, "momentry-edge: configuration error: service.data_dir: ")
    assert problem.format(path=path) in said and "(config file)" in said


def test_a_full_disk_at_the_first_start_is_one_line_and_exit_1(tmp_path):
    with small_filesystem(tmp_path / "small", size="1m") as small:
        svc = ServiceProcess(tmp_path, "", {"service": {"data_dir": str(small / "data")}})
        fill(small)
        code, said = refused(svc)
    assert code == 1, said  # space may be freed: the unit tries again
    assert_one_line(said, "momentry-edge: cannot start: the disk holding ")
    assert f"{small / 'data' / 'momentry.db'} is full" in said


def test_a_database_path_holding_a_file_that_is_not_one_is_named_so(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not a queue\n" * 10)
    code, said = refused(ServiceProcess(tmp_path, f"sqlite:///{text}", {}))
    assert code == 2, said
    assert f"{text} is not an SQLite database" in said and "move" not in said
    assert text.read_text().startswith("these are notes")  # left as it was
