"""Start the service at login: a launchd LaunchAgent on macOS, a systemd user unit on Linux.

``spec()`` gathers this machine's facts (the momentry-edge executable, the config
file, the data dir, PATH); ``render()`` turns them into the plist (from the template
in launchd/, which the package carries through a link) or the unit; ``install()``,
``uninstall()`` and ``status()`` write the file and ask the service manager. A machine
where neither manager is usable (a container, CI, an SSH session without a systemd user
manager) gets a plain answer with exit code NO_MANAGER, never a traceback.
"""

from __future__ import annotations

import getpass
import os
import plistlib
import shutil
import string
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LABEL = "com.momentry.edge"
UNIT = "momentry-edge.service"
# Shipped inside the package so that a wheel install can still render it.
TEMPLATE = Path(__file__).resolve().parent / "launchd" / f"{LABEL}.plist.template"
PLATFORMS = ("macos", "linux")
# Exit codes of `momentry-edge service ...`.
OK, NOT_RUNNING, NO_MANAGER = 0, 1, 3
# Directories a service needs on PATH even when the installing shell had a thin one.
SYSTEM_PATH = ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")


class AutostartError(Exception):
    """The file cannot be made (e.g. the plist template is missing)."""


@dataclass(frozen=True)
class Spec:
    """What the service manager should start, and where."""

    program: tuple[str, ...]  # argv before "run": the executable, then --config FILE if given
    data_dir: Path
    environment: dict[str, str] = field(default_factory=dict)  # PATH first
    label: str = LABEL

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"


@dataclass(frozen=True)
class Report:
    code: int  # OK, NOT_RUNNING or NO_MANAGER
    text: str


def current_platform() -> str:
    return "macos" if sys.platform == "darwin" else "linux"


def spec(data_dir: Path, config: str | None = None, env: Mapping[str, str] | None = None) -> Spec:
    """The spec for this machine; ``config``: the --config value, else MOMENTRY_CONFIG."""
    env = os.environ if env is None else env
    config = config or env.get("MOMENTRY_CONFIG")
    program = executable()
    environment = {"PATH": _path(Path(program[0]).parent, env.get("PATH", ""))}
    if config:
        config = os.path.abspath(os.path.expanduser(config))
        program += ["--config", config]
        environment["MOMENTRY_CONFIG"] = config
    if env.get("MOMENTRY_DATA_DIR"):
        # Given at install time, so the service must see it too. No token is copied:
        # service files are world-readable; the token belongs in momentry.toml.
        environment["MOMENTRY_DATA_DIR"] = os.path.abspath(data_dir)
    return Spec(tuple(program), Path(os.path.abspath(data_dir)), environment)


def executable() -> list[str]:
    """The absolute path of the momentry-edge now running (not resolved: keep the venv's)."""
    launcher = os.environ.get("MOMENTRY_EDGE_EXECUTABLE")
    if launcher and os.path.isfile(launcher):
        return [launcher]  # the one-file build, not the cache folder it unpacked itself into
    argv0 = Path(sys.argv[0])
    if argv0.name == "momentry-edge":
        return [os.path.abspath(argv0)]
    beside = Path(sys.executable).parent / "momentry-edge"
    if beside.is_file():
        return [os.path.abspath(beside)]
    found = shutil.which("momentry-edge")
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-m", "momentry_edge.cli"]


def _path(first: Path, current: str) -> str:
    parts = [str(first), *current.split(os.pathsep), *filter(os.path.isdir, SYSTEM_PATH)]
    # An entry with a control character is no folder a service needs, and no plist holds it.
    return os.pathsep.join(dict.fromkeys(p for p in parts if p and not _has_control(p)))


# -- rendering ------------------------------------------------------------------------------------


def render(platform: str, spec: Spec) -> str:
    """The plist (macos) or unit (linux) that install would write."""
    if platform == "macos":
        return render_plist(spec)
    if platform == "linux":
        return render_unit(spec)
    raise AutostartError(f"unknown platform {platform!r}; one of {', '.join(PLATFORMS)}")


def render_plist(spec: Spec) -> str:
    try:
        template = plistlib.loads(TEMPLATE.read_bytes())
    except OSError as exc:
        raise AutostartError(
            f"plist template {TEMPLATE} is missing ({exc.strerror}); "
            "install momentry-edge from its source tree (pip install -e .)"
        ) from None
    values = {
        "label": spec.label,
        "data_dir": str(spec.data_dir),
        "logs": str(spec.logs),
        "path": spec.environment["PATH"],
    }
    plist = _fill(template, values, spec.program)
    plist["EnvironmentVariables"] |= spec.environment
    try:
        return plistlib.dumps(plist, sort_keys=False).decode()
    except ValueError as exc:  # XML 1.0 has no control characters (config.load refuses them)
        raise AutostartError(f"cannot write the plist: {exc} (in a path or PATH)") from None


def _fill(node: Any, values: dict[str, str], program: tuple[str, ...]) -> Any:
    # "$program" is a list item that becomes several; every other "$name" is one string.
    if isinstance(node, dict):
        return {key: _fill(value, values, program) for key, value in node.items()}
    if isinstance(node, list):
        items: list[Any] = []
        for item in node:
            items += list(program) if item == "$program" else [_fill(item, values, program)]
        return items
    if isinstance(node, str):
        return string.Template(node).substitute(values)
    return node


def render_unit(spec: Spec) -> str:
    environment = [f"Environment={_quote(f'{k}={v}')}" for k, v in spec.environment.items()]
    lines = [
        "# Written by `momentry-edge service install`;",
        "# `momentry-edge service render --platform linux` prints it.",
        "[Unit]",
        "Description=momentry-edge: watch the drop folder and run deep scans",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(_quote(arg, exec_line=True) for arg in (*spec.program, 'run'))}",
        f"WorkingDirectory={_literal_path(spec.data_dir)}",
        *environment,
        # Like launchd's KeepAlive, except after exit code 2: a bad config stays stopped
        # (with its message in the journal) instead of restarting forever.
        "Restart=always",
        "RestartSec=10",
        "RestartPreventExitStatus=2",
        # SIGTERM first: the service stops taking work and saves checkpoints.
        "TimeoutStopSec=60",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    # Output goes to the journal (rotated for us): journalctl --user -u momentry-edge
    return "\n".join(lines) + "\n"


def _quote(value: str, exec_line: bool = False) -> str:
    """One value of an ExecStart= or Environment= line, as systemd reads it back."""
    # systemd expands %specifiers everywhere, and $VARS in ExecStart; both must be doubled.
    value = value.replace("%", "%%")
    if exec_line:
        value = value.replace("$", "$$")
    if value and not any(c in value for c in " \t\"\\';") and not _has_control(value):
        return value
    # In quotes systemd reads C escapes: a newline written as \x0a cannot end the line.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(f"\\x{ord(c):02x}" if _has_control(c) else c for c in escaped) + '"'


def _literal_path(path: Path) -> str:
    """A path setting (WorkingDirectory=), which systemd takes literally to the end of the
    line: no quotes or escapes, only %% for %. What it cannot carry is refused."""
    text = str(path)
    if _has_control(text) or text != text.strip() or text.endswith("\\"):
        # A newline would start a line of its own, a trailing backslash join the next one
        # and outer spaces be stripped.
        raise AutostartError(
            f"the path {text!r} cannot be written into a systemd unit (control characters, "
            "a trailing backslash or outer spaces); use another data dir"
        )
    return text.replace("%", "%%")


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


# -- install / uninstall / status -----------------------------------------------------------------


def service_file(platform: str, home: Path | None = None) -> Path:
    home = home or Path.home()
    if platform == "macos":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return home / ".config" / "systemd" / "user" / UNIT


def install(spec: Spec, platform: str | None = None) -> Report:
    platform = platform or current_platform()
    reason = manager_problem(platform)
    if reason:
        return Report(NO_MANAGER, f"cannot install: {reason}")
    path = service_file(platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec.logs.mkdir(parents=True, exist_ok=True)  # launchd does not create log folders
    path.write_text(render(platform, spec), encoding="utf-8")
    if platform == "macos":
        return _launchd_install(path)
    return _systemd_install(path)


def uninstall(platform: str | None = None) -> Report:
    platform = platform or current_platform()
    reason = manager_problem(platform)
    if reason:
        return Report(NO_MANAGER, f"cannot uninstall: {reason}")
    path = service_file(platform)
    if platform == "macos":
        if not _run("launchctl", "bootout", _launchd_target()).ok and path.exists():
            _run("launchctl", "unload", "-w", str(path))
    elif path.exists():
        _run("systemctl", "--user", "disable", "--now", UNIT)
    if not path.exists():
        return Report(OK, f"not installed ({path} does not exist); nothing to remove")
    path.unlink()
    if platform == "linux":
        _run("systemctl", "--user", "daemon-reload")
    return Report(OK, f"stopped and removed {path}")


def status(platform: str | None = None) -> Report:
    platform = platform or current_platform()
    reason = manager_problem(platform)
    if reason:
        return Report(NO_MANAGER, f"autostart is not available here: {reason}")
    path = service_file(platform)
    if not path.exists():
        return Report(NOT_RUNNING, f"not installed ({path} does not exist)")
    if platform == "macos":
        return _launchd_status(path)
    return _systemd_status(path)


def manager_problem(platform: str) -> str | None:
    """Why this machine's service manager cannot be used for ``platform``; None when it can."""
    if platform not in PLATFORMS:
        return f"unknown platform {platform!r}; one of {', '.join(PLATFORMS)}"
    if platform == "macos":
        return None if shutil.which("launchctl") else "launchd is not here (no launchctl)"
    if not shutil.which("systemctl"):
        return (
            "systemd does not run this machine (no systemctl); start `momentry-edge run` "
            "from its own init system or supervisor"
        )
    probe = _run("systemctl", "--user", "show-environment")
    if not probe.ok:
        return (
            f"the systemd user manager is not reachable ({probe.reason}); log in to a "
            "systemd session, or have an administrator run `loginctl enable-linger "
            f"{_user()}`"
        )
    return None


# -- launchd --------------------------------------------------------------------------------------


def _launchd_target() -> str:
    return f"gui/{os.getuid()}/{LABEL}"


def _launchd_install(path: Path) -> Report:
    domain = f"gui/{os.getuid()}"
    # A loaded agent keeps its old definition until it is booted out.
    _run("launchctl", "bootout", _launchd_target())
    loaded = _run("launchctl", "bootstrap", domain, str(path))
    how = f"launchctl bootstrap {domain}"
    if not loaded.ok:
        # Older macOS, or no GUI session (e.g. over SSH): the legacy command still works.
        legacy = _run("launchctl", "load", "-w", str(path))
        if not legacy.ok:
            return Report(
                NOT_RUNNING,
                f"wrote {path}, but launchd did not load it: {loaded.reason}; {legacy.reason}",
            )
        how = "launchctl load"
    return Report(OK, f"wrote {path} and loaded it ({how}); it starts at every login")


def _launchd_status(path: Path) -> Report:
    shown = _run("launchctl", "print", _launchd_target())
    if not shown.ok:
        return Report(NOT_RUNNING, f"installed ({path}) but not loaded: {shown.reason}")
    fields = dict(
        line.strip().split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line
    )
    if fields.get("state") == "running":
        return Report(OK, f"running (pid {fields.get('pid', '?')}), {path}")
    last = fields.get("last exit code", "unknown")
    return Report(NOT_RUNNING, f"loaded but not running (last exit code {last}), {path}")


# -- systemd --------------------------------------------------------------------------------------


def _systemd_install(path: Path) -> Report:
    # restart, not only enable --now: a running service picks up the new unit at once.
    for step in (("daemon-reload",), ("enable", UNIT), ("restart", UNIT)):
        done = _run("systemctl", "--user", *step)
        if not done.ok:
            return Report(
                NOT_RUNNING, f"wrote {path}, but systemctl --user {step[0]} failed: {done.reason}"
            )
    return Report(
        OK,
        f"wrote {path}, enabled and started it; it starts at every login "
        f"(to start at boot without a login: loginctl enable-linger {_user()})",
    )


def _systemd_status(path: Path) -> Report:
    enabled = _run("systemctl", "--user", "is-enabled", UNIT).stdout.strip() or "unknown"
    active = _run("systemctl", "--user", "is-active", UNIT).stdout.strip() or "unknown"
    pid = _run("systemctl", "--user", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    text = f"{active} ({enabled}" + (f", pid {pid})" if pid not in ("", "0") else ")") + f", {path}"
    return Report(OK if active == "active" else NOT_RUNNING, text)


# -- plumbing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Done:
    ok: bool
    stdout: str
    reason: str  # the first line of stderr (or the exit code) when not ok


def _run(*command: str) -> _Done:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _Done(False, "", f"{command[0]}: {exc}")
    first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
    return _Done(proc.returncode == 0, proc.stdout, first)


def _user() -> str:
    return getpass.getuser()
