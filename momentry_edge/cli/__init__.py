"""The terminal side: the `momentry-edge` commands, the HTTP client, the TUI, service files."""

from .main import main as main  # the console script's entry point (momentry_edge.cli:main)
