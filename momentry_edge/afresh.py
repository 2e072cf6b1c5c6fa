"""Starting the service afresh in its own process (exec), as an idle service does once its
models are let go (``models.idle_restart``): the model libraries (onnxruntime, CTranslate2,
MediaPipe, OpenCV) keep about 300 MiB of code and pools once used, which only a new
program image gives back.

The pid stays, so launchd, a terminal and ``run.json`` keep following the same process,
and so does the API's listening socket, handed to the new image by its number: a request
sent meanwhile waits in the socket's backlog instead of being refused.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

log = logging.getLogger(__name__)

LISTEN_FD_VAR = "MOMENTRY_LISTEN_FD"


def command() -> list[str]:
    """The command line this process was started with, to start it again."""
    if getattr(sys, "frozen", False):  # the one-file build's program
        return [sys.executable, *sys.argv[1:]]
    return list(sys.orig_argv)


def start_afresh(listener: int | None) -> None:
    """Replace this process's image with a new start of the same command; returns only if
    that fails (said in the log). ``listener``: the API's listening socket, kept open."""
    env = dict(os.environ)
    if listener is not None:
        os.set_inheritable(listener, True)
        env[LISTEN_FD_VAR] = str(listener)
    if getattr(sys, "frozen", False):
        env["PYINSTALLER_RESET_ENVIRONMENT"] = "1"  # a new start, not a child of this one
    argv = command()
    logging.shutdown()  # the log file's last lines written before the image goes
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:
        log.error("could not start afresh (%s): %s", " ".join(argv), exc)


def inherited_listener(address: tuple[Any, ...]) -> socket.socket | None:
    """The listening socket the previous image handed over, if it listens where
    ``address`` (host, port; port 0: any) asks; else None (it is closed)."""
    fd = os.environ.pop(LISTEN_FD_VAR, None)  # the processes this one starts get none
    if fd is None:
        return None
    try:
        sock = socket.socket(fileno=int(fd))
    except (ValueError, OSError) as exc:
        log.warning("the listening socket handed over (%s) cannot be used: %s", fd, exc)
        return None
    sock.set_inheritable(False)
    host, port = sock.getsockname()[:2]
    if host != address[0] or (address[1] and port != address[1]):
        sock.close()  # the settings changed meanwhile: bind anew
        return None
    return sock
