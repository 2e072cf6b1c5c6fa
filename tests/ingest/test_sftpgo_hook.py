"""SFTPGo's own upload notification at POST /api/v1/hooks/sftpgo, as SFTPGo sends it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from conftest import ServiceProcess, wait_for

from momentry_edge.ingest.upload_hooks import CLOCK_SLACK


def sftpgo_event(svc: ServiceProcess, path: str, virtual_path: str, **extra: Any) -> dict:
    """The JSON body of SFTPGo's HTTP hook (docs/custom-actions.md, "Filesystem events"),
    stamped as sent now (``timestamp`` in nanoseconds, ``elapsed`` in milliseconds)."""
    size = Path(path).stat().st_size if Path(path).exists() else 0
    return {
        "action": "upload",
        "username": "studio",
        "path": path,
        "virtual_path": virtual_path,
        "file_size": size,
        "elapsed": 1250,
        "fs_provider": 0,
        "status": 1,
        "protocol": "SFTP",
        "ip": "192.0.2.10",
        "session_id": "a1b2c3d4e5f60718",
        "timestamp": time.time_ns(),
        **extra,
    }


def arrive(svc: ServiceProcess, name: str) -> Path:
    """A finished upload placed whole in the drop folder, so that the hook is first: linked
    in, the watcher sees no write, close or move there and waits settle_seconds. (Renamed
    into place, as SFTPGo's atomic upload mode does, it is taken at once: see
    test_a_rename_and_its_hook_racing_give_one_record_and_one_job.)"""
    staged = svc.add_video(f"../staging/{name}")
    target = svc.drop / name
    target.parent.mkdir(parents=True, exist_ok=True)
    os.link(staged, target)
    staged.unlink()
    return target


def hook(svc: ServiceProcess, body: dict, expect: int) -> dict:
    return svc.call("POST", "/api/v1/hooks/sftpgo", expect=expect, json=body)


def test_an_sftpgo_upload_registers_the_file_and_its_scan_runs(start_service) -> None:
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    video = arrive(svc, "clips/take 1.mp4")
    reply = hook(svc, sftpgo_event(svc, str(video), "/clips/take 1.mp4"), expect=201)
    assert reply["success"] is True and reply["state"] == "present" and reply["task_id"]
    assert svc.wait_status(reply["task_id"], "completed")["file_uuid"] == reply["file_uuid"]
    detail = svc.get(f"/api/v1/files/{reply['file_uuid']}")
    assert detail["path"] == "clips/take 1.mp4" and detail["state"] == "present"
    # SFTPGo sends its notification again (a retry): the same record and job.
    again = hook(svc, sftpgo_event(svc, str(video), "/clips/take 1.mp4"), expect=200)
    assert again["file_uuid"] == reply["file_uuid"] and again["task_id"] == reply["task_id"]

    # SFTPGo sees the drop folder under another mount (a container): the user's
    # home is the watched folder, so virtual_path finds the file.
    other = arrive(svc, "clips/take 2.mp4")
    body = sftpgo_event(svc, "/srv/sftpgo/data/studio/clips/take 2.mp4", "/clips/take 2.mp4")
    body["file_size"] = other.stat().st_size
    moved = hook(svc, body, expect=201)
    assert svc.get(f"/api/v1/files/{moved['file_uuid']}")["path"] == "clips/take 2.mp4"

    # Other actions are acknowledged and change nothing.
    download = hook(svc, sftpgo_event(svc, str(video), "/clips/take 1.mp4", action="download"), 200)
    assert download == {"success": True, "ignored": True, "reason": "not an upload"}
    assert svc.get("/api/v1/files")["total"] == 2


def test_an_upload_sftpgo_reports_as_failed_is_rejected_and_never_processed(start_service) -> None:
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    video = arrive(svc, "broken.mp4")
    reply = hook(svc, sftpgo_event(svc, str(video), "/broken.mp4", status=2), expect=201)
    assert reply["state"] == "rejected" and reply["task_id"] is None
    assert "upload" in reply["reason"]
    # The watcher sees the same file settle, and a rescan runs: the verdict stands.
    svc.call("POST", "/api/v1/files/rescan")
    detail = svc.get(f"/api/v1/files/{reply['file_uuid']}")
    assert detail["state"] == "rejected" and detail["jobs"] == []
    assert svc.get("/api/v1/jobs")["total"] == 0

    # Over quota: SFTPGo removed the partial file itself; nothing to record.
    gone = str(svc.drop / "too big.mp4")
    quota = hook(svc, sftpgo_event(svc, gone, "/too big.mp4", status=3), expect=200)
    assert quota["ignored"] is True
    assert svc.get("/api/v1/files")["total"] == 1


def test_a_path_outside_the_watched_folders_is_refused(start_service) -> None:
    svc = start_service(ingest={"processors": ["noop"]})
    outside = svc.add_video("../elsewhere.mp4")  # beside the drop folder, not in it
    for path, virtual in (
        (str(outside), "/../../elsewhere.mp4"),
        (str(outside), "/../elsewhere.mp4"),
        ("/etc/passwd", ""),
    ):
        reply = svc.client.post("/api/v1/hooks/sftpgo", json=sftpgo_event(svc, path, virtual))
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "bad_request" and "not inside a watched folder" in error["message"]
    for body, words in (
        ({"username": "studio", "path": str(outside)}, "action is required"),
        ({"action": "upload", "path": str(outside)}, "status must be an integer"),
        ({"action": "upload", "status": 1}, "path or virtual_path is required"),
        ({"action": "upload", "status": 1, "path": "relative.mp4"}, "full filesystem path"),
        ({"action": "upload", "status": 2, "timestamp": "now"}, "timestamp must be an integer"),
    ):
        reply = svc.client.post("/api/v1/hooks/sftpgo", json=body)
        assert reply.status_code == 400 and words in reply.json()["error"]["message"], reply.text
    assert svc.get("/api/v1/files")["total"] == 0
    assert svc.status()["pending_count"] == 0


def test_a_rename_and_its_hook_racing_give_one_record_and_one_job(start_service) -> None:
    # SFTPGo's atomic upload: written under a temporary name in the drop folder, renamed
    # into place, then the hook. The watcher takes a renamed file at once as well (a long
    # settle time does not hold it back); whichever is first, one record and one job.
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    staged = svc.add_video("../staging/take 3.mp4")
    for name in ("take 3.mp4", "witness.mp4"):
        temporary = svc.drop / f".sftpgo-upload.{name}"  # hidden: never taken
        shutil.copyfile(staged, temporary)
        if name == "witness.mp4":
            with temporary.open("ab") as f:
                f.write(b"other content")
        temporary.rename(svc.drop / name)
    target = svc.drop / "take 3.mp4"
    reply = svc.client.post(
        "/api/v1/hooks/sftpgo", json=sftpgo_event(svc, str(target), "/take 3.mp4")
    )
    assert reply.status_code in (200, 201), reply.text
    taken = reply.json()
    assert taken["state"] == "present" and taken["task_id"], taken
    # The watcher took the second rename (no hook for it), so it is past the first one.
    wait_for(lambda: svc.get("/api/v1/files")["total"] == 2)
    svc.wait_status(taken["task_id"], "completed")
    (job,) = svc.get(f"/api/v1/files/{taken['file_uuid']}")["jobs"]
    assert job["task_id"] == taken["task_id"]
    assert svc.get("/api/v1/jobs")["total"] == 2


def test_an_upload_event_for_a_file_still_being_written_is_refused_and_the_file_taken_whole(
    start_service,
) -> None:
    # The hook ahead of the data (a network mount that lags, an event rule fired early):
    # the file has fewer bytes than SFTPGo says it uploaded.
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    whole = svc.add_video("../staging/late.mp4").read_bytes()
    target = svc.drop / "late.mp4"
    with target.open("wb") as writer:
        writer.write(whole[: len(whole) // 2])
        writer.flush()
        body = sftpgo_event(svc, str(target), "/late.mp4") | {"file_size": len(whole)}
        reply = svc.client.post("/api/v1/hooks/sftpgo", json=body)
        assert reply.status_code == 409, reply.text
        error = reply.json()["error"]
        assert error["code"] == "conflict" and "still being written" in error["message"]
        assert svc.get("/api/v1/files")["total"] == 0, "nothing recorded, nothing rejected"
        writer.write(whole[len(whole) // 2 :])

    # Whole now (closed by its writer): the watcher takes it, and the hook sent again agrees.
    file_uuid = wait_for(lambda: [f["file_uuid"] for f in svc.get("/api/v1/files")["files"]])[0]
    again = hook(svc, sftpgo_event(svc, str(target), "/late.mp4"), expect=200)
    assert again["file_uuid"] == file_uuid and again["state"] == "present"
    svc.wait_status(again["task_id"], "completed")
    assert svc.get("/api/v1/jobs")["total"] == 1
    assert svc.get("/api/v1/queue/dead")["jobs"] == []

    # A folder is not a file being written: the register's own refusal.
    folder = svc.drop / "folder.mp4"
    folder.mkdir()
    body = sftpgo_event(svc, str(folder), "/folder.mp4") | {"file_size": 10**9}
    error = hook(svc, body, expect=400)["error"]
    assert "not a regular file" in error["message"], error


def test_a_failed_reupload_leaves_the_file_registered_before_it_as_it_was(start_service) -> None:
    # SFTPGo's atomic upload mode: a re-upload that breaks off never replaces the file.
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    video = arrive(svc, "clip.mp4")
    first = hook(svc, sftpgo_event(svc, str(video), "/clip.mp4"), expect=201)
    svc.wait_status(first["task_id"], "completed")

    # The re-upload begins after the file last changed, and breaks off at once.
    wait_for(lambda: time.time() > video.stat().st_ctime + CLOCK_SLACK)
    for status in (2, 3):
        body = sftpgo_event(svc, str(video), "/clip.mp4", status=status, file_size=999, elapsed=0)
        reply = hook(svc, body, expect=200)
        assert reply["ignored"] is True and "nothing changed" in reply["reason"], reply
    detail = svc.get(f"/api/v1/files/{first['file_uuid']}")
    assert detail["state"] == "present" and detail["reason"] is None
    assert detail["status"] == "completed"
    assert "unchanged since it was registered" in svc.log()
    svc.call("POST", "/api/v1/files/rescan")
    scan = f"/api/v1/file/{first['file_uuid']}/deep-scan"
    again = svc.call("POST", scan, expect=202, json={"processors": ["noop"], "force": True})
    svc.wait_status(again["task_id"], "completed")

    # The failed upload may be what the file holds (as many bytes as it sent, or written
    # since it was registered): rejected, as before.
    same_size = sftpgo_event(svc, str(video), "/clip.mp4", status=2)
    assert hook(svc, same_size, expect=201)["state"] == "rejected"
    other = arrive(svc, "other.mp4")
    registered = hook(svc, sftpgo_event(svc, str(other), "/other.mp4"), expect=201)
    svc.wait_status(registered["task_id"], "completed")
    # Written in place: the watcher takes the bytes of the upload that broke off (its
    # writer closed the file) before SFTPGo's hook arrives. The file is then as it was
    # registered, but registered as the failed upload left it.
    began = time.time_ns()
    with other.open("ab") as f:
        f.write(b"a part of the upload that broke off")
    grown = other.stat().st_size
    wait_for(lambda: svc.get(f"/api/v1/files/{registered['file_uuid']}")["size"] == grown)
    elapsed = (time.time_ns() - began) // 1_000_000 + 1
    failed = sftpgo_event(svc, str(other), "/other.mp4", status=2, file_size=10, elapsed=elapsed)
    assert hook(svc, failed, expect=201)["state"] == "rejected"


def test_a_hook_naming_a_symlink_is_refused_and_its_target_left_alone(start_service) -> None:
    svc = start_service(ingest={"processors": ["noop"], "settle_seconds": 60})
    target = arrive(svc, "other.mp4")
    taken = hook(svc, sftpgo_event(svc, str(target), "/other.mp4"), expect=201)
    svc.wait_status(taken["task_id"], "completed")
    (svc.drop / "alias.mp4").symlink_to(target)
    (svc.drop / "linked").symlink_to(svc.drop, target_is_directory=True)
    for path, virtual in (
        (str(svc.drop / "alias.mp4"), "/alias.mp4"),
        ("/srv/sftpgo/data/studio/alias.mp4", "/alias.mp4"),  # found by virtual_path
        (str(svc.drop / "linked" / "other.mp4"), "/linked/other.mp4"),
    ):
        for status in (1, 2, 3):
            body = sftpgo_event(svc, path, virtual, status=status)
            error = hook(svc, body, expect=400)["error"]
            assert "a symlink, not followed" in error["message"], error
    detail = svc.get(f"/api/v1/files/{taken['file_uuid']}")
    assert detail["state"] == "present" and detail["status"] == "completed"
    assert svc.get("/api/v1/files")["total"] == 1
