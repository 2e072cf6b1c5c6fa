"""Wall and CPU seconds of every test, the service processes it started included.

Loaded by tests/conftest.py. Each test's setup, call and teardown are timed together,
so a module fixture (a made video, a converted model) counts towards the first test
that needs it. CPU is this process's and that of every child it waited for (the
services a test starts and stops). With MOMENTRY_TEST_TIMINGS=FILE each test appends
a JSON line to FILE (scripts/timings.py reads it into a table per file and per test),
with the seconds the test spent in conftest.wait_for and the polls it made there.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Waits:
    seconds: float = 0.0
    polls: int = 0


WAITS = Waits()  # conftest.wait_for adds to it; each test starts from zero
OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # The worst of setup, call and teardown: a line says at once which test failed.
    report = (yield).get_result()
    if report.outcome == "failed" or item.stash.get(OUTCOME, "passed") == "passed":
        item.stash[OUTCOME] = report.outcome


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get("MOMENTRY_TEST_TIMINGS")
    wall, cpu = time.monotonic(), _cpu()
    WAITS.seconds, WAITS.polls = 0.0, 0
    yield
    if path:
        line = {
            "test": item.nodeid,
            "file": item.nodeid.split("::")[0],
            "wall": round(time.monotonic() - wall, 3),
            "cpu": round(_cpu() - cpu, 3),
            "waited": round(WAITS.seconds, 3),
            "polls": WAITS.polls,
            "outcome": item.stash.get(OUTCOME, "passed"),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "end": time.time(),
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
