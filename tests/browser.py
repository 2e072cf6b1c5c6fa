"""The browser the console's tests drive: Debian's chromium-headless-shell (or chromium)
package through Playwright, never a browser Playwright would download; one launch per
test file, each context a fresh profile. A plugin of tests/conftest.py: its fixtures
``playwright`` and ``browser`` serve every test file."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Playwright, sync_playwright

CHROMIUM = ("chromium-headless-shell", "chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    for name in CHROMIUM:
        found = shutil.which(name) or shutil.which(name, path="/usr/lib/chromium")
        if found:
            return found
    pytest.fail("no Chromium: scripts/test installs Debian's chromium-headless-shell")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # Playwright gives each launch a fresh profile (user data dir) of its own.
    launched = playwright.chromium.launch(executable_path=chromium(), headless=True, args=FLAGS)
    yield launched
    launched.close()
