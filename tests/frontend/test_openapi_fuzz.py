"""Schemathesis over the front end's JSON API (``/api/openapi.json``): generated requests, valid
and invalid, against the real stack (tests/frontend/conftest.py) must never get a 5xx other than
the 502/504 that say a backing service (chain, scheduler, IPFS) failed or timed out.

The live job stream (server-sent events, open for minutes) is left out; every other ``/api``
operation is fuzzed."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.frontend.conftest import FrontendStack

BACKING_SERVICE = {502, 504}
"""A gateway's answers: the chain, the scheduler or IPFS refused or timed out (named in the
detail). Anything else >= 500 is the front end's own failure."""


@pytest.fixture(scope="module")
def api_schema(frontend_stack: FrontendStack) -> Any:
    schema = schemathesis.openapi.from_url(frontend_stack.frontend_url + "/api/openapi.json")
    return schema.include(path_regex="^/api/").exclude(path_regex="/stream$")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any, frontend_stack: FrontendStack) -> None:
    response = case.call(timeout=60)
    status = response.status_code
    assert status < 500 or status in BACKING_SERVICE, (
        f"{case.method} {case.formatted_path} -> {status}: {response.text[:500]}"
    )
