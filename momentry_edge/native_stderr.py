"""Native libraries' own log lines (MediaPipe's TensorFlow Lite and absl) held back from
stderr and said in our log at DEBUG instead: they write to file descriptor 2 directly,
past Python's logging, lines such as ``W0000 00:00:1796572464.629357 25200
inference_feedback_manager.cc:114] Feedback manager requires ...`` that tell an operator
nothing and read like problems.

Only while a library sets up or first runs (``held()``): fd 2 is the whole process's, so
what other threads write meanwhile is held too, and written to stderr as it was once the
window ends (delayed, never lost).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

log = logging.getLogger("momentry_edge.native")

# absl/glog ("W0000 00:00:1796572464.629357   25200 file.cc:114] ..."), TensorFlow Lite's
# ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU."), absl's own warning first.
NATIVE = re.compile(
    r"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] "
    r"|INFO: Created TensorFlow Lite"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called)"
)
_LOCK = threading.Lock()  # one window at a time: each saves and restores fd 2


@contextlib.contextmanager
def held() -> Iterator[None]:
    with _LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                caught.seek(0)
                _sort(caught.read().decode("utf-8", "replace"))


def _sort(text: str) -> None:
    others = []
    for line in text.splitlines():
        if NATIVE.match(line):
            log.debug("%s", line)
        elif line:
            others.append(line)
    if others:  # not the libraries': as they were written
        os.write(2, ("\n".join(others) + "\n").encode("utf-8", "replace"))
