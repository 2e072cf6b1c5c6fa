"""Run a command of momentry-edge with a fault at one exact step, as a wrapper.

    python crash_at.py SPEC <python> -m momentry_edge.cli ARGS...

SPEC is JSON: {"mode": ..., "events": [...], "under": PATH, "nth": N, "file": PATH}. A step
is a Python audit event (os.rename, os.link, os.remove, shutil.copyfile, subprocess.Popen,
sqlite3.connect, "open" for writing only, ...) naming a path below ``under``. At the
``nth`` such step (1 the first), before it is done, the process

- ``kill``: sends itself SIGKILL: no handler, no cleanup, as a power cut stops it;
- ``pause``: writes ``file``.paused and waits until ``file``.go exists.

``trace`` kills nothing and appends each step to ``file``, one ``event path`` a line, for a
test to kill at each of them in turn. Real crashes at exact steps, without mocks: the code
under test runs as shipped, up to the instant the kernel stops it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _named(event: str, args: tuple) -> tuple[str, str] | None:
    """(event, the path it names) for a step worth stopping at, else None."""
    if event == "open":
        path, mode, flags = args
        writes = any(c in (mode or "") for c in "wax+") if mode else bool(flags & WRITE_FLAGS)
        return ("open", os.fsdecode(path)) if writes and isinstance(path, str | bytes) else None
    if event == "subprocess.Popen":
        return event, " ".join(os.fsdecode(a) for a in args[1])
    if args and isinstance(args[0], str | bytes | os.PathLike):
        return event, os.fsdecode(args[0])
    return None


def main() -> None:
    spec = json.loads(sys.argv[1])
    events, under, mode = set(spec["events"]), spec["under"], spec["mode"]
    seen, busy = 0, False

    def hook(event: str, args: tuple) -> None:
        nonlocal seen, busy
        if event not in events or busy:
            return  # busy: the hook's own file writes
        step = _named(event, args)
        if step is None or under not in step[1]:
            return
        busy = True
        try:
            if mode == "trace":
                with open(spec["file"], "a", encoding="utf-8") as f:
                    f.write(f"{step[0]} {step[1]}\n")
                return
            seen += 1
            if seen != spec["nth"]:
                return
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            Path(spec["file"] + ".paused").write_text(f"{step[0]} {step[1]}\n")
            while not Path(spec["file"] + ".go").exists():
                time.sleep(0.01)
        finally:
            busy = False

    # What follows SPEC is the command line a test would run: <python> -m <module> ARGS,
    # perhaps with -X faulthandler before -m (conftest's), done here as python would.
    _python, *command = sys.argv[2:]
    if command[:2] == ["-X", "faulthandler"]:
        faulthandler.enable()
        command = command[2:]
    dash_m, module, *rest = command
    assert dash_m == "-m", sys.argv
    sys.argv = [module, *rest]
    sys.addaudithook(hook)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
