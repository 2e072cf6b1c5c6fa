"""The commands: each parses what argparse left, calls the service's API (or this
machine, for the local ones) and renders the reply; main.py's parser names them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config as config_module
from ..terminal import printable, scrub
from .client import (
    ApiClient,
    ApiError,
    owner,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

# Exit codes: scripts (and the SFTPGo hook) branch on these.
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

Handler = Callable[[ApiClient, argparse.Namespace], int]


class UsageError(Exception):
    """Arguments argparse accepted but that do not make a request."""


# -- client commands: parse (argparse did), call the client once, render -------------------------


def cmd_status(api: ApiClient, args: argparse.Namespace) -> int:
    whose = owner(api)
    if not whose.mine:  # said first: the queue below (or a refusal) is not this account's
        print_error(f"note: the service at {api.base_url} is {whose.said(api.base_url)}")
    status = api.queue_status(args.limit, args.offset)
    if not args.json and not args.url:  # which service answered, when it was looked for
        said = f"service {api.base_url}, found through {args.found.how}"
        print(
            printable(
                f"{said}; {whose.said(api.base_url)}" if whose.mine and whose.account else said
            )
        )
    return _show(args, status, render_status)


def cmd_submit(api: ApiClient, args: argparse.Namespace) -> int:
    code = EXIT_OK
    for raw in args.paths:
        # The service resolves relative paths against its watched folders, not our cwd.
        path = str(Path(raw).expanduser().resolve())
        try:
            # One request: registered and, with --force, its scan forced at once (a job
            # queued by a first request could start before a second one forced it).
            reply = api.register(path, args.processors, args.priority, force=args.force)
        except ApiError as exc:
            print_error(f"error: {raw}: {exc.message}")
            code = EXIT_REFUSED
            continue
        if args.json:
            print(json.dumps(reply))  # one JSON object per line, one line per PATH
        elif reply.get("task_id"):
            print(printable(f"{raw}: {_submitted(api, reply)}"))
        if not reply.get("task_id"):
            reason = reply.get("reason") or "not queued"
            print_error(f"error: {raw}: {reply.get('state', 'not queued')}: {reason}")
            code = EXIT_REFUSED
    return code


def cmd_results(api: ApiClient, args: argparse.Namespace) -> int:
    from . import results

    return results.command(api, args)


def cmd_forget(api: ApiClient, args: argparse.Namespace) -> int:
    from . import results

    try:
        record = results.find_file(api, args.file)
    except results.NotFound as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return EXIT_REFUSED
    if not args.yes and sys.stdin.isatty():  # a person at a terminal: say what goes first
        answer = input(
            printable(
                f"forget {record['path']} ({record['file_uuid']}): cancel its jobs, remove its "
                f"results and every record of it{' and the file itself' * args.delete_source}?"
                " [y/N] "
            )
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing forgotten")
            return EXIT_REFUSED
    return _show(args, api.forget(record["file_uuid"], args.delete_source), _forgotten)


def _forgotten(r: dict[str, Any]) -> None:
    print(
        f"forgot {r['file_uuid']}: {len(r['jobs'])} job(s), "
        f"{len(r['results_removed'])} results folder(s) removed"
        + (", the file deleted from the watched folder" if r["source_removed"] else "")
    )
    if r["backups"]:
        print("these backups still hold it (remove them if they must not):")
        for path in r["backups"]:
            print(printable(f"  {path}"))
    else:
        print("no backup in the data dir holds it (backups written elsewhere are not checked)")


def cmd_open(api: ApiClient, args: argparse.Namespace) -> int:
    """Print the console's link, signed in, and open it in a browser (not with --print)."""
    api.queue_status(1)  # the token is taken: else the API's refusal, and why
    token = args.found_token.value
    # In the fragment: a browser never sends it, so no server or proxy log keeps it.
    link = f"{api.base_url}/#token={token}" if token else f"{api.base_url}/"
    print(link, flush=True)
    if not args.print:
        import webbrowser

        if not webbrowser.open(link):
            print_error("no browser to open here: open the link above in one")
    return EXIT_OK


def cmd_search(api: ApiClient, args: argparse.Namespace) -> int:
    from . import search

    return search.command(api, args)


def cmd_pause(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.pause(), _paused)


def cmd_resume(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.resume(), _paused)


def cmd_clear(api: ApiClient, args: argparse.Namespace) -> int:
    if not args.yes:
        status = api.queue_status(limit=1) if sys.stdin.isatty() else None
        waiting = status["pending_count"] + (status.get("retrying_count") or 0) if status else 0
        if not _confirmed(f"cancel {waiting} waiting job(s)? (running jobs go on)"):
            return EXIT_REFUSED
    return _show(args, api.clear(), lambda r: print(f"cancelled {r['cleared']} waiting job(s)"))


def _confirmed(question: str) -> bool:
    """Whether a person at the terminal said yes; with nobody to ask (a pipe, a script:
    `echo n | clear` must not cancel the line) a UsageError naming --yes."""
    if not sys.stdin.isatty():
        raise UsageError("there is no terminal to ask at before cancelling: pass --yes")
    if input(f"{question} [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("nothing cancelled")
    return False


def cmd_rescan(api: ApiClient, args: argparse.Namespace) -> int:
    def render(r: dict[str, Any]) -> None:
        keys = ("new", "changed", "missing", "unchanged", "settling", "ignored")
        print(", ".join(f"{key} {r.get(key, 0)}" for key in keys))

    return _show(args, api.rescan(), render)


def cmd_jobs(api: ApiClient, args: argparse.Namespace) -> int:
    return _show(args, api.jobs(args.status, args.limit, folder=args.folder), render_jobs)


def cmd_retry(api: ApiClient, args: argparse.Namespace) -> int:
    if args.all_failed == (args.job is not None):
        raise UsageError("give JOB or --all-failed")
    if args.folder is not None and not args.all_failed:
        raise UsageError("--folder goes with --all-failed")
    if not args.all_failed:
        return _show(args, api.retry(args.job), _requeued)

    def render(reply: dict[str, Any]) -> None:
        print(f"re-queued {reply['retried']} failed job(s)")
        for refused in reply["refused"]:
            print(printable(f"  {refused['task_id']}: not re-queued: {refused['reason']}"))

    return _show(args, api.retry_failed(args.folder), render)


def cmd_cancel(api: ApiClient, args: argparse.Namespace) -> int:
    if (args.folder is None) == (args.job is None):
        raise UsageError("give JOB or --folder F")
    if args.folder is not None:
        if not args.yes and not _confirmed(f"cancel the waiting jobs in folder {args.folder!r}?"):
            return EXIT_REFUSED
        reply = api.clear(args.folder)
        where = printable(repr(args.folder))
        return _show(
            args, reply, lambda r: print(f"cancelled {r['cleared']} waiting job(s) in {where}")
        )

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


def cmd_drain(api: ApiClient, args: argparse.Namespace) -> int:
    def render(reply: dict[str, Any]) -> None:
        if reply["drained"]:
            print(
                f"node {reply['node']} drained: its {reply['running']} running job(s) finish,"
                " no new job starts there; `momentry-edge drain --undo` takes jobs again"
            )
        else:
            print(f"node {reply['node']} takes jobs again")

    return _show(args, api.drain(args.undo), render)


def cmd_concurrency(api: ApiClient, args: argparse.Namespace) -> int:
    if args.max_concurrent is None and args.dynamic is None:
        raise UsageError("give N, --dynamic or --no-dynamic")
    return _show(args, api.set_concurrency(args.max_concurrent, args.dynamic), render_concurrency)


def cmd_tui(api: ApiClient, args: argparse.Namespace) -> int:
    from . import tui  # imported here: only the live view needs rich.live and termios

    api.speak_as("tui")
    return tui.run(api)


def cmd_service(cfg: config_module.Config, args: argparse.Namespace) -> int:
    from . import autostart

    at_boot = getattr(args, "at_boot", False)
    given = getattr(args, "user", None)
    try:
        if given and not at_boot:
            raise autostart.AutostartError("--user is for a start at boot (--at-boot)")
        spec = autostart.spec(
            cfg.data_dir, args.config, user=autostart.boot_user(given or "") if at_boot else ""
        )
        if args.action == "render":
            print(autostart.render(args.platform or autostart.current_platform(), spec), end="")
            if spec.carried:
                print_error(
                    f"note: {', '.join(spec.carried)} (set in this shell) would be saved in "
                    f"{spec.env_file}, readable by the service's user alone, not in this file"
                )
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
        print_error(f"error: {exc}")
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
    from .. import privacy
    from ..upkeep import backup

    privacy.apply(cfg)  # the copies are as private as what they copy
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
    from .. import privacy
    from ..upkeep import backup, restore

    privacy.apply(cfg)  # the restored database and results as the service makes them
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
    from rich.console import Console  # here: `run` imports this module but prints no table

    return Console(highlight=False, width=None if sys.stdout.isatty() else 500)


def _show(args: argparse.Namespace, reply: dict[str, Any], render: Callable[[Any], None]) -> int:
    if args.json:
        print(json.dumps(reply, indent=2))  # ASCII only: control characters come out escaped
    else:
        render(scrub(reply))  # names and reasons from the service reach a terminal
    return EXIT_OK


def print_error(message: str) -> None:
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
    from rich.text import Text

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
    if status.get("drained"):
        header += " · this node drained: it starts no job (`drain --undo`)"
    console.print(Text(header))
    if status.get("blocked_reason"):  # else a full disk looks like a queue that just waits
        console.print(Text(printable(f"nothing starts: {status['blocked_reason']}")))
    for warning in status.get("warnings") or []:  # e.g. a watched folder that is not there
        console.print(Text(printable(f"warning: {warning}")))
    # Several nodes share the queue: say which runs what, and how busy each is.
    nodes = status.get("nodes") or []
    shared = len(nodes) > 1
    if shared:
        online = [n for n in nodes if n.get("online", True)]
        console.print(
            Text(
                "nodes: "
                + ", ".join(
                    f"{n['id']} {n['active']}/{n['max_concurrent']}" + _takes(n) for n in online
                )
            )
        )
    for node in nodes:  # a dead node says so, with its last heartbeat
        if not node.get("online", True):
            said = f"node {node['id']} on {node.get('host', '?')}: OFFLINE, "
            console.print(Text(printable(said + f"last heartbeat {_ago(node.get('last_seen'))}")))
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
    for entry in status["queue"]:  # where each running job runs, and whether it moves
        if entry["status"] == "processing":
            line = (
                f"{entry['file_name']} on {entry.get('node') or '?'}: started"
                f" {_ago(entry.get('started_at'))}, last progress {_ago(entry.get('progress_at'))}"
            )
            console.print(Text(printable(line + (" · STALLED" if entry.get("stalled") else ""))))
    stranded: dict[str, int] = {}  # a waiting job no node can run: each reason once
    for entry in status["queue"]:
        if entry.get("stranded"):
            stranded[entry["stranded"]] = stranded.get(entry["stranded"], 0) + 1
    for why, count in stranded.items():
        console.print(Text(printable(f"{count} waiting job(s) shown: {why}")))
    waiting = status["pending_count"] + (status.get("retrying_count") or 0)
    shown = sum(entry["status"] != "processing" for entry in status["queue"])
    if waiting > shown:
        console.print(f"{shown} of {waiting} waiting jobs shown; --limit and --offset page on")
    stats = status.get("statistics") or {}
    if stats.get("total_processed"):
        average = stats.get("average_time")
        line = f"{stats['total_processed']} processed, {stats.get('total_failed', 0)} failed"
        console.print(line + (f", {average:.1f} s per job" if average is not None else ""))


def _takes(node: dict[str, Any]) -> str:
    """A node that takes no jobs, said beside its counts."""
    worker = node.get("worker")
    return " (runs no jobs)" if worker == "off" else " (drained)" if worker == "drained" else ""


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
    from rich.table import Table

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
    from rich.text import Text

    return [Text(str(v)) for v in values]


def _ago(stamp: str | None) -> str:
    """``2026-12-06 12:40:01 UTC (1m 05s ago)``; "not known" without a time."""
    if not stamp:
        return "not known"
    try:
        at = datetime.fromisoformat(stamp)
    except ValueError:
        return printable(stamp)
    seconds = max(0, round(time.time() - at.timestamp()))
    if seconds >= 3600:
        ago = f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    else:
        ago = f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC ({ago} ago)"


def _percent(progress: int | None) -> str:
    return "" if progress is None else f"{progress}%"
