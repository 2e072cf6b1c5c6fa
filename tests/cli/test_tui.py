"""The live view: `momentry-edge tui` in a real terminal (tmux) against a real service,
and its pure render function on API-shaped JSON."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from broken_server import BrokenServer
from conftest import wait_for
from rich.console import Console

from momentry_edge.cli.screen import Snapshot, render
from momentry_edge.cli.tui import Cursor, parse_keys, selectable

TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux not installed (scripts/test adds it)")


class Terminal:
    """One tmux session on a private server: start a command, read the screen, press keys."""

    def __init__(self, home: Path) -> None:
        # A short socket path: unix sockets are limited to ~100 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="tui", dir="/tmp"))
        self.socket = self.dir / "tmux"
        # Nor the runner's COLUMNS and LINES (pytest-xdist workers set 80x24): the program
        # takes its size from the terminal, as it does for a person.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MOMENTRY_", "TMUX")) and k not in ("COLUMNS", "LINES")
        }
        # An empty data dir (no config or token of this machine's) and a UTF-8 terminal.
        self.env = env | {"MOMENTRY_DATA_DIR": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        self.starts = 0
        self.session = ""

    def tmux(self, *args: str) -> str:
        command = [TMUX, "-u", "-S", str(self.socket), *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, f"tmux {' '.join(args[:3])}: {done.stderr.strip()}"
        return done.stdout

    def start(self, *argv: str, columns: int = 160, lines: int = 48) -> None:
        tui = shlex.join([sys.executable, "-m", "momentry_edge.cli", *argv])
        # Keep the pane after the program ends, so its exit code (or traceback) can be read.
        shell = f'{tui}; echo "[exited $?]"; sleep 600'
        size = ("-x", str(columns), "-y", str(lines))
        # Each start is a new session beside the old ones: killing the only session stops
        # the tmux server, and a new-session that races that shutdown fails.
        self.starts += 1
        self.session = f"tui{self.starts}"
        self.tmux("new-session", "-d", "-s", self.session, *size, shell)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def press(self, *keys: str) -> None:
        """tmux key names: "Down", "Up", or single characters (sent literally)."""
        for key in keys:
            literal = ["-l"] if len(key) == 1 else []
            self.tmux("send-keys", "-t", self.session, *literal, key)

    def wait(self, check: Callable[[str], object], timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s; the screen:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([TMUX, "-S", str(self.socket), "kill-server"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    home = tmp_path / "tui-home"
    home.mkdir()
    term = Terminal(home)
    yield term
    term.close()


def line(screen: str, text: str) -> str:
    """The first screen line that contains ``text`` ("" when none does)."""
    return next((row for row in screen.splitlines() if text in row), "")


def at_position(screen: str, name: str, position: int) -> bool:
    # A queue row: the selection marker (or a space), the position, the file name.
    return re.search(rf"^\S?\s*{position}\s+{re.escape(name)}", line(screen, name)) is not None


def selected(screen: str, name: str) -> bool:
    return line(screen, name).startswith("›")


@needs_tmux
def test_tui_shows_the_queue_and_its_keys_steer_it(start_service, terminal) -> None:
    svc = start_service(**{"processors.steps": {"steps": 40, "step_seconds": 0.1}})
    svc.call("POST", "/api/v1/queue/pause")
    names = ["alpha.mp4", "bravo.mp4", "charlie.mp4"]
    tasks = {
        n: svc.submit(n, ["steps"] if n == "alpha.mp4" else ["noop"])["task_id"] for n in names
    }
    terminal.start("tui", "--url", svc.url)

    screen = terminal.wait(lambda s: all(n in s for n in names) and "PAUSED" in s)
    for position, name in enumerate(names, start=1):
        assert at_position(screen, name, position), screen
    assert svc.url in screen and "max 2" in screen

    # The first row starts selected; a pending job cannot be retried: the API's reason shows.
    assert selected(screen, "alpha.mp4"), screen
    terminal.press("r")
    terminal.wait(lambda s: "refused" in s and "only failed, partial or cancelled" in s)

    terminal.press("Down", "Down")
    terminal.wait(lambda s: selected(s, "charlie.mp4"))
    terminal.press("t")
    wait_for(lambda: svc.job(tasks["charlie.mp4"])["position"] == 1)
    terminal.wait(lambda s: at_position(s, "charlie.mp4", 1) and selected(s, "charlie.mp4"))

    terminal.press("+")
    wait_for(lambda: svc.status()["max_concurrent"] == 3)
    terminal.wait(lambda s: "max 3" in s)
    terminal.press("-", "-")
    wait_for(lambda: svc.status()["max_concurrent"] == 1)

    # Now charlie, alpha, bravo: cancel bravo, then retry it from the finished list.
    terminal.press("Down", "Down")
    terminal.wait(lambda s: selected(s, "bravo.mp4"))
    terminal.press("c")
    wait_for(lambda: svc.job(tasks["bravo.mp4"])["status"] == "cancelled")
    terminal.wait(lambda s: "recently finished" in s and "cancelled" in line(s, "bravo.mp4"))
    assert selected(terminal.screen(), "bravo.mp4")
    terminal.press("r")
    wait_for(lambda: svc.job(tasks["bravo.mp4"])["status"] == "pending")

    terminal.press("p")
    wait_for(lambda: svc.status()["paused"] is False)
    # alpha runs (one at a time now): its row and its processor's row have progress bars.
    screen = terminal.wait(
        lambda s: (
            "processing" in line(s, "alpha.mp4")
            and re.search(r"└ steps\s+running\s+━+.*\s[1-9]\d?%\s+\d+/40", s)
        )
    )
    assert "RUNNING" in screen and "━" in line(screen, "alpha.mp4"), screen
    terminal.press("p")
    wait_for(lambda: svc.status()["paused"] is True)
    terminal.wait(lambda s: "PAUSED" in s)

    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
def test_tui_says_when_the_service_is_unreachable_and_recovers(start_service, terminal) -> None:
    # A fixed port, so that the restarted service is where the view looks for it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    svc = start_service(service={"port": port})
    svc.submit("steady.mp4", ["noop"])
    terminal.start("tui", "--url", svc.url)
    terminal.wait(lambda s: "RUNNING" in s and "steady.mp4" in s)

    svc.stop()
    screen = terminal.wait(lambda s: "cannot reach momentry-edge" in s)
    assert "retrying every second" in screen and "q quit" in screen
    assert "steady.mp4" in screen  # the last answer stays on screen

    svc.start()
    terminal.wait(lambda s: "cannot reach" not in s and "RUNNING" in s, timeout=30)
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_sends_the_token(start_service, terminal) -> None:
    svc = start_service(service={"token": "s3cret"})
    terminal.start("tui", "--url", svc.url)
    terminal.wait(lambda s: "missing or wrong bearer token" in s and "--token" in s)
    terminal.press("q")
    terminal.start("tui", "--url", svc.url, "--token", "s3cret")
    terminal.wait(lambda s: "RUNNING" in s and "bearer" not in s)


@needs_tmux
def test_tui_shows_hostile_names_escaped(start_service, terminal) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    # Real files in the real drop folder: one clears the screen, one retitles the window,
    # one is Rich markup, if printed as they are.
    for name in ("\x1b[2Jclear.mp4", "\x1b]0;pwned\x07title.mp4", "[bold red]alarm.mp4"):
        svc.submit(name, ["noop"])
    terminal.start("tui", "--url", svc.url)
    shown = ("\\x1b[2Jclear.mp4", "\\x1b]0;pwned\\x07title.mp4", "[bold red]alarm.mp4")
    screen = terminal.wait(lambda s: all(name in s for name in shown))
    # Not cleared: the header above the queue and the key help below it are still there.
    assert "PAUSED" in screen and "q quit" in screen, screen
    title = terminal.tmux("display-message", "-p", "-t", terminal.session, "#{pane_title}")
    assert "pwned" not in title
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_on_a_narrow_terminal_shows_which_job_is_selected(start_service, terminal) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    names = ["first-of-two-rather-long-names.mp4", "second-of-two-rather-long-names.mp4"]
    tasks = [svc.submit(name, ["noop"])["task_id"] for name in names]
    terminal.start("tui", "--url", svc.url, columns=40, lines=12)

    # Each row: the marker, the position and the start of the (cut) file name.
    first = re.compile(r"^›\s*1\s+first-of")
    second = re.compile(r"^›\s*2\s+second-of")
    screen = terminal.wait(lambda s: any(first.search(row) for row in s.splitlines()))
    assert re.search(r"^\s*2\s+second-of", line(screen, "second-of")), screen
    terminal.press("Down")
    terminal.wait(lambda s: any(second.search(row) for row in s.splitlines()))
    terminal.press("c")  # cancels the job the operator sees selected, and only that one
    wait_for(lambda: svc.job(tasks[1])["status"] == "cancelled")
    assert svc.job(tasks[0])["status"] == "pending"
    said = f"job {tasks[1]} ({names[1]}, was pending) cancelled through the TUI"
    wait_for(lambda: said in svc.log())
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_says_why_nothing_starts_on_a_queue_that_is_not_paused(start_service, terminal):
    svc = start_service(queue={"min_free_disk_mb": 10**9})  # the most it takes: 1 PB
    svc.submit("held back.mp4", ["noop"])
    terminal.start("tui", "--url", svc.url)
    screen = terminal.wait(lambda s: "nothing starts: low disk space" in s)
    assert "BLOCKED" in line(screen, svc.url) and "RUNNING" not in screen, screen
    assert "MB free for" in line(screen, "nothing starts: low disk space")
    assert at_position(screen, "held back.mp4", 1), screen
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_at_80x24_keeps_names_apart_the_key_help_and_says_when_unreachable(
    start_service, terminal
) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    # Names alike but for their ends, as a camera's takes are.
    names = [f"ACME_wedding_2026-05-01_camera_B_take{i:02d}.mp4" for i in range(1, 13)]
    for name in names:
        svc.submit(name, ["noop"])
    terminal.start("tui", "--url", svc.url, columns=80, lines=24)

    screen = terminal.wait(lambda s: "PAUSED" in s and "take01.mp4" in s)
    rows = [row for row in screen.splitlines() if "ACME_" in row]
    assert len(rows) >= 5, screen
    for position, row in enumerate(rows, start=1):
        # Each row tells its job apart: the position and the end of the name.
        assert re.search(rf"^\S?\s*{position}\s+ACME_\S*take{position:02d}\.mp4", row), screen
    header = line(screen, "momentry-edge")
    assert "PAUSED" in header and "max 2" in header, screen
    assert "q quit" in screen and "12 pending" in screen

    svc.stop()
    screen = terminal.wait(lambda s: "cannot reach momentry-edge" in s)
    assert "UNREACHABLE" in line(screen, "momentry-edge") and "PAUSED" not in screen, screen
    assert "q quit" in screen
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_asks_before_cancelling_a_running_job(start_service, terminal) -> None:
    svc = start_service(**{"processors.steps": {"steps": 600, "step_seconds": 0.1}})
    task = svc.submit("long take.mp4", ["steps"])["task_id"]
    svc.wait_status(task, "processing")
    terminal.start("tui", "--url", svc.url, columns=80, lines=24)
    terminal.wait(lambda s: "processing" in line(s, "long take.mp4"))

    terminal.press("c")
    terminal.wait(lambda s: "cancel long take.mp4, which is running?" in s)
    terminal.press("n")
    terminal.wait(lambda s: "long take.mp4: left running" in s)
    assert svc.job(task)["status"] == "processing"

    terminal.press("c")
    terminal.wait(lambda s: "which is running?" in s)
    terminal.press("y")
    svc.wait_status(task, "cancelled")
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_at_80x24_reaches_every_waiting_job_and_enter_shows_one_whole(
    start_service, terminal
) -> None:
    svc = start_service(queue={"max_retries": 0})
    svc.marker.write_text("down")
    broken = svc.submit("broken take.mp4", ["flaky"])["task_id"]
    svc.wait_status(broken, "failed")
    svc.call("POST", "/api/v1/queue/pause")
    names = svc.add_copies(30)  # more than the 24 lines hold
    for name in names:
        svc.submit(name, ["noop"])
    terminal.start("tui", "--url", svc.url, columns=80, lines=24)
    screen = terminal.wait(lambda s: "PAUSED" in s and selected(s, names[0]))
    # The failed list has room for the error, not only its first words; Enter shows it whole.
    assert "flaky: upstream storage unavailable" in line(screen, "broken take.mp4"), screen

    # Down goes through the whole line, the list scrolling, then to the failed job.
    for position, name in enumerate(names[1:], start=2):
        terminal.press("Down")
        terminal.wait(lambda s, n=name, p=position: selected(s, n) and at_position(s, n, p))
    terminal.press("Down")
    terminal.wait(lambda s: selected(s, "broken take.mp4"))

    # Enter: the job whole, its error and each processor's; Escape: back to the list.
    terminal.press("Enter")
    whole = re.compile(r"flaky\s+failed\s+upstream storage unavailable \(attempt 1\)")
    screen = terminal.wait(lambda s: f"task {broken}" in s and whole.search(s))
    assert "Esc" in screen and "copy 0000.mp4" not in screen, screen
    terminal.press("Escape")
    terminal.wait(lambda s: selected(s, "broken take.mp4") and "q quit" in s)
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_at_200x50_and_80x24_says_the_estimate_whole(start_service, terminal) -> None:
    steps = {"steps": 600, "step_seconds": 0.1}
    svc = start_service(service={"node_id": "studio-b"}, **{"processors.steps": steps})
    name = "ACME_wedding_2026-05-01_ceremony_and_speeches_camera_B_take01.mp4"
    task = svc.submit(name, ["steps"])["task_id"]
    node = svc.wait_status(task, "processing")["node"]
    wait_for(lambda: svc.job(task).get("estimated_end"))
    terminal.start("tui", "--url", svc.url, columns=200, lines=50)
    # The estimate (or start) and the node it runs on are whole, beside the whole name.
    screen = terminal.wait(lambda s: "processing" in line(s, name))
    row = line(screen, name)
    assert re.search(rf"ends in \S+( \S+)? on {re.escape(node)}\s*$", row), row
    # The terminal's local time, labelled with its zone.
    assert re.search(r"updated \d\d:\d\d:\d\d [A-Z]{2,5}\b", line(screen, "momentry-edge"))
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)

    # At 80 columns the estimate is still whole, without the node (not "ends in 1m 59s o…").
    terminal.start("tui", "--url", svc.url, columns=80, lines=24)
    row = line(terminal.wait(lambda s: "processing" in line(s, "take01.mp4")), "take01.mp4")
    assert re.search(r"processing .* ends in \d+(s|m \d\ds)\s*$", row), row
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_clear_asks_at_a_terminal_before_cancelling_the_line(start_service, terminal) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(f"waiting {i}.mp4", ["noop"])["task_id"] for i in range(2)]
    terminal.start("clear", "--url", svc.url, columns=80, lines=24)
    terminal.wait(lambda s: "cancel 2 waiting job(s)? (running jobs go on) [y/N]" in s)
    terminal.press("n", "Enter")
    terminal.wait(lambda s: "nothing cancelled" in s and "[exited 1]" in s)
    assert [svc.job(t)["status"] for t in tasks] == ["pending", "pending"]

    terminal.start("clear", "--url", svc.url, columns=80, lines=24)
    terminal.wait(lambda s: "[y/N]" in s)
    terminal.press("y", "Enter")
    terminal.wait(lambda s: "cancelled 2 waiting job(s)" in s and "[exited 0]" in s)
    assert [svc.job(t)["status"] for t in tasks] == ["cancelled", "cancelled"]


@needs_tmux
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_tui_warns_of_a_watched_folder_gone(start_service, terminal, tmp_path) -> None:
    volume = tmp_path / "volume"
    drop = tmp_path / "node" / "drop"  # the service's own (ServiceProcess.drop)
    svc = start_service(service={"watch": [str(drop), str(volume)]})
    terminal.start("tui", "--url", svc.url)
    terminal.wait(lambda s: "RUNNING" in s)
    volume.rmdir()  # as a volume unmounted
    terminal.wait(lambda s: f"⚠ watched folder {volume} does not exist" in s)
    terminal.press("q")
    terminal.wait(lambda s: "[exited 0]" in s)


def test_tui_needs_a_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "tui", "--url", "http://127.0.0.1:9"],
        env=env | {"MOMENTRY_DATA_DIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "needs a terminal" in proc.stderr, proc.stderr


# -- render(): status JSON in, screen out ---------------------------------------------------------


def ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


NOW = ts("2026-03-24T12:00:10Z")


def job(task: str, name: str, status: str, **extra: object) -> dict:
    base = {"task_id": task, "file_uuid": task[-1] * 32, "file_name": name, "status": status}
    return base | {"priority": "normal", "processors": ["steps"]} | extra


def status_json(**extra: object) -> dict:
    return {
        "active_count": 1,
        "max_concurrent": 2,
        "effective_concurrency": 1,
        "dynamic_concurrency": True,
        "pending_count": 2,
        "retrying_count": 1,
        "paused": False,
        "queue": [
            job(
                "task_a", "alpha.mp4", "processing", progress=45, started_at="2026-03-24T12:00:00Z"
            ),
            job("task_b", "[b] bravo.mp4", "pending", position=1, estimated_start=None),
            job(
                "task_c",
                "charlie.mp4",
                "pending",
                position=2,
                estimated_start="2026-03-24T12:01:40Z",
            ),
            job(
                "task_d", "delta.mp4", "retrying", next_attempt_at="2026-03-24T12:00:40Z", error="x"
            ),
        ],
        "statistics": {"total_processed": 7, "total_failed": 2, "average_time": 12.5},
        "resources": {"cpu_percent": 31.0, "memory_percent": 55.2, "gpu_percent": None},
        "nodes": [{"id": "mini", "host": "mini.local", "active": 1, "max_concurrent": 2}],
    } | extra


def snapshot(**extra: object) -> Snapshot:
    detail = {
        "processors": {"steps": {"status": "running", "progress": 45, "current": 9, "total": 20}}
    }
    base = {
        "status": status_json(),
        "details": {"task_a": detail},
        "failed": [job("task_e", "echo.mp4", "failed", failed=["steps"])],
        "finished": [job("task_f", "fox.mp4", "completed")],
        "errors": {"task_e": "steps: disk on fire"},
        "fetched_at": NOW,
    }
    return Snapshot("http://mini:8765", **(base | extra))


def text_of(
    snap: Snapshot,
    selected: str | None = None,
    message: str = "",
    height: int = 40,
    width: int | None = None,
) -> str:
    console = Console(width=150, height=height, file=io.StringIO(), record=True)
    console.print(render(snap, selected, message, height, NOW, width))
    return console.export_text()


def test_render_header_queue_and_lists() -> None:
    screen = text_of(snapshot(), selected="task_c", message="refused: nope")
    header = line(screen, "http://mini:8765")
    assert "RUNNING" in header and "active 1 / effective 1 / max 2 (dynamic on)" in header
    gauges = line(screen, "CPU")
    assert "31%" in gauges and "55%" in gauges and re.search(r"GPU\s+n/a", gauges)
    assert "processed 7" in gauges and "failed 2" in gauges and "12.5 s/job" in gauges
    assert "nodes" not in screen  # one node: nothing to compare
    assert "processing" in line(screen, "alpha.mp4") and "45%" in line(screen, "alpha.mp4")
    assert re.search(r"└ steps\s+running\s+━+.*45%\s+9/20", screen)
    assert at_position(screen, "[b] bravo.mp4", 1)  # brackets are text, not markup
    assert selected(screen, "charlie.mp4") and "starts in 1m 30s" in line(screen, "charlie.mp4")
    assert "retry in 30s" in line(screen, "delta.mp4")
    assert "steps: disk on fire" in line(screen, "echo.mp4")
    assert "completed" in line(screen, "fox.mp4")
    assert "refused: nope" in screen and "q quit" in screen


def test_render_paused_several_nodes_and_an_unreachable_service() -> None:
    nodes = [
        {"id": "mini", "host": "a", "active": 1, "max_concurrent": 2, "processors": ["asr"]},
        {"id": "studio", "host": "b", "active": 0, "max_concurrent": 4, "processors": ["yolo"]},
    ]
    screen = text_of(snapshot(status=status_json(paused=True, nodes=nodes)))
    assert "PAUSED" in line(screen, "http://mini:8765")
    snap = snapshot(status=status_json(paused=True, nodes=nodes), error="cannot reach it")
    screen = text_of(snap)
    # The last answer stays, but the badge says the service's state is not known now.
    assert "UNREACHABLE" in line(screen, "http://mini:8765") and "PAUSED" not in screen
    assert "nodes" in screen and "0 / 4" in line(screen, "studio")
    assert "cannot reach it" in screen and "retrying" in screen and "alpha.mp4" in screen

    never = text_of(Snapshot("http://mini:8765", error="cannot reach momentry-edge"))
    assert "not connected" in never and "cannot reach momentry-edge" in never


def test_render_a_line_while_models_are_pulled_at_start() -> None:
    pulls = [
        {"model": "whisper-base", "state": "pulling", "percent": 42},
        {"model": "yolov8n", "state": "queued", "percent": 0},
        {"model": "face-x", "state": "failed", "percent": None, "error": "no source answered"},
    ]
    screen = text_of(snapshot(status=status_json(models=pulls)))
    models_line = line(screen, "models ")
    assert "pulling whisper-base 42 %" in models_line and "yolov8n next" in models_line
    assert "face-x FAILED: no source answered" in models_line
    assert "alpha.mp4" in screen and "q quit" in screen
    ready = [{"model": "whisper-base", "state": "ready", "percent": 100}]
    assert not line(text_of(snapshot(status=status_json(models=ready))), "models ")


def test_render_an_offline_node_and_a_stalled_job() -> None:
    nodes = [
        {"id": "edge-1", "host": "a", "active": 0, "max_concurrent": 2, "online": True},
        {"id": "studio", "host": "b", "active": 1, "max_concurrent": 4, "online": False}
        | {"last_seen": "2026-03-24T11:55:10Z"},
    ]
    stuck = job("task_a", "alpha.mp4", "processing", progress=5, node="studio", stalled=True)
    stuck |= {"started_at": "2026-03-24T11:50:10Z", "progress_at": "2026-03-24T11:54:10Z"}
    screen = text_of(snapshot(status=status_json(nodes=nodes, queue=[stuck])))
    assert "OFFLINE" in line(screen, "studio") and "5m 00s ago" in line(screen, "studio")
    assert "0 / 2" in line(screen, "edge-1")
    assert "STALLED: no progress 6m 00s ago" in line(screen, "alpha.mp4"), screen


def test_render_keeps_the_key_help_and_the_selection_on_a_short_screen() -> None:
    many = [job(f"task_{i:03d}", f"file {i:03d}.mp4", "pending", position=i) for i in range(1, 60)]
    snap = snapshot(status=status_json(queue=many, pending_count=59), details={})
    screen = text_of(snap, selected="task_050", height=20)
    assert len(screen.splitlines()) <= 20
    assert selected(screen, "file 050.mp4") and "q quit" in screen


def test_render_on_a_narrow_screen_drops_columns_not_the_file_name() -> None:
    console = Console(width=40, height=30, file=io.StringIO(), record=True)
    console.print(render(snapshot(), "task_b", "", 30, NOW, width=40))
    screen = console.export_text()
    assert selected(screen, "[b] bravo.mp4") and at_position(screen, "[b] bravo.mp4", 1), screen
    assert at_position(screen, "charlie.mp4", 2) and "pending" in line(screen, "charlie.mp4")
    assert "echo.mp4" in screen and "fox.mp4" in screen
    assert "starts in" not in screen  # the "when" column gave way


def test_keys_and_cursor() -> None:
    assert parse_keys("\x1b[A\x1b[Bjk+p") == ["up", "down", "down", "up", "+", "p"]
    assert parse_keys("\r\x1b") == ["enter", "escape"]
    snap = snapshot()
    rows = selectable(snap)
    assert [r["task_id"] for r in rows] == [f"task_{c}" for c in "abcdef"]
    cursor = Cursor()
    assert cursor.pick(rows)["task_id"] == "task_a"
    cursor.move(rows, 2)
    assert cursor.pick(rows)["task_id"] == "task_c"
    # The selection follows its job when the queue reorders, and stays in range.
    assert cursor.pick(list(reversed(rows)))["task_id"] == "task_c"
    cursor.move(rows, 100)
    assert cursor.pick(rows)["task_id"] == "task_f"
    assert cursor.pick(rows[:2])["task_id"] == "task_b"  # gone: its place's job


def well(**extra: object) -> bytes:
    """One reply that is a whole queue status, an empty job list and a pause reply."""
    status = {
        "success": True,
        "active_count": 0,
        "max_concurrent": 2,
        "effective_concurrency": 2,
        "dynamic_concurrency": False,
        "pending_count": 0,
        "paused": False,
        "queue": [],
        "jobs": [],
        "total": 0,
    }
    return json.dumps(status | extra).encode()


@needs_tmux
def test_tui_survives_replies_of_the_wrong_shape_and_recovers(terminal) -> None:
    with BrokenServer().running() as server:
        server.answer(well())
        terminal.start("tui", "--url", server.url)
        terminal.wait(lambda s: "RUNNING" in s and "⚠" not in s)

        server.answer(b"{}", method="POST")  # `p` gets a 2xx reply without "paused"
        terminal.press("p")
        screen = terminal.wait(lambda s: "⚠ unexpected reply" in s)
        assert "/api/v1/queue/pause" in line(screen, "⚠"), screen
        server.answer(well(paused=True))  # the view still polls: the change shows
        terminal.wait(lambda s: "PAUSED" in s)

        server.answer(b"{}")  # the status itself lacks its fields
        terminal.wait(lambda s: "⚠" in s and "unexpected reply" in s and "q quit" in s)
        server.answer(well(statistics={"average_time": "soon"}))  # a field of the wrong type
        terminal.wait(lambda s: "⚠" in s and "unexpected reply" in s and "q quit" in s)

        server.answer(well())
        server.answer(well(), method="POST")
        terminal.wait(lambda s: "RUNNING" in s and "retrying every second" not in s)
        terminal.press("p")  # commands work again too: their outcome replaces the warning
        terminal.wait(lambda s: "queue running" in s and "⚠" not in s)
        terminal.press("q")
        terminal.wait(lambda s: "[exited 0]" in s)


def test_render_a_waiting_job_no_node_can_run_and_a_node_that_runs_none() -> None:
    why = "no node can run this: no live node takes jobs (edge-1 runs no jobs (...))"
    nodes = [
        {"id": "edge-1", "host": "a", "active": 0, "max_concurrent": 0, "worker": "off"},
        {"id": "studio", "host": "b", "active": 0, "max_concurrent": 2, "online": False}
        | {"last_seen": "2026-03-24T11:55:10Z", "processors": ["steps"]},
    ]
    stuck = job("task_b", "bravo.mp4", "pending", position=1, estimated_start=None, stranded=why)
    snap = snapshot(status=status_json(nodes=nodes, queue=[stuck]), details={})
    screen = text_of(snap, selected="task_b")
    assert "NO NODE CAN RUN IT" in line(screen, "bravo.mp4"), screen
    assert "runs no jobs" in line(screen, "edge-1") and "OFFLINE" in line(screen, "studio")
    opened = Console(width=100, height=30, file=io.StringIO(), record=True)
    opened.print(render(snap, "task_b", "", 30, NOW, opened="task_b"))
    assert why in opened.export_text().replace("\n", " ")
