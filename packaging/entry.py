"""The one-file executable's entry point: the same CLI as the `momentry-edge` script."""

import sys

from momentry_edge.cli import main

if __name__ == "__main__":
    sys.exit(main())
