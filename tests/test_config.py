"""momentry.toml and environment variables, and how bad settings are reported."""

from __future__ import annotations

import os
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


def test_missing_config_file_is_reported(tmp_path):
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml", env={})
