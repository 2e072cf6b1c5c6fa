"""Running jobs: dispatch and wake-ups on Huey, one job's run, the processor pool."""
