"""The console's search box in real headless Chromium: moments found by what was said,
a hit opening the file's page at its moment, its link copied, the hits exported."""

from __future__ import annotations

import csv
import io
import os
import subprocess
from pathlib import Path

import pytest
from media_factory import make_video
from playwright.sync_api import expect as page_expect
from test_console import Console

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@SQLITE
def test_a_search_finds_the_moment_and_opens_the_file_there(
    start_service, browser, models_dir, tmp_path
):
    svc = start_service(
        **{"processors.asr": {"model": "whisper-tiny.en", "models_dir": str(models_dir)}}
    )
    wav = tmp_path / "speech.wav"
    said = "Welcome to the weekly budget meeting."
    subprocess.run(["espeak-ng", "-w", str(wav), said], check=True)
    video = make_video(
        tmp_path / "weekly.mp4",
        segments=2,
        segment_seconds=2,
        fps=10,
        size=(96, 64),
        speech_wav=wav,
    )
    os.replace(video, svc.drop / "Día del presupuesto.mp4")
    task = svc.submit("Día del presupuesto.mp4", ["cut", "asr"])
    svc.wait_status(task["task_id"], "completed", timeout=120)

    view = Console(browser, svc)
    view.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = view.open()
    page.get_by_role("searchbox", name="Find the moment").fill("BUDGETS")
    page.get_by_role("button", name="Find", exact=True).click()
    hit = page.locator("#find-hits li").filter(has_text="budget").first
    page_expect(hit.locator("mark")).to_have_text("budget")
    page_expect(page.locator("#find-count")).to_contain_text("found")

    # Names too, without accents.
    page.get_by_role("searchbox", name="Find the moment").fill("dia presupuesto")
    page.get_by_role("button", name="Find", exact=True).click()
    page_expect(page.locator("#find-hits li").first).to_contain_text("file name")
    page.get_by_role("searchbox", name="Find the moment").fill("budget")
    page.get_by_role("button", name="Find", exact=True).click()
    hit = page.locator("#find-hits li").filter(has_text="said").first
    page_expect(hit).to_be_visible()

    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text("utf-8"))))
    spoken = [r for r in rows if r["source"] == "asr"]
    assert spoken and "budget" in spoken[0]["text"].lower()
    assert spoken[0]["file"] == "Día del presupuesto.mp4"
    assert spoken[0]["link"].startswith(svc.url + "/#/file/" + task["file_uuid"] + "/at/")

    hit.get_by_role("button", name="Copy link").click()
    page_expect(hit.get_by_role("button", name="Copied")).to_be_visible()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == spoken[0]["link"]

    hit.get_by_role("link").click()
    page_expect(page.locator("#file-name")).to_have_text("Día del presupuesto.mp4")
    here = page.locator("#transcript li.here")
    page_expect(here).to_have_count(1)
    page_expect(here).to_contain_text("budget")

    # The copied link opens the same moment in a new tab, once signed in there (the token
    # is kept per tab, and the link does not carry it).
    other = view.context.new_page()
    other.goto(copied)
    other.get_by_label("Service token").fill(svc.token)
    other.get_by_role("button", name="Sign in").click()
    page_expect(other.locator("#transcript li.here")).to_contain_text("budget")
    view.check_clean()
    view.close()
