"""The drop folder under faults and hostile input: unreadable files put right, slow uploads,
look-alike content, impossible paths and odd names. A real service process watching a real
folder, on SQLite and PostgreSQL; real videos, a real SFTP server and client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import ServiceProcess, wait_for
from test_ingest import INGEST, copy_in, files, jobs_of, rescan

from momentry_edge.ingest.watcher import CLOSED, MOVED, QUIET, SettleTracker


def noise_video(path: Path, frames: int, size: tuple[int, int] = (160, 120)) -> Path:
    """A real H.264 mp4 of random frames: about 14 KB a frame at 160x120, index at the end
    (so a file cut short does not probe)."""
    rng = np.random.default_rng(frames)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for _ in range(frames):
            image = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(stream.encode())
    return path


def log_errors(svc: ServiceProcess) -> list[str]:
    return [line for line in svc.log().splitlines() if line.startswith(("ERROR", "CRITICAL"))]


# -- the tracker, without a service ------------------------------------------------------------


def test_with_close_events_a_closed_file_is_due_at_once_and_an_open_one_waits(
    tmp_path: Path,
) -> None:
    now = [100.0]
    tracker = SettleTracker(1.0, clock=lambda: now[0], reports_close=True)
    upload = tmp_path / "upload.mp4"
    upload.write_bytes(b"a" * 10)
    tracker.touch(str(upload), event="modified")
    now[0] = 130.0  # long past settle_seconds, but the writer still has it open
    assert tracker.due() == []
    tracker.touch(str(upload), event="closed")
    tracker.touch(str(upload), event="attrib")  # cp -p sets times after the close
    assert tracker.due() == [(str(upload), CLOSED)]

    # Appeared with no write seen (a hard link): settle_seconds of quiet, as before.
    linked = tmp_path / "linked.mp4"
    linked.write_bytes(b"b")
    tracker.touch(str(linked), event="created")
    assert tracker.due() == []
    now[0] = 131.0
    assert tracker.due() == [(str(linked), QUIET)]

    # Renamed into place: whole, like a closed file; a "created" after it (a folder moved
    # in says both) does not undo that, a write does.
    moved = tmp_path / "moved.mp4"
    moved.write_bytes(b"c")
    tracker.touch(str(moved), event="moved")
    tracker.touch(str(moved), event="created")
    tracker.touch(str(moved), event="attrib")
    assert tracker.due() == [(str(moved), MOVED)]
    tracker.touch(str(moved), event="moved")
    with moved.open("ab") as f:
        f.write(b"more")
    tracker.touch(str(moved), event="created")
    assert tracker.due() == []

    # Without close events (FSEvents: a rename may come merged with the writes before
    # it), neither a close nor a move makes a file due before settle_seconds of quiet.
    coalesced = SettleTracker(1.0, clock=lambda: now[0], reports_close=False)
    for event in ("closed", "moved"):
        coalesced.touch(str(moved), event=event)
        assert coalesced.due() == []
    now[0] = 132.0
    assert coalesced.due() == [(str(moved), QUIET)]


# -- defect: a file rejected as unreadable stays rejected after it is fixed --------------------


def unreadable(svc: ServiceProcess, name: str, source: Path) -> Path:
    """``source``'s content at ``name`` in the drop folder, mode 000, written an hour ago."""
    staging = copy_in(source, svc.root / "staging" / name)
    staging.chmod(0)
    old = time.time() - 3600
    os.utime(staging, (old, old))
    target = svc.drop / name
    # Linked in: no write, close or move is seen there, so the watcher waits settle_seconds.
    os.link(staging, target)
    staging.unlink()
    return target


def test_an_unreadable_file_is_taken_once_made_readable_by_rescan_and_register(
    start_service, unprivileged, tmp_path
) -> None:
    # A long settle time: the rescan and the hook are what look at the files here.
    svc = start_service(wrapper=unprivileged, ingest=INGEST | {"settle_seconds": 60})
    first, second = (noise_video(tmp_path / f"{n}.mp4", n) for n in (3, 4))
    unreadable(svc, "by rescan.mp4", first)
    unreadable(svc, "by register.mp4", second)
    assert rescan(svc)["new"] == 2
    known = files(svc)
    for name in ("by rescan.mp4", "by register.mp4"):
        assert known[name]["state"] == "rejected", known[name]
        assert "permission denied" in known[name]["reason"].lower(), known[name]
    # Still unreadable: looked at again, nothing new to tell.
    assert rescan(svc)["changed"] == 0 and files(svc)["by rescan.mp4"]["state"] == "rejected"

    (svc.drop / "by rescan.mp4").chmod(0o644)  # put right; size and mtime stay as they were
    counts = rescan(svc)
    assert counts["changed"] == 1 and counts["unchanged"] == 1, counts
    fixed = files(svc)["by rescan.mp4"]
    assert fixed["state"] == "present" and fixed["reason"] is None
    (job,) = jobs_of(svc, fixed["file_uuid"])
    svc.wait_status(job["task_id"], "completed")

    body = {"path": "by register.mp4"}
    again = svc.call("POST", "/api/v1/files/register", expect=200, json=body)
    assert again["state"] == "rejected" and again["task_id"] is None
    (svc.drop / "by register.mp4").chmod(0o644)
    taken = svc.call("POST", "/api/v1/files/register", expect=201, json=body)
    assert taken["file_uuid"] == again["file_uuid"]
    assert taken["state"] == "present" and taken["task_id"]
    svc.wait_status(taken["task_id"], "completed")
    assert svc.get("/healthz")["status"] == "ok"


def test_an_unreadable_file_is_taken_by_the_watcher_when_its_permissions_change(
    start_service, unprivileged, tmp_path
) -> None:
    svc = start_service(wrapper=unprivileged, ingest=INGEST)
    locked = unreadable(svc, "locked.mp4", noise_video(tmp_path / "v.mp4", 6))
    record = wait_for(lambda: files(svc).get("locked.mp4"))
    assert record["state"] == "rejected" and "permission denied" in record["reason"].lower()
    assert svc.get("/api/v1/jobs")["total"] == 0

    locked.chmod(0o644)  # an attribute event, no new content
    record = wait_for(lambda: (r := files(svc)["locked.mp4"])["state"] == "present" and r)
    (job,) = jobs_of(svc, record["file_uuid"])
    svc.wait_status(job["task_id"], "completed")


def test_a_file_unreadable_when_its_job_starts_is_rejected_then_taken_once_readable(
    start_service, unprivileged, tmp_path
) -> None:
    # Written and closed, the file is queued before it is probed; the probe at its job's
    # start finds it unreadable. That can pass: it is looked at again, not rejected for good.
    svc = start_service(wrapper=unprivileged, ingest=INGEST)
    svc.call("POST", "/api/v1/queue/pause")
    copy_in(noise_video(tmp_path / "v.mp4", 7), svc.drop / "later locked.mp4")
    record = wait_for(lambda: files(svc).get("later locked.mp4"))
    detail = svc.get(f"/api/v1/files/{record['file_uuid']}")
    assert detail["state"] == "present" and detail["duration"] is None, "not probed yet"
    (first,) = jobs_of(svc, record["file_uuid"])
    (svc.drop / "later locked.mp4").chmod(0)  # no new content: an attribute event only
    svc.call("POST", "/api/v1/queue/resume")

    first = svc.wait_status(first["task_id"], "failed")
    (run,) = first["processors"].values()
    assert run["attempts"] == 0 and "permission denied" in run["error"].lower(), run
    record = files(svc)["later locked.mp4"]
    assert record["state"] == "rejected" and "permission denied" in record["reason"].lower()

    (svc.drop / "later locked.mp4").chmod(0o644)
    record = wait_for(lambda: (r := files(svc)["later locked.mp4"])["state"] == "present" and r)
    old, new = jobs_of(svc, record["file_uuid"])
    assert old["task_id"] == first["task_id"]
    svc.wait_status(new["task_id"], "completed")
    assert svc.get(f"/api/v1/files/{record['file_uuid']}")["duration"] == pytest.approx(0.7)


def test_a_file_made_unreadable_while_its_job_runs_is_not_queued_again_once_readable(
    start_service, unprivileged, tmp_path
) -> None:
    # Locking a file for a moment changes no content: its finished job stands, and being
    # readable again is not a new upload.
    svc = start_service(
        wrapper=unprivileged,
        ingest=INGEST | {"processors": ["steps"]},
        **{"processors.steps": {"steps": 30, "step_seconds": 0.1}},
    )
    clip = copy_in(noise_video(tmp_path / "v.mp4", 8), svc.drop / "locked a while.mp4")
    record = wait_for(lambda: files(svc).get("locked a while.mp4"))
    (job,) = jobs_of(svc, record["file_uuid"])
    job_url = f"/api/v1/jobs/{job['task_id']}"
    wait_for(lambda: svc.get(job_url)["processors"]["steps"].get("current", 0) >= 2)
    clip.chmod(0)
    locked = wait_for(lambda: (r := files(svc)["locked a while.mp4"])["state"] == "rejected" and r)
    assert "permission denied" in locked["reason"].lower()
    done = svc.wait_status(job["task_id"], "completed")
    assert done["processors"]["steps"]["status"] == "completed"

    clip.chmod(0o644)
    wait_for(lambda: files(svc)["locked a while.mp4"]["state"] == "present")
    assert [j["task_id"] for j in jobs_of(svc, record["file_uuid"])] == [job["task_id"]]
    detail = svc.get(f"/api/v1/files/{record['file_uuid']}")
    assert detail["duration"] == pytest.approx(0.8), "what its probe found is kept"


# -- defect: a file still being uploaded is shown as rejected ----------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sftp_server(tmp_path: Path) -> Iterator[Callable[[Path, Path], subprocess.Popen[bytes]]]:
    """OpenSSH's sshd on a loopback port (temporary host key, temporary authorized key,
    the current user); yields put(local, remote) -> the running ``sftp -l 1600`` client."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not (os.path.exists(sshd) and shutil.which("sftp") and shutil.which("ssh-keygen")):
        pytest.fail("needs openssh-server and openssh-client (scripts/test installs them)")
    keys = tmp_path / "ssh"
    keys.mkdir(mode=0o700)
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    shutil.copy(keys / "client.pub", keys / "authorized_keys")
    port = _free_port()
    config = keys / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile {keys / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation dir
    server = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(config)], stderr=(keys / "sshd.log").open("wb")
    )
    wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, timeout=15)
    clients: list[subprocess.Popen[bytes]] = []

    def put(local: Path, remote: Path) -> subprocess.Popen[bytes]:
        batch = keys / "batch"
        batch.write_text(f'put "{local}" "{remote}"\n')
        client = subprocess.Popen(
            [
                "sftp",
                *("-b", str(batch), "-l", "1600", "-i", str(keys / "client"), "-P", str(port)),
                *("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"),
                *("-o", "BatchMode=yes", "-o", "LogLevel=ERROR"),
                "127.0.0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        clients.append(client)
        return client

    yield put
    for client in clients:
        if client.poll() is None:
            client.kill()
            client.wait()
    server.terminate()
    server.wait(timeout=10)


def test_a_slow_sftp_upload_is_never_shown_rejected_and_is_taken_when_done(
    start_service, sftp_server, tmp_path
) -> None:
    svc = start_service(ingest=INGEST | {"settle_seconds": 1})
    video = noise_video(tmp_path / "big.mp4", 110)  # ~1.5 MB: ~8 s at 1.6 Mbit/s
    client = sftp_server(video, svc.drop / "upload.mp4")

    seen_states: list[str] = []
    rescans: Counter[str] = Counter()
    while client.poll() is None:
        # A rescan finds the file between bursts too: it must not judge it half-written.
        rescans.update(k for k, v in rescan(svc).items() if v)
        record = files(svc).get("upload.mp4")
        if record is not None:
            seen_states.append(record["state"])
            assert record["state"] != "rejected", f"shown rejected mid-upload: {record}"
        time.sleep(0.1)
    assert rescans["settling"] > 0, rescans
    assert client.returncode == 0, client.stdout.read().decode()
    assert (svc.drop / "upload.mp4").stat().st_size == video.stat().st_size

    record = wait_for(lambda: files(svc).get("upload.mp4"))
    assert record["state"] == "present", record
    assert record["size"] == video.stat().st_size, "taken whole, not part way"
    (job,) = jobs_of(svc, record["file_uuid"])
    svc.wait_status(job["task_id"], "completed")
    assert svc.get(f"/api/v1/files/{record['file_uuid']}")["duration"] == pytest.approx(11.0)
    # Nothing was announced for it before the upload ended.
    assert set(seen_states) <= {"present"}


def test_a_file_is_taken_when_its_writer_closes_it_and_not_while_it_is_open(
    start_service, tmp_path
) -> None:
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("close events are an inotify (Linux) feature")
    data = noise_video(tmp_path / "v.mp4", 5).read_bytes()

    # Whole and valid, but its writer still has it open: not taken, however long it is quiet.
    svc = start_service("open", service={"node_id": "open"}, ingest=INGEST | {"settle_seconds": 1})
    with (svc.drop / "held open.mp4").open("wb") as writer:
        writer.write(data)
        writer.flush()
        deadline = time.monotonic() + 4  # four times settle_seconds
        while time.monotonic() < deadline:
            assert files(svc) == {}, "taken while its writer still had it open"
            time.sleep(0.2)
    record = wait_for(lambda: files(svc).get("held open.mp4"))
    assert record["state"] == "present" and record["size"] == len(data)

    # Written and closed: taken at once, long before settle_seconds.
    svc = start_service(
        "closed", service={"node_id": "closed"}, ingest=INGEST | {"settle_seconds": 3600}
    )
    (svc.drop / "closed.mp4").write_bytes(data)
    record = wait_for(lambda: files(svc).get("closed.mp4"), timeout=30)
    assert record["state"] == "present"


@pytest.mark.parametrize("suffix", [".mp4", ".mts"])
def test_a_file_its_writer_closes_after_each_part_gets_one_job_that_runs_once_it_is_whole(
    start_service, tmp_path, suffix
) -> None:
    # As a resumed upload, or `cat part >> file`: each part is a close. An mp4 with its
    # index at the end does not read until the last part; an MPEG-TS (a camera's .mts)
    # reads whole at every part.
    data = noise_video(tmp_path / f"v{suffix}", 20).read_bytes()
    svc = start_service(ingest=INGEST | {"settle_seconds": 1.5})
    target = svc.drop / f"in parts{suffix}"
    parts = 8
    for i in range(parts):
        with target.open("ab") as writer:
            writer.write(data[i * len(data) // parts : (i + 1) * len(data) // parts])
        time.sleep(0.4)
    record = wait_for(lambda: files(svc).get(target.name))
    wait_for(lambda: jobs_of(svc, record["file_uuid"])[-1]["status"] == "completed", timeout=60)
    record = files(svc)[target.name]
    assert record["state"] == "present" and record["size"] == len(data)
    assert [job["status"] for job in jobs_of(svc, record["file_uuid"])] == ["completed"]
    detail = svc.get(f"/api/v1/files/{record['file_uuid']}")
    assert detail["duration"] == pytest.approx(2.0, abs=0.15), "probed whole"


# -- defect: duplicate content decided on a sample ---------------------------------------------


def test_files_alike_in_their_samples_but_not_in_content_are_processed_separately(
    start_service, tmp_path
) -> None:
    svc = start_service(ingest=INGEST | {"processors": ["cut"]})
    # A real video padded past 3 MiB; the look-alike differs only between the hashed
    # samples (head 0-1 MiB, middle 1.5-2.5 MiB, tail 3-4 MiB of 4 MiB).
    data = bytearray(noise_video(tmp_path / "v.mp4", 8).read_bytes())
    data += bytes(range(256)) * ((4 << 20) - len(data) >> 8)
    data += b"\0" * ((4 << 20) - len(data))
    original = tmp_path / "original.mp4"
    original.write_bytes(data)
    data[(5 << 20) // 4 : (5 << 20) // 4 + 4096] = b"\xee" * 4096  # at 1.25 MiB
    lookalike = tmp_path / "lookalike.mp4"
    lookalike.write_bytes(data)

    copy_in(original, svc.drop / "original.mp4")
    first = wait_for(lambda: files(svc).get("original.mp4"))
    (job,) = jobs_of(svc, first["file_uuid"])
    svc.wait_status(job["task_id"], "completed")

    copy_in(lookalike, svc.drop / "lookalike.mp4")
    other = wait_for(lambda: files(svc).get("lookalike.mp4"))
    detail = svc.get(f"/api/v1/files/{other['file_uuid']}")
    original_detail = svc.get(f"/api/v1/files/{first['file_uuid']}")
    assert detail["fingerprint"] == original_detail["fingerprint"], "the samples match"
    (job,) = jobs_of(svc, other["file_uuid"])
    cut = svc.wait_status(job["task_id"], "completed")["processors"]["cut"]
    assert cut["status"] == "completed", f"not linked to the look-alike's results: {cut}"
    result = svc.get(f"/api/v1/files/{other['file_uuid']}/results/cut")
    assert result["file_uuid"] == other["file_uuid"]

    # A true copy is still a duplicate.
    copy_in(original, svc.drop / "copy.mp4")
    copy = wait_for(lambda: files(svc).get("copy.mp4"))
    (job,) = jobs_of(svc, copy["file_uuid"])
    cut = svc.wait_status(job["task_id"], "completed")["processors"]["cut"]
    assert cut["status"] == "skipped" and cut["reason"] in (
        f"duplicate of {first['file_uuid']}",
        f"duplicate of {other['file_uuid']}",
    )
    assert cut["reason"] == f"duplicate of {first['file_uuid']}"


# -- hostile paths and names -------------------------------------------------------------------


def test_register_refuses_paths_that_cannot_name_a_file(start_service) -> None:
    svc = start_service(ingest=INGEST | {"settle_seconds": 60})
    for path, words in (
        ("clip\0.mp4", "NUL"),
        ("\ud800.mp4", "not valid Unicode"),
        ("x" * 5000 + ".mp4", "too long"),
        ("sub/" + "y" * 300 + ".mp4", "too long"),
        ("/".join(["d" * 200] * 25) + ".mp4", "too long"),
    ):
        # As JSON escapes (a lone surrogate has no UTF-8 form), the way a client sends it.
        content = json.dumps({"path": path})
        headers = {"Content-Type": "application/json"}
        reply = svc.client.post("/api/v1/files/register", content=content, headers=headers)
        assert reply.status_code == 400, (path[:20], reply.text)
        body = reply.json()
        assert body["success"] is False and words in body["error"]["message"], body
    assert svc.get("/healthz")["status"] == "ok"


def test_odd_names_and_special_files_in_the_drop_folder_are_taken_or_skipped_with_a_reason(
    start_service, tmp_path
) -> None:
    svc = start_service(ingest=INGEST)
    clip = noise_video(tmp_path / "clip.mp4", 3).read_bytes()
    drop = os.fsencode(svc.drop)
    taken = {
        "new\nline.mp4",
        "esc \x1b[2J\x1b]0;title\x07.mp4",
        "tab\tand\rcr.mp4",
        "n" * 251 + ".mp4",  # 255 bytes, the longest name Linux allows
        "ü" * 125 + ".mp4",  # 254 bytes in UTF-8
    }
    for i, name in enumerate(sorted(taken)):
        (svc.drop / name).write_bytes(clip + i.to_bytes(4, "big"))
    # Not valid UTF-8 (Linux names are bytes): a file, and a good name in such a folder.
    with open(os.path.join(drop, b"bad \xff name.mp4"), "wb") as f:
        f.write(clip + b"bad1")
    os.mkdir(os.path.join(drop, b"folder \xfe"))
    with open(os.path.join(drop, b"folder \xfe", b"inside.mp4"), "wb") as f:
        f.write(clip + b"bad2")
    outside = copy_in(tmp_path / "clip.mp4", tmp_path / "outside" / "secret.mp4")
    (svc.drop / "link out.mp4").symlink_to(outside)
    (svc.drop / "dangling.mp4").symlink_to(tmp_path / "nowhere.mp4")
    os.mkfifo(svc.drop / "pipe.mp4")
    with contextlib.suppress(PermissionError):  # where not allowed, the FIFO stands for it
        os.mknod(svc.drop / "device.mp4", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (svc.drop / "good.mp4").write_bytes(clip + b"good")

    good = wait_for(lambda: files(svc).get("good.mp4"), timeout=30)
    wait_for(lambda: len(files(svc)) == len(taken) + 1, timeout=30)
    known = files(svc)
    assert set(known) == taken | {"good.mp4"}
    assert {f["state"] for f in known.values()} == {"present"}
    for name in taken:
        assert known[name]["file_name"] == name
        (job,) = jobs_of(svc, known[name]["file_uuid"])
        svc.wait_status(job["task_id"], "completed")
    # A rescan of the same folder finds nothing new and trips on nothing.
    counts = rescan(svc)
    assert counts["new"] == 0 and counts["unchanged"] == len(taken) + 1, counts
    assert svc.get(f"/api/v1/files/{good['file_uuid']}")["state"] == "present"

    # The hook: taken names answer with their record; special files are a 400.
    reply = svc.call("POST", "/api/v1/files/register", json={"path": "new\nline.mp4"})
    assert reply["file_uuid"] == known["new\nline.mp4"]["file_uuid"]
    for name, words in (
        ("pipe.mp4", "not a regular file"),
        ("link out.mp4", "not inside a watched folder"),
        ("good.mp4/inside.mp4", "no file"),
    ):
        reply = svc.client.post("/api/v1/files/register", json={"path": name})
        assert reply.status_code == 400 and words in reply.json()["error"]["message"], reply.text

    # Why the bad names were skipped is in the log; nothing failed on the way.
    log = svc.log()
    assert "not valid UTF-8" in log
    assert "link out.mp4': a symlink, not followed" in log
    assert log_errors(svc) == []
    assert svc.get("/healthz")["status"] == "ok"


def test_the_ingest_thread_keeps_going_after_a_file_that_cannot_be_read_at_all(
    start_service, unprivileged, tmp_path
) -> None:
    # A folder the service cannot list, and a file in it it cannot reach: skipped, logged.
    svc = start_service(wrapper=unprivileged, ingest=INGEST)
    closed = svc.drop / "closed folder"
    closed.mkdir()
    (closed / "inside.mp4").write_bytes(noise_video(tmp_path / "a.mp4", 3).read_bytes())
    closed.chmod(0)
    counts = rescan(svc)
    assert counts["new"] == 0
    reply = svc.client.post("/api/v1/files/register", json={"path": "closed folder/inside.mp4"})
    assert reply.status_code == 400, reply.text
    copy_in(tmp_path / "a.mp4", svc.drop / "after.mp4")
    record = wait_for(lambda: files(svc).get("after.mp4"))
    assert record["state"] == "present"
    assert svc.get("/healthz")["status"] == "ok"
    closed.chmod(0o755)


@pytest.mark.parametrize("away", ["deleted", "renamed away"])
def test_the_drop_folder_removed_and_made_again_is_watched_again_without_a_restart(
    start_service, away: str
) -> None:
    svc = start_service(ingest=INGEST)  # no periodic rescan: only the watch can find files
    svc.add_video("before.mp4")
    wait_for(lambda: files(svc).get("before.mp4"))
    if away == "deleted":
        shutil.rmtree(svc.drop)
        wait_for(lambda: files(svc)["before.mp4"]["state"] == "missing")
    else:
        # mv drop drop.old: inotify reports no event for the watched folder's own rename.
        svc.drop.rename(svc.root / "drop.old")
    # Said why its files are left as they were (a volume unmounted looks the same).
    wait_for(lambda: "is not there" in svc.log())

    svc.drop.mkdir()
    svc.add_video("after.mp4")
    record = wait_for(lambda: files(svc).get("after.mp4"))
    (job,) = jobs_of(svc, record["file_uuid"])
    svc.wait_status(job["task_id"], "completed")
    assert files(svc)["before.mp4"]["state"] == "missing"
    assert log_errors(svc) == []


def test_the_files_of_a_drop_folder_deleted_are_missing_even_when_a_rescan_comes_at_once(
    start_service,
) -> None:
    # The rescan finds the folder gone while its files' deletions are still on their way
    # from the watch: they must still arrive. A race, so a few rounds.
    svc = start_service(ingest=INGEST)
    for round in range(4):
        names = [f"r{round}-{n}.mp4" for n in range(10)]
        for name in names:
            svc.add_video(name)
        wait_for(lambda names=names: all(name in files(svc) for name in names))
        shutil.rmtree(svc.drop)
        svc.call("POST", "/api/v1/files/rescan")
        wait_for(lambda names=names: all(files(svc)[n]["state"] == "missing" for n in names))
        svc.drop.mkdir()  # watched again: the next round's files are found through it
    assert log_errors(svc) == []


def test_a_registered_file_swapped_for_a_symlink_out_is_not_followed(start_service) -> None:
    svc = start_service(ingest=INGEST)
    svc.call("POST", "/api/v1/queue/pause")  # its job waits while the file is swapped
    svc.add_video("clip.mp4")
    record = wait_for(lambda: files(svc).get("clip.mp4"))
    secret = svc.root / "secret.mp4"
    shutil.copyfile(svc.drop / "clip.mp4", secret)
    # As `ln -sf` does it: a symlink made under another name, renamed over the file.
    (svc.drop / ".link").symlink_to(secret)
    os.replace(svc.drop / ".link", svc.drop / "clip.mp4")
    wait_for(lambda: files(svc)["clip.mp4"]["state"] == "missing")

    svc.call("POST", "/api/v1/queue/resume")
    (job,) = jobs_of(svc, record["file_uuid"])
    job = svc.wait_status(job["task_id"], "failed", "completed")
    assert job["status"] == "failed"
    run = job["processors"]["noop"]
    assert "symlink" in run["error"] and run["attempts"] <= 1, run
    document = svc.get(f"/api/v1/files/{record['file_uuid']}/results/noop")
    assert document["status"] == "failed" and document["result"] is None, document


def test_a_file_in_a_folder_that_could_not_be_read_is_taken_once_the_folder_can_be(
    start_service, unprivileged, tmp_path
) -> None:
    svc = start_service(wrapper=unprivileged, ingest=INGEST)  # no periodic rescan
    closed = svc.drop / "closed folder"
    closed.mkdir()
    closed.chmod(0)
    copy_in(noise_video(tmp_path / "a.mp4", 3), closed / "inside.mp4")  # the test runs as owner
    wait_for(lambda: "closed folder': cannot look into it: Permission denied" in svc.log())
    svc.restart()  # unreadable at start-up: no watch can be made for it
    assert files(svc) == {}

    closed.chmod(0o755)
    assert wait_for(lambda: files(svc).get("closed folder/inside.mp4"))["state"] == "present"
    copy_in(noise_video(tmp_path / "b.mp4", 4), closed / "later.mp4")  # and it is watched
    assert wait_for(lambda: files(svc).get("closed folder/later.mp4"))["state"] == "present"
    assert log_errors(svc) == []
