"""`python -m momentry_edge.cli`: what the service files the `autostart` command writes run."""

import sys

from .main import main

sys.exit(main())
