"""The OpenAPI document: valid, complete against the app's routes, true to API.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from momentry_edge import __version__, config
from momentry_edge.http.app import make_app
from momentry_edge.http.openapi import openapi_document
from momentry_edge.service import Service

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


@pytest.fixture(scope="module")
def doc() -> dict:
    return openapi_document("9.9.9")


def _operations(doc: dict) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in METHODS}


def test_document_is_valid_openapi(doc: dict) -> None:
    validate(doc)
    assert doc["openapi"] == "3.0.3"
    assert doc["info"]["version"] == "9.9.9"


def test_every_route_is_documented_and_nothing_else(doc: dict, tmp_path: Path) -> None:
    toml = tmp_path / "momentry.toml"
    toml.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\nwatch = ["{tmp_path / "drop"}"]\n',
        encoding="utf-8",
    )
    app = make_app(Service(config.load(toml, env={})))
    routes = {(r.method, re.sub(r"<(\w+)(?::[^>]*)?>", r"{\1}", r.rule)) for r in app.routes}
    assert routes, "the app has no routes?"
    assert _operations(doc) == routes


def test_bearer_auth_on_api_paths_only(doc: dict) -> None:
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    for path, item in doc["paths"].items():
        for op in item.values():
            secured = op.get("security") == [{"bearerAuth": []}]
            assert secured == path.startswith("/api/"), path
            assert ("401" in op["responses"]) == secured, path


def test_error_responses_use_the_error_shape(doc: dict) -> None:
    error = doc["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"success", "error"}
    assert set(error["properties"]["error"]["required"]) == {"code", "message"}
    for name in ("BadRequest", "Unauthorized", "NotFound", "Conflict", "PayloadTooLarge"):
        content = doc["components"]["responses"][name]["content"]["application/json"]
        assert content["schema"] == {"$ref": "#/components/schemas/Error"}
    retry = doc["paths"]["/api/v1/jobs/{job}/retry"]["post"]["responses"]
    assert {"404", "409"} <= set(retry)
    register = doc["paths"]["/api/v1/files/register"]["post"]
    assert {"201", "200", "400", "413"} <= set(register["responses"])
    assert "requestBody" in register


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        (
            "QueueStatus",
            "active_count max_concurrent effective_concurrency dynamic_concurrency"
            " pending_count paused queue statistics resources nodes",
        ),
        (
            "JobDetail",
            "id task_id file_uuid file_name status priority position progress retry_count"
            " max_retries processors created_at started_at completed_at error_message",
        ),
        (
            "QueueEntry",
            "task_id file_uuid file_name status started_at progress processors priority"
            " queued_at position estimated_start node next_attempt_at",
        ),
        (
            "JobSummary",
            "id task_id file_uuid file_name status progress priority processors completed"
            " failed created_at",
        ),
        ("ProcessorRun", "status progress output_path started_at completed_at error attempts"),
        ("FileSummary", "file_uuid file_name path state reason size status"),
        (
            "FileDetail",
            "file_uuid duration width height fps video_codec audio_codec hdr"
            " sample_aspect_ratio mirrored fingerprint registered_at jobs",
        ),
    ],
)
def test_schemas_carry_the_api_md_fields(doc: dict, schema: str, fields: str) -> None:
    props = doc["components"]["schemas"][schema]["properties"]
    assert set(fields.split()) <= set(props), set(fields.split()) - set(props)


def test_statistics_and_resources_fields(doc: dict) -> None:
    props = doc["components"]["schemas"]["QueueStatus"]["properties"]
    assert {"total_processed", "total_failed", "average_time"} <= set(
        props["statistics"]["properties"]
    )
    assert {"cpu_percent", "memory_percent", "gpu_percent"} <= set(props["resources"]["properties"])


def _check(doc: dict, schema: str, value: object) -> None:
    root = {"components": doc["components"], "$ref": f"#/components/schemas/{schema}"}
    OAS30Validator(root).validate(value)


def test_served_document_matches(start_service) -> None:
    svc = start_service()
    version = svc.get("/healthz")["version"]
    assert version == __version__
    served = svc.get("/openapi.json")
    assert served == openapi_document(version)

    # The service's real replies fit the schemas the document gives them.
    queued = svc.submit("a.mp4", ["steps"])
    job = svc.wait_status(queued["task_id"], "completed")
    _check(served, "JobDetail", job)
    _check(served, "QueueStatus", svc.status())
    _check(served, "JobSummary", svc.get("/api/v1/jobs")["jobs"][0])
    _check(served, "FileSummary", svc.get("/api/v1/files")["files"][0])
    _check(served, "FileDetail", svc.get(f"/api/v1/files/{queued['file_uuid']}"))
    missing = svc.call("GET", "/api/v1/jobs/task_000000000000", expect=404)
    _check(served, "Error", missing)
