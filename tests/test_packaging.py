"""A wheel built from the repository carries what the installed service reads at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_wheel_carries_the_model_catalog_the_launch_agent_template_and_the_console(tmp_path):
    source = tmp_path / "source"  # a copy of what git tracks, so the build leaves no trace here
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        target = source / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name.decode(), target, follow_symlinks=False)

    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("momentry_edge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        catalog = archive.read("momentry_edge/catalog.toml").decode()
        template = archive.read("momentry_edge/launchd/com.momentry.edge.plist.template")
        console = {
            name: archive.read(f"momentry_edge/static/{name}")
            for name in ("index.html", "app.js", "app.css")
        }
    assert catalog == (ROOT / "models" / "catalog.toml").read_text()
    # The LaunchAgent template lives in the top-level launchd/ folder, beside its README.
    assert template == (ROOT / "launchd" / "com.momentry.edge.plist.template").read_bytes()
    for name, content in console.items():  # the web console's page
        assert content == (ROOT / "momentry_edge" / "static" / name).read_bytes()
