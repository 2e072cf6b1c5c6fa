"""The console's queue views an operator steers a busy queue by, in a real browser
(Chromium through Playwright, as tests/http/test_console.py): a dead node, a stalled job
and a job no node can run; a 500-job line filtered by folder and status, paged to its
500th job, and a folder cancelled. At a desktop's 1440x900 and a phone's 390x844.

MOMENTRY_SCREENSHOTS=DIR keeps the screenshots there (else in the test's own folder).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_for
from playwright.sync_api import Browser, Page
from playwright.sync_api import expect as page_expect
from test_console import link

SIZES = {"desktop": (1440, 900), "phone": (390, 844)}
ALL = [f"workloads:{name}" for name in ("Noop", "Steps", "Flaky", "Crash", "Quiet")]


@pytest.fixture
def pages(browser: Browser, tmp_path: Path) -> Iterator:
    """pages(svc) -> {size: Page} signed in at each size; shoot(pages, name) keeps both."""
    opened = []
    where = Path(os.environ.get("MOMENTRY_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)

    def open_pages(svc: ServiceProcess) -> dict[str, Page]:
        out = {}
        for size, (width, height) in SIZES.items():
            context = browser.new_context(viewport={"width": width, "height": height})
            opened.append(context)
            page = context.new_page()
            page.goto(link(svc))
            page_expect(page.locator("#live")).to_have_text("live")
            out[size] = page
        return out

    def shoot(shown: dict[str, Page], name: str) -> None:
        for size, page in shown.items():
            page.screenshot(path=where / f"{name}-{size}.png", full_page=True)

    open_pages.shoot = shoot  # type: ignore[attr-defined]
    yield open_pages
    for context in opened:
        context.close()


def no_sideways_scroll(page: Page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_dead_node_a_stalled_job_and_a_job_no_node_can_run_each_say_so(
    start_service, pages, tmp_path
):
    hold = tmp_path / "quiet.hold"
    hold.touch()
    settings = {
        "service": {"plugins": ALL},
        "processors.quiet": {"hold_while_exists": str(hold)},
    }
    queue = {"lease_seconds": 2, "stall_seconds": 1}
    a = start_service(
        "a",
        service={"node_id": "studio-a"} | settings.pop("service"),
        queue=queue | {"worker_enabled": False},
        **settings,
    )
    b = start_service("b", service={"node_id": "studio-b", "plugins": ALL}, queue=queue, **settings)
    held = a.submit("interview.mp4", ["quiet"])["task_id"]
    a.wait_status(held, "processing")
    shown = pages(a)

    # Node b runs the job; it reports nothing: stalled, on studio-b.
    for page in shown.values():
        running = page.locator("#running li", has_text="interview.mp4")
        page_expect(running).to_contain_text("stalled")
        page_expect(running).to_contain_text("on studio-b")
        facts = page.locator("#service-facts")
        page_expect(facts).to_contain_text("studio-a on ")
        page_expect(facts).to_contain_text("runs no jobs (queue.worker_enabled = false)")
        page_expect(page.locator("#service-facts")).to_contain_text(
            "this node runs no jobs (queue.worker_enabled = false)"
        )
    pages.shoot(shown, "stalled-job")

    b.kill()  # kill -9: its heartbeat stops; after the lease its job is back in line
    for page in shown.values():
        page_expect(page.locator("#service-facts")).to_contain_text("studio-b on ")
        page_expect(page.locator("#service-facts")).to_contain_text(": OFFLINE, last heartbeat")
        waiting = page.locator("#waiting li", has_text="interview.mp4")
        page_expect(waiting).to_contain_text(
            "no node can run this: no live node takes jobs (studio-a runs no jobs"
        )
        page_expect(waiting).to_contain_text("studio-b is offline since ")
        assert no_sideways_scroll(page)
    pages.shoot(shown, "dead-node")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_500_job_line_is_filtered_by_folder_and_status_and_paged_to_its_500th_job(
    start_service, pages
):
    svc = start_service(ingest={"processors": ["noop"]}, queue={"max_retries": 0})
    svc.call("POST", "/api/v1/queue/pause")
    for day in ("day 1", "day 2"):
        (svc.drop / day).mkdir()
        svc.add_copies(260, prefix=f"{day}/take")
    wait_for(lambda: svc.get("/api/v1/queue/status?limit=1")["pending_count"] == 520, 180)

    # The API: a folder's page keeps each job's place in the whole line.
    page_of = svc.get("/api/v1/queue/status", params={"folder": "day 2", "limit": 5, "offset": 5})
    assert page_of["shown_count"] == 260 and page_of["pending_count"] == 520
    waiting = [e for e in page_of["queue"] if e["status"] == "pending"]
    assert all(e["file_name"].startswith("take") for e in waiting)
    first_of_day_2 = svc.get("/api/v1/queue/status", params={"folder": "day 2", "limit": 1})
    assert waiting[0]["position"] == first_of_day_2["queue"][0]["position"] + 5
    assert svc.get("/api/v1/queue/status", params={"status": "retrying"})["shown_count"] == 0
    svc.call("GET", "/api/v1/queue/status", params={"folder": "day 9"}, expect=404)
    svc.call("GET", "/api/v1/queue/status", params={"status": "done"}, expect=400)
    listed = svc.get("/api/v1/jobs", params={"folder": "day 1", "status": "pending"})
    assert listed["total"] == 260

    shown = pages(svc)
    line = svc.get("/api/v1/queue/status", params={"limit": 40})["queue"]
    for nth, page in enumerate(shown.values()):
        page_expect(page.locator("#waiting-pager")).to_contain_text("1–25 of 520")
        # The 500th job in one step: its place typed, Go. What is typed stays while a
        # queue event refreshes the page (here a job moved to #1).
        page.get_by_label("Go to #").fill("500")
        moved = line[30 + nth]
        svc.call("POST", f"/api/v1/queue/prioritize/{moved['file_uuid']}")
        page_expect(page.locator("#waiting li").first).to_contain_text(moved["file_name"])
        page_expect(page.get_by_label("Go to #")).to_have_value("500")
        page.get_by_role("button", name="Go", exact=True).click()
        page_expect(page.locator("#waiting-pager")).to_contain_text("476–500 of 520")
        page_expect(page.locator("#waiting li").last).to_contain_text("#500")
        # A folder's waiting jobs, shown alone.
        page.get_by_label("Folder", exact=True).fill("day 2")
        page.get_by_label("Status", exact=True).select_option("pending")
        page.get_by_role("button", name="Show", exact=True).click()
        page_expect(page.locator("#waiting-filter")).to_have_text(
            "Showing 260 pending jobs in folder day 2 of 520 waiting."
        )
        page_expect(page.locator("#waiting-pager")).to_contain_text("1–25 of 260")
        page.get_by_role("button", name="Last page").click()
        page_expect(page.locator("#waiting-pager")).to_contain_text("251–260 of 260")
        page_expect(page.locator("#waiting li").last).to_contain_text("#520")
        assert no_sideways_scroll(page)
    pages.shoot(shown, "filtered-500")

    # Ticked together: every job shown, in one tick.
    page = shown["desktop"]
    page.get_by_role("button", name="First page").click()
    page_expect(page.locator("#waiting-pager")).to_contain_text("1–25 of 260")
    page.get_by_label("Select all shown").check()
    page_expect(page.get_by_role("button", name="Cancel selected (25)")).to_be_enabled()
    page.get_by_label("Select all shown").uncheck()

    # A folder cancelled: the folder typed (it is), then 2 clicks.
    page.get_by_role("button", name="Cancel its waiting jobs").click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel jobs").click()
    page_expect(page.locator("#bulk-said")).to_have_text(
        "Cancelled 260 waiting jobs in folder day 2."
    )
    page_expect(page.locator("#waiting-filter")).to_have_text(
        "Showing 0 pending jobs in folder day 2 of 260 waiting."
    )
    assert svc.get("/api/v1/queue/status?limit=1")["pending_count"] == 260
