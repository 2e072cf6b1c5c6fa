"""Job-end callbacks reach a real HTTP server; the log file carries each job's task_id."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
from conftest import wait_for
from receiver import receiving

from momentry_edge import logs


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


def test_hostile_file_names_are_escaped_in_the_log_file(start_service):
    # A terminal that tails the log must not obey a name: C1 controls (U+009B is CSI), DEL
    # and bidi overrides become \\uXXXX; readable text stays raw.
    svc = start_service(ingest={"processors": [], "settle_seconds": 0.2})
    hostile = "caf\u00e9 \u65e5\u672c \x9b2J\x7f\u202egnp.mp4"
    (svc.drop / hostile).write_bytes(b"not a video")
    log_file = svc.data_dir / "logs" / "momentry-edge.log"

    def logged() -> list[str]:
        lines = log_file.read_text(encoding="utf-8").splitlines() if log_file.exists() else []
        return [json.loads(line)["message"] for line in lines if "rejected" in line]

    (message,) = wait_for(logged, timeout=30)
    assert hostile in message  # the log says exactly what the name is
    text = log_file.read_text(encoding="utf-8")
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text)
    assert "\\u009b2J\\u007f\\u202egnp" in text
    assert "caf\u00e9 \u65e5\u672c" in text  # not \\u00e9: the log stays readable


def test_a_log_line_with_an_undecodable_name_is_written_not_lost(tmp_path):
    # os.fsdecode turns undecodable bytes into lone surrogates, which UTF-8 cannot encode.
    name = os.fsdecode(b"bad\xffname") + "\x9b.mp4"
    record = logging.LogRecord("momentry_edge.ingest", logging.INFO, "", 0, "saw %s", (name,), None)
    line = logs.JsonLines().format(record)
    log_file = tmp_path / "momentry-edge.log"
    log_file.write_text(line + "\n", encoding="utf-8")  # strict, as the log handler writes
    assert "bad\\udcffname\\u009b.mp4" in log_file.read_text(encoding="utf-8")
    assert json.loads(line)["message"] == f"saw {name}"


def test_a_receiver_answering_with_an_endless_body_holds_up_no_other_callback(
    start_service, receiver
):
    receiver.failures = 0
    receiver.endless.add("/flood")
    svc = start_service()
    flooded = svc.submit("flooded.mp4", ["noop"], callback_url=f"{receiver.url}/flood")
    svc.wait_status(flooded["task_id"], "completed")
    wait_for(lambda: any(post.path == "/flood" for post in receiver.posts))

    # Its 200 is the answer: the body after it is not read, and the next callback goes out.
    task = svc.submit("after.mp4", ["noop"], callback_url=f"{receiver.url}/after")["task_id"]
    svc.wait_status(task, "completed")
    after = wait_for(lambda: [p for p in receiver.posts if p.path == "/after"], timeout=30)
    assert after[0].json()["job"]["task_id"] == task
    assert [p.path for p in receiver.posts].count("/flood") == 1, "a 200 is not retried"
    wait_for(lambda: f"{flooded['task_id']}: callback delivered" in svc.log())


def test_a_receiver_that_never_finishes_its_answer_holds_up_no_other_callback(
    start_service, receiver
):
    receiver.failures = 0
    receiver.trickle.add("/slow")  # answers, a byte at a time, and never finishes
    svc = start_service()
    slow = svc.submit("slow.mp4", ["noop"], callback_url=f"{receiver.url}/slow")["task_id"]
    svc.wait_status(slow, "completed")
    wait_for(lambda: any(post.path == "/slow" for post in receiver.posts))

    # Each attempt is cut at the callback timeout (10 s) and counts as failed; the next
    # callback goes out meanwhile.
    task = svc.submit("next.mp4", ["noop"], callback_url=f"{receiver.url}/next")["task_id"]
    svc.wait_status(task, "completed")
    after = wait_for(lambda: [p for p in receiver.posts if p.path == "/next"], timeout=40)
    assert after[0].json()["job"]["task_id"] == task
    wait_for(lambda: f"job {slow}: callback failed" in svc.log(), timeout=30)


def test_a_job_takes_a_bounded_number_of_callback_urls_and_calls_each_once(start_service, receiver):
    receiver.failures = 0
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    first = svc.submit("shared.mp4", ["noop"], callback_url=f"{receiver.url}/0")
    # Each later request for the same file joins the waiting job with its own callback.
    for i in range(1, 10):
        joined = svc.submit("shared.mp4", ["noop"], expect=200, callback_url=f"{receiver.url}/{i}")
        assert joined["task_id"] == first["task_id"]
    # One more would make each delivery attempt longer than a sender's hold on it.
    reply = svc.client.post(
        "/api/v1/files/register",
        json={"path": "shared.mp4", "processors": ["noop"], "callback_url": f"{receiver.url}/x"},
    )
    assert reply.status_code == 409, reply.text
    assert "callback" in reply.json()["error"]["message"]

    svc.call("POST", "/api/v1/queue/resume")
    svc.wait_status(first["task_id"], "completed")
    wait_for(lambda: len(receiver.posts) == 10)
    assert sorted(post.path for post in receiver.posts) == sorted(f"/{i}" for i in range(10))


def test_a_callback_url_at_the_service_itself_is_refused(start_service, receiver):
    svc = start_service()
    port = svc.url.rsplit(":", 1)[1]
    svc.add_video("self.mp4")
    for url in (
        f"{svc.url}/api/v1/queue/pause",  # would pause the queue when the job ends
        f"http://localhost:{port}/api/v1/queue/clear",
        f"http://[::1]:{port}/api/v1/queue/pause",
        # Other spellings of the loopback address that the resolver takes.
        f"http://127.1:{port}/api/v1/queue/pause",
        f"http://2130706433:{port}/api/v1/queue/clear",
        f"http://[::ffff:127.0.0.1]:{port}/api/v1/queue/pause",
    ):
        body = {"path": "self.mp4", "processors": ["noop"], "callback_url": url}
        error = svc.call("POST", "/api/v1/files/register", expect=400, json=body)["error"]
        assert "this service" in error["message"], error
    assert svc.get("/api/v1/jobs")["total"] == 0

    # Another server on the same machine is fine.
    reply = svc.submit("self.mp4", ["noop"], callback_url=f"{receiver.url}/hook")
    svc.wait_status(reply["task_id"], "completed")
    scan = f"/api/v1/file/{reply['file_uuid']}/deep-scan"
    body = {"processors": ["noop"], "callback_url": f"{svc.url}/api/v1/queue/pause"}
    assert "this service" in svc.call("POST", scan, expect=400, json=body)["error"]["message"]
    assert svc.status()["paused"] is False
    assert svc.get("/api/v1/jobs")["total"] == 1


def test_callbacks_to_servers_that_hang_hold_up_no_other_jobs_callback(start_service, receiver):
    receiver.failures = 0
    hangs = [f"/hang/{i}" for i in range(3)]  # fewer than the senders (callbacks.SENDERS)
    receiver.trickle.update(hangs)
    svc = start_service()
    stuck = [
        svc.submit(f"stuck {i}.mp4", ["noop"], callback_url=f"{receiver.url}{path}")["task_id"]
        for i, path in enumerate(hangs)
    ]
    for task in stuck:
        svc.wait_status(task, "completed")
    # Each is posted at once, not after the one before it is cut at the timeout (10 s).
    wait_for(lambda: receiver.hanging == set(hangs), timeout=40)

    task = svc.submit("healthy.mp4", ["noop"], callback_url=f"{receiver.url}/ok")["task_id"]
    svc.wait_status(task, "completed")
    ok = wait_for(lambda: [p for p in receiver.posts if p.path == "/ok"], timeout=40)
    assert receiver.hanging == set(hangs), "delivered while the others still hang"
    assert ok[0].json()["job"]["task_id"] == task

    # Each hanging one is cut, logged as failed and tried again; the others go on.
    for task in stuck:
        wait_for(lambda t=task: f"job {t}: callback failed" in svc.log(), timeout=40)
    wait_for(lambda: all([p.path for p in receiver.posts].count(h) >= 2 for h in hangs), 40)
    assert "Traceback" not in svc.log().split("--- stderr ---")[1]
