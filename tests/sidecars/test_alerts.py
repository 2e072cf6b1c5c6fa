"""Operator alerts reach a real HTTP receiver: failed and dead jobs, a full disk, a lost node."""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import ServiceProcess, wait_for
from databases import scratch_postgres
from receiver import Receiver, receiving


@pytest.fixture
def receiver():
    with receiving() as rx:
        yield f"{rx.url}/momentry-alerts", rx


def alerts(rx: Receiver) -> list[dict]:
    return [{"headers": post.headers, "body": post.body.decode()} for post in rx.posts]


def titled(rx: Receiver, text: str) -> list[dict]:
    return [a for a in alerts(rx) if text in a["headers"].get("Title", "")]


def test_a_failed_job_and_a_dead_partial_job_each_alert_once(start_service, receiver):
    url, rx = receiver
    rx.failures = 1  # the first delivery gets a 500: it is sent again
    svc = start_service(alerts={"url": url}, queue={"max_retries": 0})
    svc.marker.write_text("storage down")  # flaky fails while this exists
    failed = svc.submit("broken.mp4", ["flaky"])["task_id"]
    partial = svc.submit("half.mp4", ["flaky", "noop"])["task_id"]
    fine = svc.submit("fine.mp4", ["noop"])["task_id"]
    for task, status in ((failed, "failed"), (partial, "partial"), (fine, "completed")):
        assert svc.wait_status(task, "failed", "partial", "completed")["status"] == status
    dead = {j["task_id"] for j in svc.get("/api/v1/queue/dead")["jobs"]}
    assert dead == {failed, partial}

    wait_for(lambda: len(titled(rx, "job failed")) == 2)  # one 500, one delivered
    wait_for(lambda: titled(rx, "job partial"))
    first, again = titled(rx, "job failed")
    assert first["body"] == again["body"]
    alert = again
    assert alert["headers"]["Content-Type"].startswith("text/plain")
    assert alert["headers"]["Priority"] == "high" and alert["headers"]["Tags"] == "warning"
    assert failed in alert["body"] and "broken.mp4" in alert["body"]
    assert "upstream storage unavailable" in alert["body"]
    (partial_alert,) = titled(rx, "job partial")
    assert partial in partial_alert["body"] and "half.mp4" in partial_alert["body"]
    assert not [a for a in alerts(rx) if fine in a["body"]], "a completed job is no news"


def test_an_alert_receiver_answering_with_an_endless_body_holds_up_no_later_alert(
    start_service, receiver
):
    url, rx = receiver
    rx.endless.add("/momentry-alerts")  # ntfy behind a proxy gone wrong: 200, then no end
    svc = start_service(alerts={"url": url}, queue={"max_retries": 0})
    svc.marker.write_text("storage down")
    first = svc.submit("first.mp4", ["flaky"])["task_id"]
    svc.wait_status(first, "failed")
    wait_for(lambda: titled(rx, "job failed"))

    second = svc.submit("second.mp4", ["flaky"])["task_id"]
    svc.wait_status(second, "failed")
    wait_for(lambda: len(titled(rx, "job failed")) == 2, timeout=30)
    assert second in titled(rx, "job failed")[1]["body"]


def test_an_alert_receiver_that_never_finishes_its_answer_holds_up_no_later_alert(
    start_service, receiver
):
    url, rx = receiver
    rx.trickle.add("/momentry-alerts")  # answers a byte at a time, and never finishes
    svc = start_service(alerts={"url": url}, queue={"max_retries": 0})
    svc.marker.write_text("storage down")
    first = svc.submit("first.mp4", ["flaky"])["task_id"]
    svc.wait_status(first, "failed")
    wait_for(lambda: titled(rx, "job failed"))

    # The stuck attempt is cut at the alert timeout (10 s); the next alert goes out.
    rx.trickle.clear()
    second = svc.submit("second.mp4", ["flaky"])["task_id"]
    svc.wait_status(second, "failed")
    wait_for(lambda: [a for a in titled(rx, "job failed") if second in a["body"]], timeout=40)


def test_the_disk_guard_alerts_once_per_blocking(start_service, receiver, tmp_path):
    url, rx = receiver
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    svc = start_service(alerts={"url": url}, queue={"min_free_disk_mb": free_mb + 10**6})
    task = svc.submit("held.mp4", ["noop"])["task_id"]
    wait_for(lambda: svc.status()["blocked_reason"])
    wait_for(lambda: titled(rx, "jobs held back"))
    (alert,) = titled(rx, "jobs held back")
    assert "low disk space" in alert["body"] and "min_free_disk_mb" in alert["body"]
    # The guard is checked every couple of seconds; it stays one alert while it holds.
    time.sleep(6)
    assert len(titled(rx, "jobs held back")) == 1
    assert svc.job(task)["status"] == "pending"


def test_a_node_that_stops_its_heartbeat_is_reported_by_the_survivor(tmp_path, receiver):
    url, rx = receiver
    nodes = []
    with scratch_postgres() as database_url:
        try:
            for name in ("a", "b"):
                settings = {
                    "service": {"node_id": f"node-{name}"},
                    "alerts": {"url": url},
                    "queue": {"lease_seconds": 2},
                }
                nodes.append(ServiceProcess(tmp_path / name, database_url, settings).start())
            a, b = nodes
            wait_for(lambda: len(b.status()["nodes"]) == 2)
            a.kill()  # kill -9: no clean leave, its heartbeat just stops
            wait_for(lambda: titled(rx, "node lost"), timeout=30)
            (alert,) = titled(rx, "node lost")
            assert "node-a" in alert["body"] and "node-b" in alert["headers"]["Title"]
            assert alert["headers"]["Priority"] == "urgent"
        finally:
            for svc in nodes:
                if svc.proc and svc.proc.poll() is None:
                    svc.proc.kill()
                    svc.proc.wait()


def test_an_alert_url_no_request_can_use_fails_each_attempt_and_the_alerts_go_on(start_service):
    # Valid as a URL, so taken at start, but its host name cannot be looked up as it is
    # (a label over 63 characters): the request fails before it is sent, every time.
    url = "http://" + "a" * 300 + ".example/alerts"
    svc = start_service(alerts={"url": url}, queue={"max_retries": 0})
    svc.marker.write_text("storage down")
    for name in ("first.mp4", "second.mp4"):
        svc.wait_status(svc.submit(name, ["flaky"])["task_id"], "failed")

    # Each alert is tried, fails with the reason and is tried again: the thread lives on.
    def logged() -> str:
        return svc.log().split("--- stderr ---")[0]

    wait_for(lambda: "retrying in 4 s" in logged(), timeout=30)
    assert logged().count("job failed' failed (UnicodeError") >= 4  # both alerts, twice each
    assert "Exception in thread" not in svc.log()


def test_an_error_several_processors_share_is_said_once_with_their_count(
    start_service, receiver, tmp_path
):
    url, rx = receiver
    marker = tmp_path / "node" / "flaky.marker"  # the service's own (ServiceProcess.marker)
    plugins = [f"workloads:{n}" for n in ("Noop", "Steps", "Flaky", "FlakyToo", "Crash")]
    svc = start_service(
        service={"plugins": plugins},
        alerts={"url": url},
        queue={"max_retries": 0},
        **{"processors.flaky_too": {"fail_while_exists": str(marker)}},
    )
    assert svc.marker == marker
    svc.marker.write_text("storage down")
    task = svc.submit("both.mp4", ["flaky", "flaky_too"])["task_id"]
    job = svc.wait_status(task, "failed")
    assert job["error_message"] == (
        "flaky, flaky_too (2 processors): upstream storage unavailable (attempt 1)"
    )
    (alert,) = wait_for(lambda: titled(rx, "job failed"))
    assert alert["body"].count("upstream storage unavailable") == 1, alert["body"]
    assert "flaky, flaky_too (2 processors)" in alert["body"]
