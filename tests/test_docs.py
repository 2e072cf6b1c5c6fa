"""The project's own reference (docs/) keeps up with the API and the config definition."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from momentry_edge import config, events
from momentry_edge.http.openapi import openapi_document

DOCS = Path(__file__).resolve().parent.parent / "docs"
README = DOCS.parent / "README.md"
METHODS = {"get", "put", "post", "delete", "patch"}


def test_every_operation_of_the_openapi_document_is_in_the_api_reference() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    paths = openapi_document("0")["paths"]
    operations = [f"{m.upper()} {p}" for p, item in paths.items() for m in item if m in METHODS]
    assert operations
    # Written as `GET /api/v1/jobs/{job}` or `GET /api/v1/jobs?status=...`.
    missing = [op for op in operations if not re.search(f"`{re.escape(op)}[`?]", text)]
    assert not missing, f"document these in docs/api.md: {missing}"


def test_every_config_key_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    keys = [
        f"{section}.{f.name}"
        for section, cls in config.SECTIONS.items()
        for f in dataclasses.fields(cls)
    ]
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"document these in docs/configuration.md: {missing}"
    # The short environment variable names are listed beside their keys.
    for cls in config.SECTIONS.values():
        for f in dataclasses.fields(cls):
            if f.metadata.get("env"):
                assert f"`{f.metadata['env']}`" in text, f.metadata["env"]


def test_the_readme_points_to_the_project_reference() -> None:
    text = README.read_text(encoding="utf-8")
    assert "docs/api.md" in text and "docs/configuration.md" in text
    assert "../shared" not in text


def _published_event_types() -> set[str]:
    """Every event type the package hands to ``bus.publish``: what an event stream carries."""
    types = set()
    for source in (DOCS.parent / "momentry_edge").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "publish"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "bus"
            ):
                continue
            first = node.args[0]
            choices = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
            assert all(isinstance(c, ast.Constant) for c in choices), ast.unparse(first)
            types.update(c.value for c in choices)
    return types


def test_every_event_type_a_stream_carries_is_in_the_api_reference() -> None:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    events = text[text.index("`GET /api/v1/events`") :].split("\n\n")[0]
    types = _published_event_types()
    assert "job.finished" in types and "queue.paused" in types
    missing = sorted(t for t in types if f"`{t}`" not in events)
    assert not missing, f"document these in docs/api.md (GET /api/v1/events): {missing}"


def test_the_event_catalogue_names_every_event_type_published_and_no_other() -> None:
    published = _published_event_types()
    assert published == set(events.EVENTS), (
        f"add to events.EVENTS: {sorted(published - set(events.EVENTS))}; "
        f"no longer published: {sorted(set(events.EVENTS) - published)}"
    )
    assert all(events.EVENTS.values())


def test_the_readme_is_a_newcomers_path_and_its_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 12_000, "keep the README short: details go to docs/"
    # The two commands come first, as they are.
    assert text.split("```")[1].strip().splitlines() == [
        "scripts/run     # set up .venv and run the service on its embedded defaults",
        "scripts/test    # set up .venv and run the tests (real SQLite and PostgreSQL)",
    ]
    headings = re.findall(r"(?m)^## (.+)$", text)
    for needed in ("Drop a file", "Watch it", "Where the results are", "Start at boot"):
        assert needed in headings
    assert headings.index("Drop a file") < headings.index("Start at boot")
    # Only documents in the repository: none that readers cannot open.
    assert "API.md" not in text.replace("docs/api.md", "") and "Job Worker plan" not in text
    for page in (DOCS.parent, DOCS):
        for document in page.glob("*.md"):
            for target in re.findall(r"\]\(([^)#:]+\.md)", document.read_text(encoding="utf-8")):
                assert (document.parent / target).exists(), f"{document.name} links {target}"
