"""Schemathesis over the scheduler's OpenAPI spec: generated requests (valid and invalid) against
the real app (uvicorn, anvil, IPFS) must never get a 5xx; with JSON nested thousands deep or
numbers with huge exponents drawn into a field or a query parameter (issue 32), every operation
answers 400 naming it, at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from tests.hostile_json import hostile_request

from ..conftest import Devnet
from .harness import Provider, Server, fresh_escrow, register_on_chain, scheduler


@pytest.fixture(scope="module")
def fuzz_server(
    tmp_path_factory: pytest.TempPathFactory, devnet: Devnet, ipfs_daemon: Any
) -> Iterator[tuple[Server, Provider]]:
    deployment, client = fresh_escrow(devnet)
    register_on_chain(client, devnet.providers[0])
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    with scheduler(tmp, deployment, devnet, ipfs_daemon.api_addr, long_poll_max_s=0.5) as server:
        node = Provider(devnet.providers[0], server)
        assert node.register().status_code == 200
        yield server, node


@pytest.fixture(scope="module")
def api_schema(fuzz_server: tuple[Server, Provider]) -> Any:
    return schemathesis.openapi.from_url(fuzz_server[0].url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: Any, fuzz_server: tuple[Server, Provider]) -> None:
    """Half the node requests carry a real node's token and id, so the handlers behind the
    authentication are fuzzed too, not only the 401 path."""
    _, node = fuzz_server
    headers = None
    if case.path_parameters and "node_id" in case.path_parameters and hash(str(case.body)) % 2:
        case.path_parameters["node_id"] = node.node_id
        headers = node.auth
    case.call_and_validate(headers=headers, checks=[not_a_server_error])


@schema.parametrize()
@schema.given(data=st.data())
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_json_and_numbers_get_400_naming_the_field(
    case: Any, data: st.DataObject, fuzz_server: tuple[Server, Provider]
) -> None:
    server, node = fuzz_server
    query, body, guarded = hostile_request(case, data)
    headers = {**node.auth, "content-type": "application/json"}
    t0 = time.perf_counter()
    r = httpx.request(
        case.method,
        server.url + case.formatted_path,
        params=query,
        content=body,
        headers=headers,
        timeout=30,
    )
    took = time.perf_counter() - t0
    assert r.status_code < 500 and took < 5, (case.method, case.formatted_path, r.text[:300])
    if guarded:
        assert r.status_code == 400 and r.json().get("field"), (case.formatted_path, r.text[:300])
