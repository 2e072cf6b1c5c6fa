"""Job-end callbacks reach a real HTTP server; the log file carries each job's task_id."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from conftest import wait_for


class Receiver(BaseHTTPRequestHandler):
    """Answers 500 to the first ``failures`` POSTs, then 200; keeps every body it got."""

    received: ClassVar[list[dict]] = []
    failures: ClassVar[int] = 1

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append(body)
        self.send_response(500 if len(self.received) <= self.failures else 200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver():
    Receiver.received = []
    Receiver.failures = 1
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver.received
    server.shutdown()


def test_callback_is_retried_after_a_500_and_carries_the_job(start_service, receiver):
    url, received = receiver
    svc = start_service()
    task = svc.submit("hooked.mp4", ["cut"], callback_url=url)["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: len(received) == 2, timeout=20)
    first, second = received
    assert first == second, "the retry sends the same summary"
    assert second["event"] == "job.finished"
    assert second["job"]["task_id"] == task and second["job"]["status"] == "completed"
    assert second["job"]["processors"]["cut"]["status"] == "completed"

    # A job without a callback_url sends nothing.
    quiet = svc.submit("quiet.mp4", ["noop"])["task_id"]
    svc.wait_status(quiet, "completed")
    assert len(received) == 2


def test_a_callback_owed_when_the_service_dies_is_sent_after_it_restarts(start_service, receiver):
    url, received = receiver
    Receiver.failures = 1_000  # the client's server is down
    svc = start_service()
    task = svc.submit("owed.mp4", ["noop"], callback_url=url)["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: received, timeout=20)  # the first attempt failed; a retry is due

    svc.kill()  # a power cut before the retry
    Receiver.failures = len(received)  # the client's server is back
    svc.start()

    wait_for(lambda: len(received) > Receiver.failures, timeout=30)
    delivered = received[Receiver.failures]
    assert delivered["job"]["task_id"] == task and delivered["job"]["status"] == "completed"


def test_log_lines_are_json_with_the_task_id(start_service):
    svc = start_service()
    task = svc.submit("logged.mp4", ["noop", "cut"])["task_id"]
    svc.wait_status(task, "completed")
    lines = [
        json.loads(line)
        for line in (svc.data_dir / "logs" / "momentry-edge.log").read_text().splitlines()
    ]
    mine = [line for line in lines if line.get("task_id") == task]
    messages = " | ".join(line["message"] for line in mine)
    assert "started" in messages and "cut completed" in messages, messages
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
