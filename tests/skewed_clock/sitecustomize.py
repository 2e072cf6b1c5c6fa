"""On a Python path with CLOCK_SKEW_SECONDS set, this process's wall clock reads that many
seconds off, as on a machine whose clock is wrong (its monotonic clock, like a real
machine's, is not moved). Python imports this module at start-up, before any other."""

import os
import time

_skew = float(os.environ.get("CLOCK_SKEW_SECONDS") or 0)
if _skew:
    _wall = time.time
    time.time = lambda: _wall() + _skew
