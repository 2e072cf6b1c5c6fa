"""Start the service at login (a LaunchAgent, a systemd user unit) or at boot as the
operator's user (a LaunchDaemon with UserName, a system unit with User=)."""

# ``spec()`` gathers this machine's facts; ``render()`` makes the plist (from the template in
# launchd/) or the unit; ``install()``, ``uninstall()``, ``status()`` and ``control()``
# (start, stop, restart) write the file and ask the service manager. Where no manager is
# usable the answer is plain, with exit code NO_MANAGER, never a traceback.

from __future__ import annotations

import getpass
import json
import os
import plistlib
import pwd
import shutil
import string
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ENV_FILE_VAR, setting_variables

LABEL = "com.momentry.edge"
ENV_FILE = "service-env.json"  # in the data dir
UNIT = "momentry-edge.service"
# Shipped inside the package so that a wheel install can still render it.
TEMPLATE = Path(__file__).resolve().parent.parent / "launchd" / f"{LABEL}.plist.template"
PLATFORMS = ("macos", "linux")
# Exit codes of `momentry-edge service ...`.
OK, NOT_RUNNING, NO_MANAGER = 0, 1, 3
# Set in the plist: a configuration error then exits 0, not 2. launchd cannot be told to
# leave one exit code alone (systemd's RestartPreventExitStatus), but KeepAlive with
# SuccessfulExit false does not restart a clean exit, so a bad config stays stopped.
SUPERVISOR_VAR = "MOMENTRY_SUPERVISOR"
# Where files for a start at boot go; tests point it at a scratch folder.
SYSTEM_ROOT = Path("/")
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
    user: str = ""  # set: start at boot, running as this user; empty: start at login
    # Settings given through this shell's environment (DATABASE_URL, ...): written to
    # env_file (0600, the service's user's), never into the world-readable unit or plist.
    carried: dict[str, str] = field(default_factory=dict)

    @property
    def env_file(self) -> Path:
        return self.data_dir / ENV_FILE

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"


@dataclass(frozen=True)
class Report:
    code: int  # OK, NOT_RUNNING or NO_MANAGER
    text: str


def current_platform() -> str:
    return "macos" if sys.platform == "darwin" else "linux"


def spec(
    data_dir: Path,
    config: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str = "",
) -> Spec:
    """The spec for this machine; ``config``: the --config value, else MOMENTRY_CONFIG;
    ``user``: start at boot as this user (see boot_user) instead of at login."""
    env = os.environ if env is None else env
    config = config or env.get("MOMENTRY_CONFIG")
    program = executable()
    environment = {"PATH": _path(Path(program[0]).parent, env.get("PATH", ""))}
    if config:
        config = os.path.abspath(os.path.expanduser(config))
        program += ["--config", config]
        environment["MOMENTRY_CONFIG"] = config
    if env.get("MOMENTRY_DATA_DIR"):
        # Given at install time, so the service must see it too.
        environment["MOMENTRY_DATA_DIR"] = os.path.abspath(data_dir)
    # The other settings given through the environment (a database URL with its password,
    # the token, the host): to the service through a file only its user reads, as the
    # unit and plist are world-readable.
    paths = ("MOMENTRY_DATA_DIR", "MOMENTRY_SERVICE_DATA_DIR")
    carried = {k: v for k, v in setting_variables(env).items() if k not in paths}
    data_dir = Path(os.path.abspath(data_dir))
    if carried:
        environment[ENV_FILE_VAR] = str(data_dir / ENV_FILE)
    if user:
        # A daemon starts with no login session: say whose home ~ and the models are in.
        environment["HOME"] = _home(user)
    return Spec(tuple(program), data_dir, environment, user=user, carried=carried)


def boot_user(given: str = "", env: Mapping[str, str] | None = None) -> str:
    """Who a start at boot runs as: ``given`` (--user), else the user who typed `sudo`,
    else the one running this; never root, as the service decodes uploaded media."""
    env = os.environ if env is None else env
    user = given or env.get("SUDO_USER") or _user()
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise AutostartError(f"no user {user!r} on this machine") from None
    if uid == 0:
        raise AutostartError(
            "a service started at boot runs as a normal account, not as root (it decodes "
            "uploaded media): name the account with --user NAME, e.g. "
            "`sudo momentry-edge service install --at-boot --user studio`"
        )
    return user


def _home(user: str) -> str:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        raise AutostartError(f"no user {user!r} on this machine") from None


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
    plist["EnvironmentVariables"] |= spec.environment | {SUPERVISOR_VAR: "launchd"}
    if spec.user:  # a LaunchDaemon: started at boot, run as the operator, not as root
        plist["UserName"] = spec.user
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
    boot = ["--at-boot"] if spec.user else []
    lines = [
        f"# Written by `momentry-edge service install{' --at-boot' * bool(boot)}`;",
        f"# `momentry-edge service render --platform linux{' --at-boot' * bool(boot)}` prints it.",
        "[Unit]",
        "Description=momentry-edge: watch the drop folder and run deep scans",
        # At boot: after the network, for a database server or a shared results folder.
        *(["Wants=network-online.target", "After=network-online.target"] if boot else []),
        "",
        "[Service]",
        "Type=simple",
        *([f"User={_literal_path(Path(spec.user))}"] if boot else []),
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
        f"WantedBy={'multi-user.target' if boot else 'default.target'}",
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


# -- install / uninstall / status / start, stop, restart -----------------------------------------


def service_file(platform: str, home: Path | None = None, at_boot: bool = False) -> Path:
    if at_boot:
        if platform == "macos":
            return SYSTEM_ROOT / "Library" / "LaunchDaemons" / f"{LABEL}.plist"
        return SYSTEM_ROOT / "etc" / "systemd" / "system" / UNIT
    home = home or Path.home()
    if platform == "macos":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return home / ".config" / "systemd" / "user" / UNIT


def install(spec: Spec, platform: str | None = None) -> Report:
    platform = platform or current_platform()
    at_boot = bool(spec.user)
    reason = manager_problem(platform, at_boot)
    if reason:
        return Report(NO_MANAGER, f"cannot install: {reason}")
    path = service_file(platform, at_boot=at_boot)
    if at_boot and not _may_write(path):
        return Report(
            NOT_RUNNING,
            f"cannot write {path}: a start at boot is installed by root; run "
            "`sudo momentry-edge service install --at-boot` (it still runs as "
            f"{spec.user}, not as root)",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    spec.logs.mkdir(parents=True, exist_ok=True)  # launchd does not create log folders
    if at_boot and os.geteuid() == 0:
        _give(spec.data_dir, spec.user)  # made by root: the service's user must write there
    _write_env_file(spec)
    path.write_text(render(platform, spec), encoding="utf-8")
    if platform == "macos":
        return _launchd_install(path, at_boot)
    return _systemd_install(path, at_boot)


def uninstall(platform: str | None = None, at_boot: bool = False) -> Report:
    platform = platform or current_platform()
    reason = manager_problem(platform, at_boot)
    if reason:
        return Report(NO_MANAGER, f"cannot uninstall: {reason}")
    path = service_file(platform, at_boot=at_boot)
    if platform == "macos":
        if not _run("launchctl", "bootout", _launchd_target(at_boot)).ok and path.exists():
            _run("launchctl", "unload", "-w", str(path))
    elif path.exists():
        _run("systemctl", *_scope(at_boot), "disable", "--now", UNIT)
    if not path.exists():
        return Report(OK, f"not installed ({path} does not exist); nothing to remove")
    path.unlink()
    if platform == "linux":
        _run("systemctl", *_scope(at_boot), "daemon-reload")
    return Report(OK, f"stopped and removed {path}")


def installed(platform: str) -> bool | None:
    """True: installed to start at boot, False: at login, None: not installed."""
    if service_file(platform, at_boot=True).exists():
        return True
    return False if service_file(platform).exists() else None


def status(platform: str | None = None) -> Report:
    platform = platform or current_platform()
    at_boot = installed(platform)
    reason = manager_problem(platform, bool(at_boot))
    if reason:
        return Report(NO_MANAGER, f"autostart is not available here: {reason}")
    if at_boot is None:
        path = service_file(platform)
        return Report(NOT_RUNNING, f"not installed ({path} does not exist)")
    path = service_file(platform, at_boot=at_boot)
    when = "starts at boot" if at_boot else "starts at login"
    if platform == "macos":
        report = _launchd_status(path, at_boot)
    else:
        report = _systemd_status(path, at_boot)
    return Report(report.code, f"{report.text}; {when}")


ACTIONS = ("start", "stop", "restart")


def control(action: str, platform: str | None = None) -> Report:
    """Start, stop or restart the installed service through its manager."""
    platform = platform or current_platform()
    at_boot = installed(platform)
    reason = manager_problem(platform, bool(at_boot))
    if reason:
        return Report(NO_MANAGER, f"cannot {action}: {reason}")
    if at_boot is None:
        return Report(
            NOT_RUNNING,
            f"cannot {action}: not installed ({service_file(platform)} does not exist); "
            "`momentry-edge service install` first, or run `momentry-edge run` yourself",
        )
    if platform == "macos":
        target = _launchd_target(at_boot)
        # stop: SIGTERM; the clean exit that follows is not restarted (KeepAlive).
        command = {
            "start": ("kickstart", target),
            "restart": ("kickstart", "-k", target),
            "stop": ("kill", "SIGTERM", target),
        }[action]
        done = _run("launchctl", *command)
    else:
        done = _run("systemctl", *_scope(at_boot), action, UNIT)
    if not done.ok:
        hint = " (as root: sudo)" if at_boot and os.geteuid() != 0 else ""
        return Report(NOT_RUNNING, f"{action} failed: {done.reason}{hint}")
    return Report(OK, f"{action}: done ({'stopping' if action == 'stop' else 'starting'})")


def manager_problem(platform: str, at_boot: bool = False) -> str | None:
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
    if at_boot:
        return None  # the system manager: there whenever systemctl is
    probe = _run("systemctl", "--user", "show-environment")
    if not probe.ok:
        return (
            f"the systemd user manager is not reachable ({probe.reason}); log in to a "
            "systemd session, use `service install --at-boot`, or have an administrator "
            f"run `loginctl enable-linger {_user()}`"
        )
    return None


def _may_write(path: Path) -> bool:
    folder = next((p for p in (path.parent, *path.parents) if p.exists()), path.anchor)
    return os.access(folder, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def _write_env_file(spec: Spec) -> None:
    """The settings given through the environment, for the service alone (0600, its user's);
    an earlier install's file goes when there are none now."""
    if not spec.carried:
        spec.env_file.unlink(missing_ok=True)
        return
    staged = spec.env_file.with_name(f".{ENV_FILE}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        if spec.user and os.geteuid() == 0:
            entry = pwd.getpwnam(spec.user)
            os.fchown(f.fileno(), entry.pw_uid, entry.pw_gid)
        json.dump(spec.carried, f, indent=2)
    os.replace(staged, spec.env_file)


def _give(folder: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for made in (folder, folder / "logs"):
        os.chown(made, entry.pw_uid, entry.pw_gid)


# -- launchd --------------------------------------------------------------------------------------


def _launchd_domain(at_boot: bool) -> str:
    return "system" if at_boot else f"gui/{os.getuid()}"


def _launchd_target(at_boot: bool = False) -> str:
    return f"{_launchd_domain(at_boot)}/{LABEL}"


def _launchd_install(path: Path, at_boot: bool) -> Report:
    domain = _launchd_domain(at_boot)
    # A loaded agent keeps its old definition until it is booted out.
    _run("launchctl", "bootout", _launchd_target(at_boot))
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
    when = "at every boot, before anyone logs in" if at_boot else "at every login"
    return Report(OK, f"wrote {path} and loaded it ({how}); it starts {when}")


def _launchd_status(path: Path, at_boot: bool) -> Report:
    shown = _run("launchctl", "print", _launchd_target(at_boot))
    if not shown.ok:
        return Report(NOT_RUNNING, f"installed ({path}) but not loaded: {shown.reason}")
    fields = dict(
        line.strip().split(" = ", 1) for line in shown.stdout.splitlines() if " = " in line
    )
    if fields.get("state") == "running":
        return Report(OK, f"running (pid {fields.get('pid', '?')}), {path}")
    last = fields.get("last exit code", "unknown")
    text = f"loaded but not running (last exit code {last}), {path}"
    try:
        plist = plistlib.loads(path.read_bytes())
        errors = Path(plist["StandardErrorPath"])
        said = errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except (OSError, ValueError, KeyError, plistlib.InvalidFileException):
        return Report(NOT_RUNNING, text)
    # A configuration error is printed before logging starts: the last line says why.
    why = f"; its last words, in {errors}: {said[-1]}" if said else f"; see {errors}"
    return Report(NOT_RUNNING, text + why)


# -- systemd --------------------------------------------------------------------------------------


def _scope(at_boot: bool) -> tuple[str, ...]:
    return () if at_boot else ("--user",)


def _systemd_install(path: Path, at_boot: bool) -> Report:
    # restart, not only enable --now: a running service picks up the new unit at once.
    for step in (("daemon-reload",), ("enable", UNIT), ("restart", UNIT)):
        done = _run("systemctl", *_scope(at_boot), *step)
        if not done.ok:
            return Report(
                NOT_RUNNING,
                f"wrote {path}, but systemctl {' '.join((*_scope(at_boot), step[0]))} "
                f"failed: {done.reason}",
            )
    if at_boot:
        return Report(OK, f"wrote {path}, enabled and started it; it starts at every boot")
    return Report(
        OK,
        f"wrote {path}, enabled and started it; it starts at every login "
        f"(to start at boot: sudo momentry-edge service install --at-boot)",
    )


def _systemd_status(path: Path, at_boot: bool) -> Report:
    scope = _scope(at_boot)
    enabled = _run("systemctl", *scope, "is-enabled", UNIT).stdout.strip() or "unknown"
    active = _run("systemctl", *scope, "is-active", UNIT).stdout.strip() or "unknown"
    pid = _run("systemctl", *scope, "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    text = f"{active} ({enabled}" + (f", pid {pid})" if pid not in ("", "0") else ")") + f", {path}"
    if active != "active":
        # Exit code 2 (a configuration error) is not restarted; the journal says why.
        text += f"; why: journalctl {' '.join(scope)} -u {UNIT} -n 20".replace("  ", " ")
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
