"""Beside the queue, each on a background thread: callbacks, alerts, the Redis mirror."""
