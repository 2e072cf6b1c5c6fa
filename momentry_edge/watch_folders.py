"""Whether each watched folder can be watched: the warnings `status`, the TUI and `doctor`
show, so that a folder missing or closed to the service is not passed over in silence."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def problems(folders: Sequence[Path]) -> list[str]:
    """One warning per watched folder that does not exist, is no folder, or cannot be read."""
    warnings = []
    for folder in folders:
        if not os.path.lexists(folder):
            warnings.append(f"watched folder {folder} does not exist: nothing there is taken")
        elif not folder.is_dir():
            warnings.append(f"watched folder {folder} is not a folder: nothing there is taken")
        else:
            try:
                os.scandir(folder).close()  # permission to list it (access() says yes as root)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                warnings.append(f"cannot read watched folder {folder}: {reason}")
    return warnings
