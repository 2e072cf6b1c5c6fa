"""The one-file executable (scripts/build), run as an operator would: copied into an empty
folder, started with a clean environment, fed a real video through its drop folder."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import read_token, wait_for
from media_factory import make_video
from test_asr import MODEL, SENTENCE, SPEECH_AT, speak

from momentry_edge import __version__

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "momentry_edge"
DEFAULT_SCAN = ["asr", "cut", "yolo", "ocr", "face", "pose"]


@pytest.fixture(scope="session")
def executable(tmp_path_factory) -> Path:
    """dist/momentry-edge, built now unless it is up to date, copied into an empty folder."""
    build = subprocess.run(
        [str(ROOT / "scripts" / "build")], capture_output=True, text=True, timeout=3600
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    folder = tmp_path_factory.mktemp("operator")
    copy = folder / "momentry-edge"
    shutil.copy2(ROOT / "dist" / "momentry-edge", copy)
    return copy


def clean_env(home: Path) -> dict[str, str]:
    """What a fresh login on the target has: no virtualenv, no Python on purpose, no settings."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def operator_home(tmp_path_factory) -> Path:
    """One operator's HOME, as on a real machine: the first start unpacks the executable
    there and every later one runs from that cache (an unpack costs about 7 CPU seconds;
    the cache tests below start from an empty, damaged or fresh cache on purpose)."""
    return tmp_path_factory.mktemp("operator-home")


def test_version_says_what_it_is(executable, operator_home):
    reply = subprocess.run(
        [str(executable), "--version"],
        env=clean_env(operator_home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.startswith(f"momentry-edge {__version__}")
    assert "one-file build" in reply.stdout


def test_the_executable_runs_a_default_scan_of_a_dropped_video(
    executable, operator_home, models_dir, tmp_path
):
    home, drop, data = operator_home, tmp_path / "drop", tmp_path / "data"
    for folder in (drop, data / "models"):
        folder.mkdir(parents=True)
    # Models come the way an operator's first `models pull` leaves them (no hub here).
    for model in (MODEL, "yolov8n"):
        shutil.copytree(models_dir / model, data / "models" / model)
    config = executable.parent / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{data}"\nwatch = ["{drop}"]\nport = 0\n'
        f"[ingest]\nsettle_seconds = 1\nprocessors = {json.dumps(DEFAULT_SCAN)}\n"
        f'[processors.asr]\nmodel = "{MODEL}"\n'
        # Idle a second after the job: the models go and the program starts afresh.
        "[models]\nidle_release_seconds = 1\n",
        encoding="utf-8",
    )
    log = (tmp_path / "service.log").open("wb")
    proc = subprocess.Popen(
        [str(executable), "--config", str(config), "run"],
        env=clean_env(home),
        cwd=executable.parent,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        run_file = data / "run.json"
        url = wait_for(lambda: _run_url(run_file, proc), timeout=600)
        token = read_token(data)  # made at first start, read as its account's CLI does
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, timeout=30, headers=headers) as api:
            health = api.get("/healthz").json()
            assert (health["status"], health["version"]) == ("ok", __version__)
            assert health["data_dir"] == str(data)  # its account's, said to loopback callers
            # The web console's files are inside the one file.
            page = api.get("/")
            assert page.status_code == 200 and "/console/static/app.js" in page.text
            for asset in ("app.js", "app.css"):
                assert (
                    api.get(f"/console/static/{asset}").content
                    == (PACKAGE / "static" / asset).read_bytes()
                )
            ready = api.get("/api/v1/processors").json()["processors"]
            assert all(ready[name]["ready"] for name in DEFAULT_SCAN), ready

            wav = speak(SENTENCE, tmp_path / "sentence.wav")
            clip = make_video(
                tmp_path / "meeting.mp4", speech_wav=wav, speech_start=SPEECH_AT, size=(160, 120)
            )
            shutil.copy(clip, drop / "weekly meeting.mp4")

            def finished() -> dict | None:
                found = api.get("/api/v1/jobs").json()["jobs"]
                if found and found[0]["status"] in ("completed", "partial", "failed"):
                    return found[0]
                return None

            job = wait_for(finished, timeout=600, interval=0.5)
            detail = api.get(f"/api/v1/jobs/{job['task_id']}").json()
            assert job["status"] == "completed", json.dumps(detail["processors"], indent=1)
            results = {
                name: api.get(f"/api/v1/files/{job['file_uuid']}/results/{name}").json()
                for name in DEFAULT_SCAN
            }
            # The program started afresh in its own process, on the same port.
            log_file = data / "logs" / "momentry-edge.log"
            wait_for(lambda: log_file.read_text().count(" listening on ") == 2, timeout=120)
            assert api.get("/healthz").json()["status"] == "ok"
            assert json.loads(run_file.read_text())["pid"] == proc.pid
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
    assert code == 0, (tmp_path / "service.log").read_text(errors="replace")[-4000:]
    assert {doc["status"] for doc in results.values()} == {"completed"}
    assert "weekly meeting" in results["asr"]["result"]["text"].lower()
    assert results["cut"]["result"]["cuts"] == pytest.approx([5.0, 10.0, 15.0], abs=0.04)
    # It ran from the copy alone, unpacked into its HOME's cache (by whichever start came first).
    assert any((home / ".cache" / "momentry-edge").iterdir())


def _run_url(run_file: Path, proc: subprocess.Popen) -> str | None:
    if proc.poll() is not None:
        raise AssertionError(f"the executable exited with {proc.returncode}")
    try:
        info = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return None
    return info["url"] if info["pid"] == proc.pid else None  # the launcher execs the program


def test_the_login_item_starts_the_copied_file_not_its_unpacked_folder(executable, operator_home):
    rendered = subprocess.run(
        [str(executable), "service", "render", "--platform", "macos"],
        env=clean_env(operator_home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert f"<string>{executable}</string>" in rendered.stdout
    assert ".cache" not in rendered.stdout


def _build_id(executable: Path) -> str:
    with executable.open("rb") as file:
        header = file.read(4096).decode("ascii", errors="replace")
    return next(line[6:] for line in header.splitlines() if line.startswith("build="))


def _version(executable: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(executable), "--version"],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_cache_folder_emptied_or_cut_short_is_unpacked_again(executable, tmp_path):
    cache = tmp_path / ".cache" / "momentry-edge"
    unpacked = cache / _build_id(executable)
    unpacked.mkdir(parents=True)  # as a cache cleaner leaves it: the folder, nothing in it
    reply = _version(executable, tmp_path)
    assert reply.returncode == 0 and reply.stdout.startswith("momentry-edge "), reply

    # A cleaner that removed some files only (the oldest, the largest...).
    libraries = sorted(p for p in unpacked.rglob("*.so*") if p.is_file())
    for library in libraries[: len(libraries) // 2]:
        library.unlink()
    reply = _version(executable, tmp_path)
    assert reply.returncode == 0 and reply.stdout.startswith("momentry-edge "), reply
    assert sorted(p.name for p in cache.iterdir()) == [unpacked.name]


def test_a_launcher_stopped_during_its_first_unpack_leaves_nothing_behind(executable, tmp_path):
    cache = tmp_path / ".cache" / "momentry-edge"
    for stop in (signal.SIGTERM, signal.SIGKILL):
        launcher = subprocess.Popen(
            [str(executable), "--version"],
            env=clean_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Mid-unpack: its folder has files, and tar is writing more.
        wait_for(lambda: any(cache.glob(".unpack.*/momentry-edge/*")), timeout=120, interval=0.01)
        helpers = psutil.Process(launcher.pid).children(recursive=True)
        launcher.send_signal(stop)
        launcher.wait(timeout=60)
        if stop == signal.SIGTERM:  # it stops its tar and removes its folder itself
            assert not list(cache.glob(".unpack.*"))
            wait_for(lambda h=helpers: not _running(h), timeout=60)

    # The next start removes what the killed one left, and its tar stops for want of it.
    reply = _version(executable, tmp_path)
    assert reply.returncode == 0 and reply.stdout.startswith("momentry-edge "), reply
    assert sorted(p.name for p in cache.iterdir()) == [_build_id(executable)]
    wait_for(lambda: not _running(helpers), timeout=300)
    assert sorted(p.name for p in cache.iterdir()) == [_build_id(executable)]


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (an ended one nobody reaped yet counts as ended)."""
    running = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running
