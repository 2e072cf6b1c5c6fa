"""momentry.toml + environment variables -> one frozen Config."""

# Each setting is declared once, in the dataclasses below; the file, the
# environment (``MOMENTRY_<SECTION>_<KEY>`` for every key, plus the short names
# API.md documents) and the defaults all go through the same coercion, so a bad
# value is reported the same way wherever it came from.

from __future__ import annotations

import dataclasses
import difflib
import errno
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qs, urlsplit

from .outbound import url_problem

DEFAULT_DATA_DIR = "~/.momentry-edge"
NODE_ID_MAX = 120  # store.Node.node_id
CONFIG_NAME = "momentry.toml"
# Names a file of settings' variables saved for an installed service (_with_env_file).
ENV_FILE_VAR = "MOMENTRY_ENV_FILE"


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key."""


LOG_LEVELS = ("debug", "info", "warning", "error")
# The longest wait a duration setting may ask for; more is a typo, and unbounded values
# overflow timers and date arithmetic.
MAX_SECONDS = 366 * 24 * 3600


def _setting(
    default: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    env: str | None = None,
    choices: tuple[str, ...] | None = None,
    required: bool = False,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """One setting: its default and what a value must be (numbers: finite and in range;
    ``required`` lists: not empty; ``check``: returns what is wrong with a value, or None).
    The file and the environment get the same checks."""
    meta = {
        "minimum": minimum,
        "maximum": maximum,
        "env": env,
        "choices": choices,
        "required": required,
        "check": check,
    }
    if isinstance(default, list | tuple):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


def _header_safe(token: str) -> str | None:
    """The token travels in an Authorization header, which carries visible ASCII only."""
    if all("!" <= char <= "~" for char in token):
        return None
    # The token itself is not repeated: the message goes to logs and terminals.
    return "must be visible ASCII characters (no spaces, accents or control characters)"


def _redis_db_number(url: str) -> str | None:
    """redis-py takes a database path that is not a number for db 0: a typo (/l3) would
    mix this queue's keys into another application's database."""
    parts, problem = _split_url(url)
    if parts is None:
        return problem
    if parts.scheme not in ("redis", "rediss"):
        return None  # a unix:// path names the socket; redis-py checks the scheme
    db = parts.path.strip("/")
    if db and not re.fullmatch(r"[0-9]+", db):
        # Only the path: the rest of the URL may hold a password.
        return f"the database (the URL's path) must be a number, got {parts.path!r}"
    if "db" in parse_qs(parts.query):  # redis-py would take it over the path's
        return "give the database as the URL's path (/5), not as a db query parameter"
    return None


def _database_url(url: str) -> str | None:
    """The shape of service.database_url; libpq reads the rest of a PostgreSQL one at
    start-up (store.postgres), as psql would."""
    if not url:
        return None  # SQLite in the data dir
    # Not the port: libpq takes several hosts (h1:5432,h2:5433), which urlsplit cannot.
    parts, problem = _split_url(url, port=False)
    if parts is None:
        return problem
    if parts.scheme in ("postgres", "postgresql"):
        return None
    if parts.scheme != "sqlite":
        return f"unsupported scheme {parts.scheme!r}: use postgresql://… or sqlite:///path"
    if parts.netloc or not parts.path.strip("/") or parts.path.endswith("/"):
        return "a sqlite URL names a file by its absolute path: sqlite:///path/to/momentry.db"
    if _has_control(parts.path):
        return "the path must not contain control characters"
    return None


def _split_url(url: str, port: bool = True) -> tuple[SplitResult | None, str]:
    """``url`` split, or None and what is wrong with it (never the URL: it may hold a
    password)."""
    try:
        parts = urlsplit(url)
        if port:
            parts.port  # noqa: B018 - a bad port (not a number, > 65535) raises only when read
    except ValueError as exc:  # e.g. "Invalid IPv6 URL", "Port out of range 0-65535"
        return None, f"not a valid URL: {exc}"
    return parts, ""


def _has_control(text: str) -> bool:
    """C0 controls and DEL: no unit file, plist or log line carries them safely."""
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)


def _node_id(name: str) -> str | None:
    """A node's name goes into the queue's node table (120 characters at most), log lines,
    Redis keys and the API's answers."""
    if len(name) > NODE_ID_MAX:
        return f"at most {NODE_ID_MAX} characters, got {len(name)}"
    if _has_control(name) or (name and not name.strip()):
        return "a name of visible characters, without control characters"
    return None


def _upload_address(text: str) -> str | None:
    if len(text) > 500 or _has_control(text):
        return "at most 500 characters, without control characters"
    return None


@dataclass(frozen=True)
class ServiceConfig:
    data_dir: Path = _setting(Path(DEFAULT_DATA_DIR), env="MOMENTRY_DATA_DIR")
    # Empty: a processing-only node, which takes jobs from a shared queue and watches nothing.
    watch: tuple[Path, ...] = _setting([Path("~/momentry-drop")])
    host: str = _setting("127.0.0.1")
    port: int = _setting(8765, minimum=0, maximum=65535)  # 0: any free port
    # Empty: the one made at first start into <data_dir>/api-token (apitoken.py).
    token: str = _setting("", env="MOMENTRY_API_TOKEN", check=_header_safe)
    # false: no token asked for at all (loopback only; any local account may use the API).
    auth: bool = _setting(True)
    database_url: str = _setting("", env="DATABASE_URL", check=_database_url)
    # Set: job state is mirrored into the Momentry system's momentry:* Redis keys (sidecars/).
    redis_url: str = _setting("", env="REDIS_URL", check=_redis_db_number)
    # How long a write waits for another's lock on the SQLite file before it fails.
    database_timeout: float = _setting(15.0, minimum=0.1, maximum=3600)
    # Extra processors, "module:Class"; the built-in ones need no entry.
    plugins: tuple[str, ...] = _setting([], env="MOMENTRY_PLUGINS")
    log_level: str = _setting("info", env="MOMENTRY_LOG_LEVEL", choices=LOG_LEVELS)
    # Finished jobs, their results and old logs are removed after this many days; 0 keeps all.
    retention_days: float = _setting(30.0, minimum=0, maximum=36500)
    # Names this process in a shared queue; empty = the host name.
    node_id: str = _setting("", env="MOMENTRY_NODE_ID", check=_node_id)
    # Seconds between automatic backups into <data_dir>/backups; 0 = none.
    backup_interval: float = _setting(0.0, minimum=0, maximum=MAX_SECONDS)
    # Automatic backups kept; older ones are removed (backups taken by hand stay).
    backup_keep: int = _setting(7, minimum=1, maximum=10000)
    # A group that may read results (0640/0750 with that group); empty: the service's
    # account alone reads anything in the data dir.
    share_group: str = _setting("", env="MOMENTRY_SHARE_GROUP")
    # Seconds between keep-alive comments on an idle event stream (GET /api/v1/events):
    # under a proxy's idle timeout.
    event_keepalive: float = _setting(5.0, minimum=0.1, maximum=300)
    # Where uploaders reach the drop folders (e.g. sftp://studio-mini.local:2022/), said by
    # the console while it has no file; empty: the folders' paths alone.
    upload_address: str = _setting("", check=_upload_address)


@dataclass(frozen=True)
class QueueConfig:
    # At most worker_threads (checked in load()).
    max_concurrent: int = _setting(2, minimum=1, maximum=256, env="MOMENTRY_MAX_CONCURRENT")
    dynamic_concurrency: bool = _setting(True)
    # Percent busy above which dynamic concurrency starts fewer jobs.
    cpu_threshold: float = _setting(80.0, minimum=1, maximum=100)
    memory_threshold: float = _setting(80.0, minimum=1, maximum=100)
    gpu_threshold: float = _setting(90.0, minimum=1, maximum=100)
    # The delay doubles with each retry: more than 100 would wait for ages (and overflow).
    max_retries: int = _setting(3, minimum=0, maximum=100)
    retry_delay: float = _setting(10.0, minimum=0, maximum=MAX_SECONDS)
    task_timeout: float = _setting(3600.0, minimum=1, maximum=MAX_SECONDS)
    poll_interval: float = _setting(
        5.0, minimum=0.05, maximum=MAX_SECONDS, env="MOMENTRY_POLL_INTERVAL"
    )
    worker_enabled: bool = _setting(True, env="MOMENTRY_WORKER_ENABLED")
    # The most worker threads (started as jobs need them); max_concurrent can be raised live
    # up to this.
    worker_threads: int = _setting(8, minimum=1, maximum=256)
    # Threads one job may use to run its independent parts side by side (the speech
    # branch, the frame pass, other processors): on a small machine one job alone can
    # then keep every core busy. 0: the machine's core count; 1: one part after another.
    job_threads: int = _setting(0, minimum=0, maximum=256)
    # A running job's lease; a worker that stops renewing it (crash, kill -9) loses the job
    # to the reaper after this long.
    lease_seconds: float = _setting(60.0, minimum=1, maximum=MAX_SECONDS)
    # A running job with no progress reported for this long is shown stalled (Tdarr gives a
    # job 5 minutes): a hung model call, a processor that never reports.
    stall_seconds: float = _setting(300.0, minimum=1, maximum=MAX_SECONDS)
    # A job whose run took the process down this many times is parked as failed.
    max_crashes: int = _setting(3, minimum=1, maximum=100)
    # No job starts while the data dir's disk has less free space than this.
    min_free_disk_mb: float = _setting(1024.0, minimum=0, maximum=1e9)
    # Nor while it has fewer free inodes (files it may still create) than this: a long
    # video's cut run alone writes a thumbnail per scene.
    min_free_inodes: int = _setting(20000, minimum=0, maximum=10**12)


@dataclass(frozen=True)
class IngestConfig:
    settle_seconds: float = _setting(5.0, minimum=0, maximum=MAX_SECONDS)
    extensions: tuple[str, ...] = _setting(
        [
            *(".mp4", ".mov", ".m4v", ".mkv", ".avi", ".webm", ".mts", ".mxf"),
            # Audio files: the audio processors run, the frame processors do not apply.
            *(".m4a", ".mp3", ".wav", ".aac", ".flac", ".ogg", ".opus"),
        ],
        required=True,
    )
    # Empty: dropped files are registered, nothing is queued.
    processors: tuple[str, ...] = _setting(["asr", "cut", "yolo", "ocr", "face", "pose"])
    rescan_interval: float = _setting(300.0, minimum=1, maximum=MAX_SECONDS)


@dataclass(frozen=True)
class ModelsConfig:
    # Pull missing models the configured processors need at start, in the background.
    auto_pull: bool = _setting(True)
    # Seconds without a job after which the loaded models are let go and their memory given
    # back (the next job loads them again, a few seconds); 0 keeps them for good.
    idle_release_seconds: float = _setting(600.0, minimum=0, maximum=MAX_SECONDS)
    # Once they are let go the service starts afresh in its own process (same pid and
    # port), which gives back the memory the model libraries keep (afresh.py).
    idle_restart: bool = _setting(True)


@dataclass(frozen=True)
class AlertsConfig:
    # POSTed a short plain-text message (ntfy-compatible) when something needs an operator.
    # Checked as a callback_url is: a URL no POST can use would fail every alert, unseen.
    url: str = _setting("", check=lambda url: url_problem(url) if url else None)


SECTIONS: dict[str, type] = {
    "service": ServiceConfig,
    "queue": QueueConfig,
    "ingest": IngestConfig,
    "models": ModelsConfig,
    "alerts": AlertsConfig,
}


@dataclass(frozen=True)
class Config:
    service: ServiceConfig = field(default_factory=ServiceConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    # [processors.<name>] tables, passed to each processor as its settings.
    processors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: Path | None = None  # the file it was read from, if any
    # "service.port" -> where its value came from ("config file", "environment variable X").
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.service.data_dir

    @property
    def url(self) -> str:
        host = self.service.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.service.port}"

    def processor_settings(self, name: str) -> Mapping[str, Any]:
        return self.processors.get(name, {})

    def origin(self, key: str) -> str:
        """Where the value of ``key`` (e.g. "service.port") came from, as errors say it."""
        return self.origins.get(key, "default")

    def error(self, key: str, problem: str) -> ConfigError:
        """A setting found unusable after loading (e.g. at start-up), named as load() names
        one: ``<key>: <problem> (<where the value came from>)``."""
        return ConfigError(f"{key}: {problem} ({self.origin(key)})")


def load(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read the config file (if any) and apply environment overrides."""
    env = _with_env_file(os.environ if env is None else env)
    file_path = _config_path(path, env)
    raw: dict[str, Any] = {}
    if file_path is not None:
        try:
            raw = tomllib.loads(file_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file_path}: not valid TOML: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{file_path}: cannot read: {exc.strerror}") from exc

    unknown = set(raw) - set(SECTIONS) - {"processors"}
    if unknown:
        raise ConfigError(f"unknown section [{sorted(unknown)[0]}] in {file_path}")
    _refuse_unknown_variables(env)
    origins: dict[str, str] = {}
    # Relative paths in the file are the file's neighbours, wherever it is run from.
    file_dir = file_path.parent.absolute() if file_path is not None else Path.cwd()
    sections = {
        name: _build_section(name, cls, raw.get(name, {}), env, origins, file_dir)
        for name, cls in SECTIONS.items()
    }
    processors = raw.get("processors", {})
    if not isinstance(processors, dict) or not all(
        isinstance(v, dict) for v in processors.values()
    ):
        raise ConfigError("processors: expected [processors.<name>] tables")
    queue = sections["queue"]
    if queue.max_concurrent > queue.worker_threads:
        raise ConfigError(
            f"queue.max_concurrent: must be at most queue.worker_threads "
            f"({queue.worker_threads}), got {queue.max_concurrent}"
        )
    return Config(**sections, processors=processors, source=file_path, origins=origins)


def _config_path(path: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    origin = "--config"
    if path is None:
        path, origin = env.get("MOMENTRY_CONFIG"), "environment variable MOMENTRY_CONFIG"
    if path:
        if _has_control(str(path)):
            # It is written into the unit file `service install` makes, which cannot carry them.
            raise ConfigError(
                f"config file: the path must not contain control characters ({origin})"
            )
        explicit = _expand(str(path), f"config file {path}")
        try:
            mode = explicit.stat().st_mode
        except OSError as exc:
            raise ConfigError(f"config file {explicit}: {_why(exc)}") from None
        if not stat.S_ISREG(mode):
            raise ConfigError(f"config file {explicit} is not a file")
        return explicit
    var = next((v for v in ("MOMENTRY_SERVICE_DATA_DIR", "MOMENTRY_DATA_DIR") if env.get(v)), "")
    origin = f"environment variable {var}" if var else "default"
    data_dir = env.get(var) or DEFAULT_DATA_DIR
    candidate = _expand(data_dir, "service.data_dir", origin) / CONFIG_NAME
    try:
        return candidate if stat.S_ISREG(candidate.stat().st_mode) else None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None  # no settings file: the defaults
        if exc.errno == errno.ELOOP:
            problem = f"{candidate.parent} {_why(exc)}"
            raise ConfigError(f"service.data_dir: {problem} ({origin})") from None
        raise ConfigError(f"config file {candidate}: {_why(exc)}") from None


def _why(exc: OSError) -> str:
    """What an OSError on a path the user gave means, in their words."""
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (a link that leads back to itself)"
    return f"cannot be read: {exc.strerror}"


def _expand(path: str, key: str, origin: str = "") -> Path:
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~name of a user this machine does not have
        where = f" ({origin})" if origin else ""
        user = path.split("/")[0]
        raise ConfigError(f"{key}: cannot expand {user!r}: no such user{where}") from None


def setting_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables in ``env`` that give a setting (DATABASE_URL, MOMENTRY_SERVICE_HOST,
    ...), as `run` would read them: what a service installed from this shell must see."""
    names: set[str] = set()
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            names.update(
                filter(None, (f.metadata.get("env"), f"MOMENTRY_{section}_{f.name}".upper()))
            )
    return {var: env[var] for var in sorted(names) if var in env}


def _with_env_file(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with the variables in the file MOMENTRY_ENV_FILE names (a JSON object, written
    0600 by `service install`: settings that were given through the installing shell's
    environment, some secret); the variables set in ``env`` itself win."""
    path = env.get(ENV_FILE_VAR)
    if not path:
        return env
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path} ({ENV_FILE_VAR}): {_why(exc)}") from None
    except ValueError as exc:
        raise ConfigError(f"{path} ({ENV_FILE_VAR}): not valid JSON: {exc}") from None
    if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
        raise ConfigError(f"{path} ({ENV_FILE_VAR}): expected an object of strings")
    return saved | dict(env)


def _refuse_unknown_variables(env: Mapping[str, str]) -> None:
    """MOMENTRY_<SECTION>_<KEY> with a KEY the section does not have is a typo; other
    MOMENTRY_ names (MOMENTRY_CONFIG, the short names, other tools' own) are not ours."""
    short = {f.metadata["env"] for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
    for var in sorted(env):
        for section, cls in SECTIONS.items():
            prefix = f"MOMENTRY_{section.upper()}_"
            if not var.startswith(prefix) or var in short:
                continue
            names = {f"{prefix}{f.name.upper()}": f.name for f in dataclasses.fields(cls)}
            if var in names:
                continue
            typed = var[len(prefix) :].lower()
            close = difflib.get_close_matches(typed, names.values(), n=1)
            hint = f"; did you mean {prefix}{close[0].upper()}?" if close else ""
            key = f"{section}.{typed}"
            raise ConfigError(f"{var}: unknown key {key} (environment variable){hint}")


def _build_section(
    section: str,
    cls: type,
    values: Any,
    env: Mapping[str, str],
    origins: dict[str, str],
    file_dir: Path,
) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {section}.{close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {section}.{key}{hint}")
    kwargs = {}
    for name, f in known.items():
        value, origin, base = values.get(name, dataclasses.MISSING), "config file", file_dir
        for var in (f.metadata.get("env"), f"MOMENTRY_{section}_{name}".upper()):
            if var and var in env:
                # Typed in a shell: relative to where it was typed.
                value, origin, base = env[var], f"environment variable {var}", Path.cwd()
        if value is not dataclasses.MISSING:
            kwargs[name] = _coerce(f"{section}.{name}", f, value, origin, base)
            origins[f"{section}.{name}"] = origin
        elif f.type == "Path" or f.type == "tuple[Path, ...]":
            kwargs[name] = _coerce(f"{section}.{name}", f, _default(f), "default", Path.cwd())
    return cls(**kwargs)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]


def _coerce(key: str, f: dataclasses.Field, value: Any, origin: str, base: Path) -> Any:
    """``value`` as the setting's type, checked; a relative path is made absolute against
    ``base``, once, so that every later use (the service, backup, the unit file) agrees."""
    kind = str(f.type)  # the annotation's text: this module's annotations are strings
    result: Any
    try:
        if kind == "bool":
            result = _to_bool(value)
        elif kind == "int":
            if isinstance(value, bool | float):
                raise ValueError
            result = int(value)
        elif kind == "float":
            if isinstance(value, bool):
                raise ValueError
            result = float(value)
            if not math.isfinite(result):  # nan passes every range check; inf never ends
                raise ValueError
        elif kind == "str":
            if not isinstance(value, str):
                raise ValueError
            result = value
        elif kind == "Path":
            if not isinstance(value, str | Path) or not str(value).strip():
                raise ValueError
            result = _absolute(key, str(value), base, origin)
        elif kind.startswith("tuple"):
            items = _to_list(value)
            if any(not item.strip() for item in items):
                raise ValueError  # an empty path would mean the working directory
            if "Path" in kind:
                result = tuple(_absolute(key, i, base, origin) for i in items)
            else:
                result = tuple(items)
        else:  # pragma: no cover - a new setting type needs a branch here
            raise TypeError(kind)
    except ConfigError:
        raise  # a path no service can use: it says why
    except (ValueError, TypeError):
        raise ConfigError(f"{key}: expected {_describe(kind)}, got {value!r} ({origin})") from None
    meta = f.metadata
    if meta["choices"] and result not in meta["choices"]:
        choices = ", ".join(meta["choices"])
        raise ConfigError(f"{key}: must be one of {choices}, got {value!r} ({origin})")
    if meta["minimum"] is not None and result < meta["minimum"]:
        raise ConfigError(
            f"{key}: must be at least {_number(meta['minimum'])}, got {value!r} ({origin})"
        )
    if meta["maximum"] is not None and result > meta["maximum"]:
        raise ConfigError(
            f"{key}: must be at most {_number(meta['maximum'])}, got {value!r} ({origin})"
        )
    if meta["required"] and not result:
        raise ConfigError(f"{key}: must not be empty ({origin})")
    if meta["check"] and (problem := meta["check"](result)):
        raise ConfigError(f"{key}: {problem} ({origin})")
    return result


def _absolute(key: str, path: str, base: Path, origin: str) -> Path:
    """``path`` made absolute, or a ConfigError saying why no service can use it."""
    if _has_control(path):
        # A newline would end the line of the unit file `service install` writes.
        raise ConfigError(f"{key}: the path must not contain control characters ({origin})")
    result = Path(os.path.abspath(base / _expand(path, key, origin)))
    try:
        os.stat(result)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # missing is fine (made at start); a loop never resolves
            raise ConfigError(f"{key}: {result} {_why(exc)} ({origin})") from None
    return result


def _number(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() else str(limit)


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _to_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str | Path) for v in value):
        return [str(v) for v in value]
    raise ValueError(value)


def _describe(kind: str) -> str:
    return {
        "bool": "true or false",
        "int": "a whole number",
        "float": "a finite number",
        "str": "a string",
        "Path": "a path",
    }.get(kind, "a list of non-empty strings")
