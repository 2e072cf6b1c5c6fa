"""Start at login: the LaunchAgent plist, the systemd user unit, and `momentry-edge service`."""

from __future__ import annotations

import json
import os
import plistlib
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from momentry_edge.cli import autostart

TEMPLATE = autostart.TEMPLATE


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    # HOME decides where service files go; an empty data dir keeps this machine's config out.
    base |= {"HOME": str(home), "MOMENTRY_DATA_DIR": str(home / "data")}
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def spec(tmp_path: Path) -> autostart.Spec:
    config = tmp_path / "my config" / "momentry.toml"
    config.parent.mkdir()
    config.write_text("")
    data_dir = tmp_path / "data 100%"
    return autostart.spec(data_dir, str(config), env={"PATH": "/usr/bin:/bin"})


def test_the_plist_template_is_a_plist_with_placeholders() -> None:
    template = plistlib.loads(TEMPLATE.read_bytes())
    assert template["Label"] == "$label" and template["ProgramArguments"] == ["$program", "run"]
    assert template["RunAtLoad"] is True and template["KeepAlive"] == {"SuccessfulExit": False}


def test_plist_has_the_required_keys_and_absolute_paths(spec: autostart.Spec) -> None:
    plist = plistlib.loads(autostart.render("macos", spec).encode())
    assert plist["Label"] == "com.momentry.edge"
    # Restarted after a failure, not after a clean exit (a stop, a configuration error).
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["EnvironmentVariables"]["MOMENTRY_SUPERVISOR"] == "launchd"
    assert "UserName" not in plist  # a LaunchAgent runs as whoever logs in
    program = plist["ProgramArguments"]
    config = str(spec.program[-1])
    assert program[-3:] == ["--config", config, "run"]
    assert Path(program[0]).name in ("momentry-edge", "python", Path(sys.executable).name)
    assert os.access(program[0], os.X_OK)
    assert plist["WorkingDirectory"] == str(spec.data_dir)
    environment = plist["EnvironmentVariables"]
    assert environment["MOMENTRY_CONFIG"] == config
    assert environment["PATH"].split(":")[0] == str(Path(program[0]).parent)
    assert {"/usr/bin", "/bin"} <= set(environment["PATH"].split(":"))
    assert "MOMENTRY_API_TOKEN" not in environment  # service files are world-readable
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert Path(plist[key]).parent == spec.data_dir / "logs"
    paths = [*program[:1], config, plist["WorkingDirectory"], plist["StandardOutPath"]]
    assert all(os.path.isabs(p) for p in paths)


def test_systemd_unit_has_exec_start_restart_and_wanted_by(spec: autostart.Spec) -> None:
    unit = autostart.render("linux", spec)
    keys = dict(row.split("=", 1) for row in unit.splitlines() if "=" in row and row[0] != "#")
    assert keys["Restart"] == "always" and keys["WantedBy"] == "default.target"
    # systemd doubles % (specifiers) and $ (variables); the rest splits like a shell line.
    argv = shlex.split(keys["ExecStart"].replace("%%", "%").replace("$$", "$"))
    assert argv == [*spec.program, "run"]
    assert " " in argv[-2] and os.path.isabs(argv[-2])  # the config path, with its space
    assert keys["WorkingDirectory"].replace("%%", "%") == str(spec.data_dir)
    assert f"Environment={shlex.quote('MOMENTRY_CONFIG=' + argv[-2])}".replace("'", '"') in unit


def test_service_render_prints_what_install_writes(tmp_path: Path) -> None:
    plist = cli(tmp_path, "service", "render", "--platform", "macos")
    assert plist.returncode == 0
    assert plistlib.loads(plist.stdout.encode())["ProgramArguments"][-1] == "run"
    unit = cli(tmp_path, "service", "render", "--platform", "linux")
    assert unit.returncode == 0 and "\nExecStart=" in unit.stdout
    config = tmp_path / "momentry.toml"
    config.write_text("[queue]\nmax_concurrent = 1\n")
    for args in (
        ["--config", str(config), "service", "render"],
        ["service", "render", "--config", str(config)],
    ):
        rendered = cli(tmp_path, *args, "--platform", "linux")
        assert f"ExecStart={autostart.executable()[0]} --config {config} run" in rendered.stdout


def test_service_status_answers_honestly_here(tmp_path: Path) -> None:
    # No launchd on Linux, and CI has no systemd user session; a desktop may have one.
    proc = cli(tmp_path, "service", "status")
    said = proc.stdout + proc.stderr
    if proc.returncode == autostart.NO_MANAGER:
        assert said.startswith("autostart is not available here: ")
        assert "systemd" in said or "launchd" in said
    else:
        assert proc.returncode == autostart.NOT_RUNNING, said  # manager works, nothing installed
        assert "not installed" in said and str(tmp_path) in said
    assert not (tmp_path / ".config").exists() and not (tmp_path / "Library").exists()


# -- install and uninstall, with stand-ins for launchctl and systemctl ----------------------------
# The real managers cannot run in CI; these stand-ins record their arguments and answer
# as the real ones do, so the files written and the commands run are checked for real.


def stand_in(bin_dir: Path, name: str, answers: dict[str, tuple[int, str]]) -> Path:
    """An executable ``name`` that logs its arguments; ``answers``: glob -> (exit, output)."""
    log = bin_dir / f"{name}.log"
    cases = "".join(
        f"  {pattern}) echo {shlex.quote(out)}; exit {code};;\n"
        for pattern, (code, out) in answers.items()
    )
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in\n{cases}esac\nexit 0\n')
    script.chmod(0o755)
    return log


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_systemd_install_status_uninstall(sandbox: Path, spec: autostart.Spec) -> None:
    log = stand_in(
        sandbox,
        "systemctl",
        {"*is-enabled*": (0, "enabled"), "*is-active*": (0, "active"), "*MainPID*": (0, "4242")},
    )
    report = autostart.install(spec, "linux")
    assert report.code == autostart.OK, report.text
    unit = sandbox.parent / ".config/systemd/user/momentry-edge.service"
    assert unit.read_text() == autostart.render("linux", spec)
    assert log.read_text().splitlines() == [
        "--user show-environment",
        "--user daemon-reload",
        "--user enable momentry-edge.service",
        "--user restart momentry-edge.service",
    ]
    assert autostart.status("linux") == autostart.Report(
        autostart.OK, f"active (enabled, pid 4242), {unit}; starts at login"
    )
    assert autostart.uninstall("linux").code == autostart.OK and not unit.exists()
    assert "--user disable --now momentry-edge.service" in log.read_text()


def test_systemd_without_a_user_manager_writes_nothing(sandbox: Path, spec: autostart.Spec) -> None:
    stand_in(sandbox, "systemctl", {"*show-environment*": (1, "Failed to connect to bus")})
    report = autostart.install(spec, "linux")
    assert report.code == autostart.NO_MANAGER
    assert "systemd user manager is not reachable" in report.text
    assert not (sandbox.parent / ".config").exists()


def test_launchd_install_falls_back_to_load_and_reports_status(
    sandbox: Path, spec: autostart.Spec
) -> None:
    log = stand_in(
        sandbox,
        "launchctl",
        {
            "bootstrap*": (5, "Bootstrap failed: 5: Input/output error"),
            "print*": (0, "state = running\n\tpid = 4242"),
        },
    )
    report = autostart.install(spec, "macos")
    assert report.code == autostart.OK and "launchctl load" in report.text, report.text
    plist = sandbox.parent / "Library/LaunchAgents/com.momentry.edge.plist"
    assert plistlib.loads(plist.read_bytes())["Label"] == "com.momentry.edge"
    assert spec.logs.is_dir()  # launchd would not create it
    calls = log.read_text().splitlines()
    uid = os.getuid()
    assert calls[1] == f"bootstrap gui/{uid} {plist}" and calls[2] == f"load -w {plist}"
    assert autostart.status("macos").text == f"running (pid 4242), {plist}; starts at login"
    assert autostart.uninstall("macos").code == autostart.OK and not plist.exists()
    assert f"bootout gui/{uid}/com.momentry.edge" in log.read_text()


def test_no_launchctl_is_reported(sandbox: Path) -> None:
    report = autostart.status("macos")
    assert report == autostart.Report(
        autostart.NO_MANAGER, "autostart is not available here: launchd is not here (no launchctl)"
    )


def unit_keys(unit: str) -> list[str]:
    return [row.split("=", 1)[0] for row in unit.splitlines() if "=" in row and row[0] != "#"]


def test_no_value_can_add_a_line_to_the_unit(tmp_path: Path) -> None:
    config = tmp_path / "conf\nExecStartPre=/bin/touch /tmp/pwn" / "momentry.toml"
    path = "/usr/bin:/weird\nExecStartPre=/bin/false:/bin"
    spec = autostart.spec(tmp_path / "data", str(config), env={"PATH": path})
    unit = autostart.render("linux", spec)
    clean = autostart.spec(tmp_path / "data", str(tmp_path / "x.toml"), env={"PATH": "/bin"})
    assert unit_keys(unit) == unit_keys(autostart.render("linux", clean))
    assert "ExecStartPre" not in unit_keys(unit)
    # systemd reads the escapes back: the config path arrives whole.
    escaped = str(config).replace("\n", "\\x0a")
    assert f'--config "{escaped}" run' in unit
    assert "/weird" not in unit  # a PATH entry no folder could be is left out
    unit_file = tmp_path / "momentry-edge.service"
    unit_file.write_text(unit)
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True
    )
    assert "ExecStartPre" not in checked.stderr and "Unknown key" not in checked.stderr, checked


@pytest.mark.parametrize("name", ["data\nExecStartPre=/bin/touch /tmp/pwn", "data\\", "data "])
def test_a_data_dir_no_unit_can_carry_is_refused_not_written(tmp_path: Path, name: str) -> None:
    spec = autostart.spec(tmp_path / name, None, env={"PATH": "/bin"})
    with pytest.raises(autostart.AutostartError, match="cannot be written into a systemd unit"):
        autostart.render("linux", spec)


def test_a_control_character_in_the_plist_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    spec = autostart.spec(tmp_path / "data\x01", None, env={"PATH": "/bin"})
    with pytest.raises(autostart.AutostartError, match="cannot write the plist"):
        autostart.render("macos", spec)


# -- start at boot, start/stop/restart, and a configuration error under launchd ------------------


def test_service_render_at_boot_is_a_launch_daemon_running_as_the_operator(
    tmp_path: Path,
) -> None:
    operator = os.environ.get("SUDO_USER") or autostart._user()
    # From a root shell without sudo the account is named (test_..._never_as_root).
    named = ("--user", "nobody") if operator == "root" else ()
    operator = "nobody" if named else operator
    proc = cli(tmp_path, "service", "render", "--platform", "macos", "--at-boot", *named)
    assert proc.returncode == 0, proc.stderr
    plist = plistlib.loads(proc.stdout.encode())
    assert plist["UserName"] == operator  # started by launchd at boot, run as the operator
    environment = plist["EnvironmentVariables"]
    assert environment["HOME"] == os.path.expanduser(f"~{operator}")
    assert environment["MOMENTRY_SUPERVISOR"] == "launchd"
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProgramArguments"][-1] == "run"
    # sudo's user decides, not root: the service runs as the one who installed it.
    as_nobody = cli(
        tmp_path,
        "service",
        "render",
        "--platform",
        "macos",
        "--at-boot",
        env={"SUDO_USER": "nobody"},
    )
    assert plistlib.loads(as_nobody.stdout.encode())["UserName"] == "nobody"


def test_service_render_at_boot_is_a_system_unit_with_user(tmp_path: Path) -> None:
    proc = cli(
        tmp_path,
        "service",
        "render",
        "--platform",
        "linux",
        "--at-boot",
        env={"SUDO_USER": "nobody"},
    )
    assert proc.returncode == 0, proc.stderr
    keys = dict(
        row.split("=", 1) for row in proc.stdout.splitlines() if "=" in row and row[0] != "#"
    )
    assert keys["User"] == "nobody" and keys["WantedBy"] == "multi-user.target"
    assert keys["RestartPreventExitStatus"] == "2" and keys["After"] == "network-online.target"
    login = cli(tmp_path, "service", "render", "--platform", "linux").stdout
    assert "User=" not in login and "WantedBy=default.target" in login
    unit_file = tmp_path / "momentry-edge.service"
    unit_file.write_text(proc.stdout)
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True
    )
    assert "Unknown key" not in checked.stderr and "Invalid" not in checked.stderr, checked


@pytest.mark.parametrize("platform", ["macos", "linux"])
def test_a_start_at_boot_never_runs_as_root(tmp_path: Path, platform: str) -> None:
    render = ("service", "render", "--platform", platform, "--at-boot")
    as_root = [cli(tmp_path, *render, "--user", "root")]
    if os.geteuid() == 0:  # a root shell, not sudo: root was the default
        as_root.append(cli(tmp_path, *render, env={"SUDO_USER": ""}))
    for proc in as_root:
        assert proc.returncode != 0 and proc.stdout == ""
        assert "not as root" in proc.stderr and "--user NAME" in proc.stderr, proc.stderr
    named = cli(tmp_path, *render, "--user", "nobody", env={"SUDO_USER": ""})
    assert named.returncode == 0, named.stderr
    if platform == "macos":
        assert plistlib.loads(named.stdout.encode())["UserName"] == "nobody"
    else:
        assert [row for row in named.stdout.splitlines() if row.startswith("User=")] == [
            "User=nobody"
        ]
    unknown = cli(tmp_path, *render, "--user", "no-such-account")
    assert unknown.returncode != 0 and "no user 'no-such-account'" in unknown.stderr


SECRET_URL = "postgresql://edge@db.example/queue?password=s3cret-pw"


@pytest.mark.parametrize("platform", ["macos", "linux"])
def test_settings_from_the_environment_stay_out_of_the_rendered_service(
    tmp_path: Path, platform: str
) -> None:
    env = {"DATABASE_URL": SECRET_URL, "MOMENTRY_SERVICE_HOST": "127.0.0.9"}
    proc = cli(tmp_path, "service", "render", "--platform", platform, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "s3cret-pw" not in proc.stdout and "127.0.0.9" not in proc.stdout
    env_file = str(tmp_path / "data" / "service-env.json")
    if platform == "macos":
        given = plistlib.loads(proc.stdout.encode())["EnvironmentVariables"]
    else:
        rows = [row for row in proc.stdout.splitlines() if row.startswith("Environment=")]
        given = dict(row.removeprefix("Environment=").split("=", 1) for row in rows)
    assert given["MOMENTRY_ENV_FILE"] == env_file
    assert "DATABASE_URL, MOMENTRY_SERVICE_HOST" in proc.stderr and env_file in proc.stderr
    assert "s3cret-pw" not in proc.stderr


def test_an_installed_service_gets_the_environment_s_settings_from_a_private_file(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "systemctl", {})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DATABASE_URL": SECRET_URL}
    proc = cli(tmp_path, "service", "install", env=env)
    assert proc.returncode == 0, proc.stderr
    unit = (tmp_path / ".config/systemd/user/momentry-edge.service").read_text()
    assert "s3cret-pw" not in unit
    env_file = tmp_path / "data" / "service-env.json"
    assert f"MOMENTRY_ENV_FILE={env_file}" in unit
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert json.loads(env_file.read_text()) == {"DATABASE_URL": SECRET_URL}
    # What the service's start reads: the file's settings (masked when shown).
    shown = cli(tmp_path, "config", "show", "--json", env={"MOMENTRY_ENV_FILE": str(env_file)})
    assert shown.returncode == 0, shown.stderr
    rows = {row["key"]: row for row in json.loads(shown.stdout)["settings"]}
    assert rows["service.database_url"]["value"] == (
        "postgresql://edge@db.example/queue?password=***"
    )
    assert rows["service.database_url"]["origin"] == "environment variable DATABASE_URL"


def test_systemd_at_boot_install_start_stop_uninstall(
    sandbox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autostart, "SYSTEM_ROOT", tmp_path / "root")
    log = stand_in(sandbox, "systemctl", {"*is-active*": (3, "failed")})
    spec = autostart.spec(tmp_path / "data", None, env={"PATH": "/bin"}, user=autostart._user())
    report = autostart.install(spec, "linux")
    assert report.code == autostart.OK and "at every boot" in report.text, report.text
    unit = tmp_path / "root/etc/systemd/system/momentry-edge.service"
    assert f"User={autostart._user()}" in unit.read_text()
    # The system manager: no --user, and no user session is needed.
    assert log.read_text().splitlines() == [
        "daemon-reload",
        "enable momentry-edge.service",
        "restart momentry-edge.service",
    ]
    status = autostart.status("linux")
    assert status.code == autostart.NOT_RUNNING
    assert "starts at boot" in status.text and "journalctl -u momentry-edge.service" in status.text
    for action in autostart.ACTIONS:
        assert autostart.control(action, "linux").code == autostart.OK
    assert log.read_text().splitlines()[-3:] == [
        f"{action} momentry-edge.service" for action in autostart.ACTIONS
    ]
    assert autostart.uninstall("linux", at_boot=True).code == autostart.OK
    assert not unit.exists() and "disable --now momentry-edge.service" in log.read_text()


def test_service_start_stop_restart_through_the_cli(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = stand_in(bin_dir, "systemctl", {})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    missing = cli(tmp_path, "service", "stop", env=env)
    assert missing.returncode == autostart.NOT_RUNNING and "not installed" in missing.stderr
    assert "momentry-edge service install" in missing.stderr
    unit = tmp_path / ".config/systemd/user/momentry-edge.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    for action in ("start", "stop", "restart"):
        proc = cli(tmp_path, "service", action, env=env)
        assert proc.returncode == 0, proc.stderr
        assert log.read_text().splitlines()[-1] == f"--user {action} momentry-edge.service"


def test_launchd_start_stop_and_why_it_is_not_running(sandbox: Path, tmp_path: Path) -> None:
    log = stand_in(
        sandbox, "launchctl", {"print*": (0, "state = not running\n\tlast exit code = 0")}
    )
    spec = autostart.spec(tmp_path / "data", None, env={"PATH": "/bin"})
    assert autostart.install(spec, "macos").code == autostart.OK
    target = f"gui/{os.getuid()}/com.momentry.edge"
    assert autostart.control("start", "macos").code == autostart.OK
    assert autostart.control("restart", "macos").code == autostart.OK
    assert autostart.control("stop", "macos").code == autostart.OK
    assert log.read_text().splitlines()[-3:] == [
        f"kickstart {target}",
        f"kickstart -k {target}",
        f"kill SIGTERM {target}",
    ]
    errors = spec.logs / "launchd.err.log"
    errors.write_text("momentry-edge: configuration error: queue.max_concurrent: ...\n")
    status = autostart.status("macos")
    assert status.code == autostart.NOT_RUNNING
    assert f"in {errors}: momentry-edge: configuration error" in status.text


def test_a_configuration_error_under_launchd_stays_stopped_and_says_why(tmp_path: Path) -> None:
    config = tmp_path / "momentry.toml"
    config.write_text("[queue]\nmax_concurrent = 0\n")
    plain = cli(tmp_path, "--config", str(config), "run")
    assert plain.returncode == 2 and "queue.max_concurrent" in plain.stderr  # systemd: stays
    # launchd restarts every failed exit: under it the same error is a clean exit, which
    # KeepAlive {SuccessfulExit: false} leaves stopped, with the reason in launchd.err.log.
    launchd = cli(tmp_path, "--config", str(config), "run", env={"MOMENTRY_SUPERVISOR": "launchd"})
    assert launchd.returncode == 0
    assert "configuration error: queue.max_concurrent" in launchd.stderr
    assert "not restarted until this is fixed" in launchd.stderr
