"""Keeping the data: backup, restore, the database check at start, retention."""
