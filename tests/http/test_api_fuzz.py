"""Fuzzing: every operation of the served /openapi.json, with data that fits it and data that
does not (schemathesis), against the real service. No 5xx, nothing outside the documented shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance

EXAMPLES = 10  # per operation and generation mode: the whole run stays well under a minute

# What careless or hostile clients send, put in place of one parameter or property at a time:
# digits outside ASCII ("²".isdigit() is true), NUL, numbers past 64 bits, huge text.
HOSTILE_PATH = ("²", "١٢", "%00", "..", "9" * 40, "-1", "task_²", "x" * 5000)
HOSTILE_QUERY = (2**63, -(2**63) - 1, 2**64, "²", "\x00", "", "9" * 5000, "1e3")
HOSTILE_JSON = (["high"], {}, None, True, 2**64, -1, 1e308, "", "\x00", "\ud800", "x" * 5000)
HOSTILE_BODIES = (  # raw bytes, as a body
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
    b"\xff\xfe{}",
    b"{",
    b"[]",
    b"null",
    b"",
)


def _streams(document: dict) -> set[tuple[str, str]]:
    """Operations that answer with an endless event stream: a client cannot read them whole."""
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if "text/event-stream" in op["responses"].get("200", {}).get("content", {})
    }


def _without_auth(document: dict) -> None:
    for item in document["paths"].values():
        for op in item.values():
            op.pop("security", None)
            op["responses"].pop("401", None)


def _fuzz(operation: Any, mode: GenerationMode, check: Callable[..., None]) -> None:
    """Up to EXAMPLES cases of ``operation`` in ``mode``, each given to ``check``."""

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # the same cases every run
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        check(case, mode)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        assert mode == GenerationMode.NEGATIVE  # nothing to get wrong: no parameters


def _hostile(document: dict, operation: Any) -> Any:
    """Cases of ``operation`` with one hostile value each, from its parameters in ``document``."""
    op = document["paths"][operation.path][operation.method.lower()]
    components = document["components"]
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in op.get("parameters", [])]
    path_names = [n for n in names if components["parameters"][n]["in"] == "path"]
    query_names = [n for n in names if components["parameters"][n]["in"] == "query"]
    base = {name: "1" for name in path_names}
    for name in path_names:
        for value in HOSTILE_PATH:
            yield operation.Case(path_parameters=base | {name: value})
    for name in query_names:
        for value in HOSTILE_QUERY:
            yield operation.Case(path_parameters=base, query={name: value})
    if "requestBody" in op:
        body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for name in components["schemas"][body.rsplit("/", 1)[1]]["properties"]:
            for value in HOSTILE_JSON:
                yield operation.Case(
                    path_parameters=base, body={name: value}, media_type="application/json"
                )
        for raw in HOSTILE_BODIES:
            yield operation.Case(path_parameters=base), raw


@pytest.mark.parametrize("auth", [False, True], ids=["open", "token"])
def test_every_operation_survives_generated_and_hostile_input(start_service, auth):
    svc = start_service(service={"auth": auth})
    svc.submit("known.mp4", ["noop"])  # something for the ids and lists to find
    token = svc.token  # the one made at first start
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    document = svc.get("/openapi.json")
    if not token:
        _without_auth(document)  # this service asks for none
    schema = schemathesis.openapi.from_dict(document)
    # Unknown query parameters are ignored (as a cache-buster would need), not refused.
    schema.config.generation.update(allow_extra_parameters=False)
    skipped = _streams(document)
    # A fitting body may still name a path outside the watched folders or a processor this
    # node lacks (400): the schema cannot say that.
    excluded = [positive_data_acceptance]

    cases, failures = 0, []

    def check(case: schemathesis.Case, mode: str, raw: bytes | None = None) -> None:
        nonlocal cases
        cases += 1
        if raw is None:
            response = case.call(base_url=svc.url, headers=headers, timeout=15)
        else:
            url = svc.url + case.formatted_path
            response = httpx.request(case.method, url, headers=headers, content=raw, timeout=15)
        where = f"{case.method} {case.formatted_path[:100]} ({mode})"
        try:
            case.validate_response(response, headers=headers, excluded_checks=excluded)
        except FailureGroup as group:
            failures.extend(f"{where}: {f.title}: {f.message}" for f in group.exceptions)
        except AssertionError as exc:
            failures.append(f"{where}: {exc}")

    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if (operation.method.upper(), operation.path) not in skipped:
            operations += 1
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(operation, mode, check)
            for case in _hostile(document, operation):
                if isinstance(case, tuple):
                    check(case[0], "hostile body", case[1])
                else:
                    check(case, "hostile")

    print(f"\nfuzzing: {operations} operations, {cases} cases, {len(failures)} failures")
    assert operations == sum(len(item) for item in document["paths"].values()) - len(skipped)
    assert not failures, "\n".join(sorted(set(failures))[:40])
    assert svc.get("/healthz")["status"] == "ok"
