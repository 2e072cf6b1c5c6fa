"""`momentry-edge config show`: the settings in effect and where each came from. Those of
the running service when one is found (its registry entry, its queue's run-time values),
else those `momentry-edge run` would use in this shell."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import registry, settings
from ..config import Config
from ..terminal import printable
from .client import (
    ApiClient,
    ApiError,
    Found,
    ServiceUnreachable,
    UnexpectedReply,
    find_service,
    find_token,
)


def show(cfg: Config, args: argparse.Namespace) -> int:
    found = Found(args.url, "--url") if args.url else find_service(cfg)
    status, refused = _queue_status(found.url, find_token(cfg, found, args.token).value)
    entry = found.entry or next((e for e in registry.running() if e.get("url") == found.url), None)
    if status is not None and entry and isinstance(entry.get("settings"), list):
        rows, whose = entry["settings"], f"the service at {found.url} (pid {entry.get('pid')})"
        source = entry.get("config")
    else:
        rows, source = settings.effective(cfg), str(cfg.source) if cfg.source else None
        if status is not None:
            whose = f"read here; the service at {found.url} answers but did not register them"
        elif refused:
            whose = f"what `momentry-edge run` would use here ({found.url} refused: {refused})"
        else:
            whose = f"what `momentry-edge run` would use here (no service answers at {found.url})"
    if status is not None:
        rows = settings.with_run_time(rows, status)
    if args.json:
        print(json.dumps({"of": whose, "config": source, "settings": rows}, indent=2))
        return 0
    print(printable(f"settings of {whose}"))
    print(printable(f"config file: {source or 'none (defaults and environment)'}"))
    width = max(len(row["key"]) for row in rows)
    for row in rows:
        value = json.dumps(row["value"])
        print(printable(f"{row['key']:<{width}} = {value}  ({row['origin']})"))
    return 0


def _queue_status(url: str, token: str) -> tuple[dict[str, Any] | None, str]:
    """The service's queue status, or None and why not when it answered with a refusal."""
    try:
        with ApiClient(url, token) as api:
            return api.queue_status(), ""
    except ApiError as exc:  # e.g. a token it does not take: say so, not "no service"
        return None, exc.message
    except (ServiceUnreachable, UnexpectedReply, ValueError):
        return None, ""
