"""What the web console costs the service, and whether it stays usable with a long line.

    .venv/bin/python benchmarks/console_bench.py [--seconds 60] [--waiting 5000]

Starts a real ``momentry-edge run`` (SQLite, loopback) and drives Debian's headless
Chromium through Playwright, as tests/http/test_console.py does. Prints: the page's bytes on
first load; the service's CPU (% of one core) and peak RSS while one job runs for
``--seconds`` with 0 and 1 page open, 16 pages each in a browser of its own (16
streams) and 16 tabs of one browser (which share one stream); then, with ``--waiting``
jobs waiting in a paused queue (0: skipped), how long the page takes to show the first
page of the line and the next.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from common import ROOT, service_process
from playwright.sync_api import expect, sync_playwright

from momentry_edge.config import Config

sys.path.insert(0, str(ROOT / "tests"))
from browser import FLAGS, chromium  # the tests' browser: Debian's Chromium
from media_factory import make_video

STEP = 0.25  # seconds per step of the job: four progress events a second


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--waiting", type=int, default=5000)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])
    )
    steps = max(1, int(args.seconds / STEP))
    extra = (
        'plugins = ["workloads:Steps", "workloads:Noop"]\n'
        '[queue]\ndynamic_concurrency = false\n[ingest]\nprocessors = ["noop"]\n'
        f"[models]\nauto_pull = false\n[processors.steps]\nsteps = {steps}\n"
        f"step_seconds = {STEP}\n"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        service_process(Path(tmp), extra) as (url, proc),
        sync_playwright() as driver,
    ):
        root = Path(tmp)
        client = httpx.Client(base_url=url, timeout=60)
        browser = driver.chromium.launch(executable_path=chromium(), headless=True, args=FLAGS)
        service = psutil.Process(proc.pid)
        clip = make_video(
            root / "clip.mp4", segments=1, segment_seconds=0.4, fps=10, size=(64, 48), audio=False
        ).read_bytes()

        page_bytes(browser, url)
        print(f"\nservice while one job runs {args.seconds:.0f} s ({steps} progress reports):")
        runs = ((0, False), (1, False), (16, False), (16, True)) if args.seconds else ()
        for i, (count, tabs) in enumerate(runs):
            name = f"run {i}.mp4"
            (root / "drop" / name).write_bytes(clip + i.to_bytes(8, "big"))
            # browser.new_page(): a browser (context) of its own, with its own stream;
            # tabs of one context share one stream (one tab reads it, the others are told).
            context = browser.new_context() if tabs else None
            pages = [(context or browser).new_page() for _ in range(count)]
            for page in pages:
                page.goto(url + "/")
                page.wait_for_selector("#live:text('live')")
            cpu, rss = job_cost(client, service, name)
            streams = open_streams(client)  # by now those of closed pages are gone
            what = "tabs of one browser" if tabs else "page(s), a browser each"
            print(
                f"  {count:2d} {what}: {streams} stream(s); CPU {cpu:5.1f} % of a core,"
                f" peak RSS {rss:6.1f} MiB"
            )
            for page in pages:
                page.close()
            if context:
                context.close()
            # The service sees the closed pages' streams end within its keep-alive.
            time.sleep(Config().service.event_keepalive + 1)
        if args.waiting:
            long_line(browser, client, url, root, clip, args.waiting)
        browser.close()


def page_bytes(browser, url: str) -> None:
    page = browser.new_page()
    sizes: dict[str, int] = {}
    # The event stream never ends: its body is not waited for.
    page.on(
        "response",
        lambda r: (
            sizes.__setitem__(r.url, len(r.body()))
            if r.ok and not r.url.endswith("/events")
            else None
        ),
    )
    page.goto(url + "/")
    page.wait_for_selector("#live:text('live')")
    page.wait_for_timeout(1500)
    own = sum(n for u, n in sizes.items() if "/api/" not in u)
    api = sum(n for u, n in sizes.items() if "/api/" in u)
    print(
        f"first load: page {own:,} bytes (HTML, CSS, JS; uncompressed), "
        f"then {api:,} bytes of API answers for an empty queue"
    )
    page.close()


def job_cost(client: httpx.Client, service: psutil.Process, name: str) -> tuple[float, float]:
    file_uuid = wait_file(client, name)
    task = client.post(
        f"/api/v1/file/{file_uuid}/deep-scan", json={"processors": ["steps"]}
    ).json()["task_id"]
    started = time.monotonic()
    cpu_before = sum(service.cpu_times()[:2])
    peak = 0.0
    while client.get(f"/api/v1/jobs/{task}").json()["status"] in ("pending", "processing"):
        peak = max(peak, service.memory_info().rss / 2**20)
        time.sleep(1)
    cpu = sum(service.cpu_times()[:2]) - cpu_before
    return 100 * cpu / (time.monotonic() - started), peak


def open_streams(client: httpx.Client) -> int:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("momentry_event_streams "):
            return int(float(line.split()[1]))
    return -1


def wait_file(client: httpx.Client, name: str) -> str:
    for _ in range(600):
        files = client.get("/api/v1/files", params={"name": name}).json()["files"]
        if files and files[0]["status"] == "completed":  # its ingest job (noop) is done
            return files[0]["file_uuid"]
        time.sleep(0.1)
    raise SystemExit(f"{name} was not registered")


def long_line(browser, client: httpx.Client, url: str, root: Path, clip: bytes, n: int) -> None:
    client.post("/api/v1/queue/pause")
    began = time.monotonic()
    for i in range(n):
        (root / "drop" / f"line {i:05d}.mp4").write_bytes(clip + (10**6 + i).to_bytes(8, "big"))
    while client.get("/api/v1/queue/status", params={"limit": 1}).json()["pending_count"] < n:
        time.sleep(1)
    print(f"\n{n} jobs waiting (queued in {time.monotonic() - began:.0f} s), queue paused:")
    for params, label in (
        ({}, "its default page (50)"),
        ({"limit": 25, "offset": 2500}, "25 from 2,500"),
    ):
        took = []
        for _ in range(5):
            t = time.monotonic()
            client.get("/api/v1/queue/status", params=params).raise_for_status()
            took.append(time.monotonic() - t)
        print(f"  GET /api/v1/queue/status, {label}: median {sorted(took)[2] * 1000:.0f} ms")
    page = browser.new_page()
    t = time.monotonic()
    page.goto(url + "/")
    page.wait_for_selector("#waiting li:nth-child(25)")
    print(f"  page opened to its first 25 waiting jobs in {time.monotonic() - t:.2f} s")
    t = time.monotonic()
    page.get_by_role("button", name="Next page").first.click()
    expect(page.locator("#waiting-pager")).to_contain_text(f"26–50 of {n}", timeout=60_000)
    print(f"  Next page shown in {time.monotonic() - t:.2f} s")
    t = time.monotonic()
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#service-state")).to_have_text("queue running", timeout=60_000)
    print(f"  Resume clicked to 'queue running' shown in {time.monotonic() - t:.2f} s")
    page.close()
    client.post("/api/v1/queue/clear")


if __name__ == "__main__":
    main()
