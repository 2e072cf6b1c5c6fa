"""Command line: `run` starts the service; the other commands are clients of its HTTP API."""

from __future__ import annotations

import argparse
import sys

from . import config as config_module
from . import service


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="momentry-edge", description=__doc__)
    parser.add_argument(
        "--config", help="path to momentry.toml (default: MOMENTRY_CONFIG or the data dir)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="run the service: watcher, queue workers and HTTP API")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_module.load(args.config)
        if args.command == "run":
            return service.run(cfg)
    except config_module.ConfigError as exc:
        print(f"momentry-edge: configuration error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
