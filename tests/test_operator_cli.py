"""An operator's commands from a fresh shell: finding the service, `config show`, `results`,
`submit --force`, what `run` prints, `logs`, and a node that watches nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import wait_for
from media_factory import make_video

# One database is enough here: what is tested is the client, not the queue.
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def fresh_shell(home: Path, *args: str, expect: int | None = 0) -> subprocess.CompletedProcess[str]:
    """`momentry-edge ARGS` as typed in a new terminal: no MOMENTRY_* variable, no --config,
    another working directory; HOME is the operator's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *args],
        env=env | {"HOME": str(home)},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=90,
    )
    if expect is not None:
        assert proc.returncode == expect, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "operator"
    folder.mkdir()
    return folder


@SQLITE
def test_a_fresh_shell_finds_the_service_and_status_says_which(start_service, home) -> None:
    # Its own port (chosen at start), data dir and config file, none of which the shell has.
    svc = start_service(env={"HOME": str(home)}, queue={"max_concurrent": 1})
    status = fresh_shell(home, "status")
    first = status.stdout.splitlines()[0]
    assert first.startswith(f"service {svc.url}, found through the registry in ")
    assert f"data dir {svc.data_dir}" in first and str(svc.config_path) in first
    assert "queue running" in status.stdout

    # A run-time change (the TUI's +) outlasts a restart; config show says so, and why.
    fresh_shell(home, "concurrency", "2")
    svc.restart()
    shown = fresh_shell(home, "config", "show").stdout
    assert f"settings of the service at {svc.url}" in shown
    assert f"config file: {svc.config_path}" in shown
    line = next(row for row in shown.splitlines() if row.startswith("queue.max_concurrent "))
    assert "= 2" in line and "set at run time" in line and "config file says 1" in line
    rows = json.loads(fresh_shell(home, "config", "show", "--json").stdout)["settings"]
    origins = {row["key"]: row["origin"] for row in rows}
    assert origins["service.data_dir"] == "config file"
    assert origins["queue.cpu_threshold"] == "default"

    svc.stop()  # unregistered: a stopped service is not found
    gone = fresh_shell(home, "status", expect=None)  # (8765 may be another program's)
    assert svc.url not in gone.stdout + gone.stderr
    assert not list((home / ".momentry-edge" / "services").glob("*.json"))


def test_without_a_service_config_show_says_what_run_would_use(home) -> None:
    (home / ".momentry-edge").mkdir()
    (home / ".momentry-edge" / "momentry.toml").write_text(
        '[service]\nport = 8799\ndatabase_url = "postgresql://me:secret@db/q"\n'
    )
    shown = fresh_shell(home, "config", "show").stdout
    assert "what `momentry-edge run` would use here" in shown
    # Names padded to the longest setting's: the column moves as settings are added.
    assert re.search(r"^service\.port += 8799  \(config file\)$", shown, re.M), shown
    assert "secret" not in shown and "postgresql://me:***@db/q" in shown
    assert re.search(r'^service\.token += "\(not set\)"', shown, re.M), shown


@SQLITE
def test_run_says_where_it_listens_and_what_it_watches(start_service) -> None:
    svc = start_service()
    said = (svc.root / "service.log").read_text()  # stdout to a file: no terminal
    assert f"listening on {svc.url}\n" in said
    assert f"  watching: {svc.drop}\n" in said
    assert f"  data dir: {svc.data_dir}" in said and f"  settings: {svc.config_path}" in said


@SQLITE
def test_a_processing_only_node_watches_nothing(start_service, tmp_path) -> None:
    svc = start_service(service={"watch": []})
    assert "  watching: nothing (a processing-only node)" in (svc.root / "service.log").read_text()
    assert svc.call("POST", "/api/v1/files/rescan")["new"] == 0
    refused = svc.call("POST", "/api/v1/files/register", expect=400, json={"path": "x.mp4"})
    assert "not inside a watched folder" in refused["error"]["message"]


@SQLITE
def test_results_shows_each_processor_and_submit_force_runs_again(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)})
    svc.add_video("take 1.mp4")
    task = svc.submit("take 1.mp4", ["noop", "steps"])["task_id"]
    svc.wait_status(task, "completed")
    shown = fresh_shell(home, "results", "take 1.mp4").stdout.splitlines()
    uuid = svc.job(task)["file_uuid"]
    assert shown[0] == f"take 1.mp4 ({uuid}), present"
    assert shown[1] == f"job {task}: completed"
    steps = next(line.split() for line in shown if line.strip().startswith("steps"))
    assert steps[1] == "completed" and Path(steps[2]).is_file()
    assert Path(steps[2]).parent == svc.data_dir / "results" / uuid
    assert fresh_shell(home, "results", uuid).stdout.splitlines()[1] == f"job {task}: completed"
    missing = fresh_shell(home, "results", "nothing.mp4", expect=1)
    assert "no known file is named 'nothing.mp4'" in missing.stderr
    assert "`momentry-edge submit PATH`" in missing.stderr
    no_text = fresh_shell(home, "results", "take 1.mp4", "--text", expect=1)
    assert "has no transcript" in no_text.stderr

    # Unchanged: submit queues nothing; --force runs it again.
    path = str(svc.drop / "take 1.mp4")
    again = fresh_shell(home, "submit", path, "--processors", "noop,steps")
    assert f"{task} is completed: nothing queued (`submit --force`" in again.stdout
    forced = fresh_shell(home, "submit", path, "--processors", "noop,steps", "--force")
    new_task = forced.stdout.split(": ", 1)[1].split(",")[0]
    assert new_task != task and new_task.startswith("task_")
    svc.wait_status(new_task, "completed")
    assert svc.job(new_task)["options"].get("force") is True


@SQLITE
def test_results_finds_a_file_by_its_name_typed_loosely(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)})
    svc.call("POST", "/api/v1/queue/pause")
    names = ["Director Interview – Café.mp4", "director notes.mp4", "b-roll/wide 2.mp4"]
    for name in names:
        svc.submit(name, ["noop"])
    uuids = {f["path"]: f["file_uuid"] for f in svc.get("/api/v1/files")["files"]}
    for typed, path in [
        ("director interview - cafe.mp4", names[0]),  # case, accent, a hyphen for the en dash
        ("DIRECTOR INTERVIEW – CAFÉ", names[0]),  # without its extension
        ("director int", names[0]),  # a unique start
        ("interview", names[0]),  # a unique part
        ("Wide", names[2]),
    ]:
        first = fresh_shell(home, "results", typed).stdout.splitlines()[0]
        assert first == f"{path} ({uuids[path]}), present", (typed, first)
    several = fresh_shell(home, "results", "director", expect=1).stderr
    assert "2 files match 'director': " in several, several
    assert f"{names[0]} ({uuids[names[0]]})" in several and uuids[names[1]] in several
    near = fresh_shell(home, "results", "director notez.mp4", expect=1).stderr
    assert "names like it: director notes.mp4" in near, near


@SQLITE
def test_results_lists_every_processors_last_complete_result(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)})
    svc.add_video("take 2.mp4")
    first = svc.submit("take 2.mp4", ["noop", "flaky"])
    svc.wait_status(first["task_id"], "completed")
    svc.marker.write_text("storage is down")  # a later job of flaky alone fails
    again = svc.call(
        "POST",
        f"/api/v1/file/{first['file_uuid']}/deep-scan",
        expect=202,
        json={"processors": ["flaky"], "force": True, "max_retries": 0},
    )
    svc.wait_status(again["task_id"], "failed")

    shown = fresh_shell(home, "results", "take 2.mp4").stdout.splitlines()
    assert shown[1] == f"job {again['task_id']}: failed"
    folder = svc.data_dir / "results" / first["file_uuid"]
    rows = {line.split()[0]: i for i, line in enumerate(shown) if line.startswith("  ")}
    # noop's result is the first job's; flaky's too, the failure beside it said as such.
    assert shown[rows["noop"]].split()[1:] == ["completed", str(folder / "noop.json")]
    assert shown[rows["flaky"]].split()[1:] == ["completed", str(folder / "flaky.json")]
    later = shown[rows["flaky"] + 1].strip()
    assert later.startswith(f"a later run, {again['task_id']}, failed: upstream storage")


@SQLITE
def test_results_text_prints_the_transcript(start_service, home, talk, models_dir) -> None:
    whisper = {"model": "whisper-tiny.en", "models_dir": str(models_dir)}
    svc = start_service(env={"HOME": str(home)}, **{"processors.asr": whisper})
    (svc.drop / "talk.mp4").write_bytes(talk.read_bytes())
    task = svc.submit("talk.mp4", ["asr"])["task_id"]
    svc.wait_status(task, "completed", timeout=180)
    text = fresh_shell(home, "results", "talk.mp4", "--text").stdout.lower()
    assert "weekly meeting" in text and "budget" in text
    assert "{" not in text  # the words, not the JSON document
    # Each segment a line with its times, as the console shows them.
    document = svc.get(f"/api/v1/files/{svc.job(task)['file_uuid']}/results/asr")["result"]
    lines = text.splitlines()
    assert len(lines) == len(document["segments"]), text
    for line, segment in zip(lines, document["segments"], strict=True):
        shown = re.fullmatch(r"\[(\d+):(\d\d\.\d) - (\d+):(\d\d\.\d)\] (.+)", line)
        assert shown, line
        assert abs(int(shown[1]) * 60 + float(shown[2]) - segment["start"]) <= 0.05, line
        assert abs(int(shown[3]) * 60 + float(shown[4]) - segment["end"]) <= 0.05, line
        assert shown[5] == segment["text"].strip().lower()


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> Path:
    """6 s of video with a sentence spoken (espeak-ng) from 1 s."""
    folder = tmp_path_factory.mktemp("talk")
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail("espeak-ng is not installed: scripts/test installs it")
    wav = folder / "sentence.wav"
    sentence = "Welcome to the weekly meeting. Today we talk about the budget for next year."
    subprocess.run([espeak, "-w", str(wav), sentence], check=True, capture_output=True)
    return make_video(
        folder / "talk.mp4",
        segments=1,
        segment_seconds=6,
        size=(160, 120),
        speech_wav=wav,
        speech_start=1.0,
    )


@SQLITE
def test_logs_reads_the_json_lines_log(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)})
    said = fresh_shell(home, "logs").stdout
    assert "INFO momentry_edge.service: momentry-edge" in said and svc.url in said
    # Times in UTC, labelled so (the console shows local time with its zone).
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC INFO ", said), said
    assert '"level"' not in said  # readable lines, not JSON
    task = svc.submit("a.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")
    other = svc.submit("b.mp4", ["noop"])["task_id"]
    svc.wait_status(other, "completed")
    mine = fresh_shell(home, "logs", "--job", task).stdout.splitlines()
    assert mine and all(task in line for line in mine)
    assert not any(other in line for line in mine)

    follow = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "logs", "-f", "-n", "1"],
        env={k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
        | {"HOME": str(home)},
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []

    def read() -> None:
        for line in follow.stdout:
            seen.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: seen, timeout=60)  # the last line so far: it follows from here on
        later = svc.submit("c.mp4", ["noop"])["task_id"]
        wait_for(lambda: any(f"job {later} completed" in line for line in seen), timeout=60)
        assert not any(task in line for line in seen), "-n 1: the last line, then new ones"
    finally:
        follow.terminate()
        follow.wait(timeout=30)


@SQLITE
def test_doctor_checks_the_folders_port_disk_database_and_service(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)})
    # Processors may not be ready on this machine (models not pulled): any exit code here.
    report = json.loads(fresh_shell(home, "doctor", "--json", expect=None).stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["service"]["level"] == "ok" and svc.url in checks["service"]["detail"]
    assert "watch" not in checks  # the one folder is missing: a warning of its own
    assert f"{home / 'momentry-drop'} does not exist" in report["watch_warnings"][0]
    assert checks["disk"]["level"] == "ok" and "GB free" in checks["disk"]["detail"]
    assert checks["database"]["level"] == "ok"
    human = fresh_shell(home, "doctor", expect=None).stdout
    assert "models pull" not in human  # models.auto_pull: the service pulls them itself

    # Another program on the port and a database file that is none: problems, exit 1.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        data = home / "elsewhere"
        data.mkdir()
        (data / "momentry.db").write_bytes(b"not a database" * 100)
        config = home / "momentry.toml"
        config.write_text(f'[service]\ndata_dir = "{data}"\nport = {port}\nwatch = []\n')
        broken = fresh_shell(home, "--config", str(config), "doctor", "--json", expect=1)
    checks = {c["check"]: c for c in json.loads(broken.stdout)["checks"]}
    assert checks["port"]["level"] == "problem" and f"127.0.0.1:{port}" in checks["port"]["detail"]
    assert checks["database"]["level"] == "problem"
    assert "cannot be read" in checks["database"]["detail"]
    assert checks["watch"]["detail"].startswith("none: a processing-only node")


@SQLITE
def test_config_show_says_when_the_service_refuses_the_token(start_service, home) -> None:
    svc = start_service(env={"HOME": str(home)}, service={"token": "the-right-token"})
    shown = fresh_shell(home, "config", "show").stdout
    assert f"({svc.url} refused: " in shown.splitlines()[0]
    with_token = fresh_shell(home, "config", "show", "--token", "the-right-token").stdout
    assert with_token.startswith(f"settings of the service at {svc.url}")
    token = next(line for line in with_token.splitlines() if line.startswith("service.token "))
    assert token.endswith('= "(set)"  (config file)')
    assert "the-right-token" not in with_token
