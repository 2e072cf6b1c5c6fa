"""Details of the console that misled an operator: where files go on an empty console, a
file at the top of the drop folder, a sound file's page, and times with their zone.
In a real browser (test_console.py says how), against a real service."""

from __future__ import annotations

import json
import re

import pytest
from audio_media import music, write
from conftest import wait_for
from playwright.sync_api import expect as page_expect
from test_console import link

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
ZONE = "America/New_York"  # the browser's; EST in December, EDT in summer


@SQLITE
def test_an_empty_console_says_where_files_go_and_a_sound_files_page_what_was_skipped(
    start_service, browser, tmp_path
):
    address = "sftp://studio-mini.local:2022/"
    svc = start_service(
        service={"upload_address": address},
        ingest={"processors": ["cut", "face"], "settle_seconds": 0.2},
    )
    context = browser.new_context(timezone_id=ZONE, locale="en-US")
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(link(svc))
        where = page.locator("#where-files-go")
        page_expect(where).to_contain_text(
            "No file yet. Put video or audio files in the drop folder"
        )
        page_expect(where.locator("code").first).to_have_text(str(svc.drop))
        page_expect(where).to_contain_text(f"Uploaders reach it at {address}.")

        # A sound file at the top of the drop folder: cut and face have nothing to look at.
        write(tmp_path / "interview.m4a", [music(3.0)]).rename(svc.drop / "interview.m4a")
        row = page.locator("#files li", has_text="interview.m4a")
        page_expect(row).to_contain_text("completed", timeout=60_000)
        page_expect(where).to_have_count(0)
        assert " in " not in row.inner_text(), row.inner_text()  # not "in ."

        row.get_by_role("link", name="interview.m4a").click()
        facts = page.locator("#file-facts")
        page_expect(facts).to_contain_text("Picturenone (a sound file)")
        page_expect(facts).to_contain_text("Folderthe drop folder itself")
        page_expect(facts.locator("dd").nth(6)).to_have_text(
            # The browser's local time, labelled with its zone.
            re.compile(r"^\w{3} \d{1,2}, \d{4}, \d{1,2}:\d\d [AP]M E[SD]T$")
        )
        skipped = "was skipped: not applicable: the file has no video track."
        page_expect(page.locator("#scenes")).to_have_text("cut " + skipped)
        page_expect(page.locator("#people")).to_contain_text("face " + skipped)
        assert not errors, errors
    finally:
        context.close()


@SQLITE
def test_a_closed_console_tab_is_logged_at_debug_not_info(start_service, browser):
    # Keep-alives every 0.1 s: the service finds the tab's stream gone at once.
    svc = start_service(service={"log_level": "debug", "event_keepalive": 0.1})
    context = browser.new_context()
    page = context.new_page()
    page.goto(link(svc))
    page_expect(page.locator("#live")).to_contain_text("live")
    page.close()
    log = svc.data_dir / "logs" / "momentry-edge.log"

    def said() -> list[dict]:
        lines = [json.loads(raw) for raw in log.read_text().splitlines()]
        return [e for e in lines if e["message"].startswith("Client disconnected")]

    closed = wait_for(said)
    assert {e["level"] for e in closed} == {"debug"}, closed
    context.close()
