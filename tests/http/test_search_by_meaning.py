"""Search by meaning through a real service: a meaning query finds what word search
misses, through the API, the CLI and the console's "by meaning" box in real Chromium;
without the model a clear 409 and word search as before; bad queries a 400."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import wait_for
from playwright.sync_api import expect as page_expect
from test_console import Console
from test_search_meaning import said, sentence_model

from momentry_edge import store
from momentry_edge.search import encoder, index

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
__all__ = ["sentence_model"]  # the fixture, shared


def cli_search(svc, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path)]
    return subprocess.run(
        [*command, "search", *args], capture_output=True, text=True, env=svc.env, timeout=60
    )


@SQLITE
def test_a_meaning_query_finds_what_words_miss_once_the_model_is_in_place(
    start_service, sentence_model, browser
):
    svc = start_service()
    task = svc.submit("meeting.mp4", ["noop"])
    uuid = task["file_uuid"]
    svc.wait_status(task["task_id"], "completed")
    database = store.connect("", svc.data_dir)  # the service's own database file
    record = store.MediaFile.get(store.MediaFile.file_uuid == uuid)
    with store.write_transaction(database):  # the write lock taken at once, as the service
        index.put(record.id, "asr", json.dumps(said()).encode())

    def by_meaning(q: str, **params):
        return svc.client.get("/api/v1/search", params={"q": q, "mode": "meaning", **params})

    # Bad queries are a 400, model or not.
    for q in ("", "   ", "budget " * 1500):
        reply = by_meaning(q)
        assert reply.status_code == 400, (q[:20], reply.text)
        assert reply.json()["error"]["code"] == "bad_request"
    assert svc.client.get("/api/v1/search", params={"q": "a", "mode": "sense"}).status_code == 400

    # No model on this node: a 409 that says how to put it in place; words still work.
    reply = by_meaning("money troubles")
    assert reply.status_code == 409, reply.text
    error = reply.json()["error"]
    assert error["code"] == "conflict"
    assert "models pull all-minilm-l6-v2" in error["message"]
    words = svc.get("/api/v1/search", params={"q": "money troubles"})
    assert words["total"] == 0 and words["mode"] == "words"  # no word of it was said
    assert svc.get("/api/v1/search", params={"q": "budget"})["total"] == 1
    refused = cli_search(svc, "--meaning", "money troubles")
    assert refused.returncode != 0 and "models pull all-minilm-l6-v2" in refused.stderr

    # The model put in place while the service runs: the moments are embedded and found.
    (svc.data_dir / "models").mkdir(exist_ok=True)
    (svc.data_dir / "models" / encoder.MODEL).symlink_to(sentence_model / encoder.MODEL)

    def embedded():
        reply = by_meaning("money troubles")
        return reply.status_code == 200 and reply.json()["index"]["complete"] and reply.json()

    found = wait_for(embedded, timeout=120, interval=0.5)
    assert found["mode"] == "meaning"
    first = found["hits"][0]
    assert first["processor"] == "asr" and first["start"] == 0.0
    assert "budget" in first["text"]
    assert first["file"]["file_uuid"] == uuid

    shown = cli_search(svc, "--meaning", "money troubles", "--limit", "1")
    assert shown.returncode == 0, shown.stderr
    line, count = shown.stdout.splitlines()
    assert line.startswith("meeting.mp4  0:00:00.0  [asr 0.")
    assert "budget" in line and count.startswith("1 of ")

    # The console: the "by meaning" box ticked, the same moment first.
    page = Console(browser, svc).open()
    page.get_by_role("searchbox", name="Find the moment").fill("money troubles")
    page.get_by_role("button", name="Find", exact=True).click()
    page_expect(page.locator("#find-count")).to_have_text("Nothing found")  # by words
    page.get_by_role("checkbox", name="by meaning").check()
    page.get_by_role("button", name="Find", exact=True).click()
    page_expect(page.locator("#find-hits li").first).to_contain_text("budget")
    page_expect(page.locator("#find-hits li").first).to_contain_text("said")
    database.close()
