"""momentry-edge: turn video files dropped over SFTP into analysis results."""

__version__ = "0.1.0"

from . import imports

imports.install()  # before anything here imports peewee, Huey or httpx
