"""Job-end callbacks reach a real HTTP server; the log file carries each job's task_id."""

from __future__ import annotations

import json

import pytest
from conftest import wait_for
from receiver import receiving


@pytest.fixture
def receiver():
    with receiving(failures=1) as rx:
        yield rx


def test_callback_is_retried_after_a_500_and_carries_the_job(start_service, receiver):
    url, received = f"{receiver.url}/hook", receiver.posts
    svc = start_service()
    task = svc.submit("hooked.mp4", ["cut"], callback_url=url)["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: len(received) == 2, timeout=20)
    first, second = (post.json() for post in received)
    assert first == second, "the retry sends the same summary"
    assert second["event"] == "job.finished"
    assert second["job"]["task_id"] == task and second["job"]["status"] == "completed"
    assert second["job"]["processors"]["cut"]["status"] == "completed"

    # A job without a callback_url sends nothing.
    quiet = svc.submit("quiet.mp4", ["noop"])["task_id"]
    svc.wait_status(quiet, "completed")
    assert len(received) == 2


def test_a_callback_owed_when_the_service_dies_is_sent_after_it_restarts(start_service, receiver):
    url, received = f"{receiver.url}/hook", receiver.posts
    receiver.failures = 1_000  # the client's server is down
    svc = start_service()
    task = svc.submit("owed.mp4", ["noop"], callback_url=url)["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: received, timeout=20)  # the first attempt failed; a retry is due

    svc.kill()  # a power cut before the retry
    receiver.failures = len(received)  # the client's server is back
    svc.start()

    wait_for(lambda: len(received) > receiver.failures, timeout=30)
    delivered = received[receiver.failures].json()
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
