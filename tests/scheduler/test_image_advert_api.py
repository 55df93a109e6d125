"""The cached-image advert through the scheduler's API (uvicorn, anvil, SQLite): a signed
registration carries it, a heartbeat replaces it (or leaves it when it says nothing), the node
view shows it; hostile adverts (too many, too long, not a pinned reference) are refused with
422 naming the field, and change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridmarket.wire import API, NodeCapacityIn

from ..conftest import Devnet
from .harness import CPU_CAP, Provider, Server, fresh_escrow, register_on_chain, scheduler

IMAGE = "127.0.0.1:5000/gridmarket/busybox@sha256:" + "a" * 64
OTHER = "registry.example.com/team/python-numpy@sha256:" + "b" * 64


@pytest.fixture
def server(tmp_path: Path, devnet: Devnet, ipfs_daemon: Any) -> Iterator[Server]:
    deployment, client = fresh_escrow(devnet)
    register_on_chain(client, devnet.providers[0])
    with scheduler(
        tmp_path, deployment, devnet, ipfs_daemon.api_addr,
        database_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
    ) as s:  # fmt: skip
        yield s


def images_of(server: Server, node: Provider) -> list[str]:
    view = server.get(API.NODE.format(node_id=node.node_id)).json()
    return list(view["images"])


def beat(server: Server, node: Provider, body: dict[str, Any]) -> Any:
    return server.http.post(
        API.HEARTBEAT.format(node_id=node.node_id), json=body, headers=node.auth
    )


def test_registration_and_heartbeats_carry_the_advert_and_hostile_ones_are_refused(
    server: Server, devnet: Devnet
) -> None:
    capacity = NodeCapacityIn.model_validate({**CPU_CAP.model_dump(), "images": [IMAGE]})
    node = Provider(devnet.providers[0], server, capacity=capacity)
    assert node.register().status_code == 200
    assert images_of(server, node) == [IMAGE]  # signed with the capacity

    assert beat(server, node, {"running": [], "images": [OTHER, IMAGE]}).status_code == 200
    assert images_of(server, node) == sorted([IMAGE, OTHER])
    assert beat(server, node, {"running": []}).status_code == 200  # says nothing: unchanged
    assert images_of(server, node) == sorted([IMAGE, OTHER])
    assert beat(server, node, {"running": [], "images": []}).status_code == 200  # evicted all
    assert images_of(server, node) == []

    long_ref = "registry.example.com/" + "a" * 240 + "@sha256:" + "0" * 64
    for hostile in (
        [f"127.0.0.1:5000/img{i}@sha256:" + "c" * 64 for i in range(65)],  # over 64
        [long_ref],  # over 255 characters
        ["busybox:latest"],  # not pinned
        ["127.0.0.1:5000/x@sha256:" + "c" * 64 + "\u0000"],
        "127.0.0.1:5000/x@sha256:" + "c" * 64,  # not a list
        [{"ref": IMAGE}],
    ):
        r = beat(server, node, {"running": [], "images": hostile})
        assert r.status_code == 422, (hostile, r.text)
        assert "images" in r.text
    assert images_of(server, node) == []

    # a registration whose advert is hostile is refused before its signature is looked at
    body = node.registration().model_dump(mode="json")
    body["capacity"]["images"] = ["busybox:latest"]
    r = server.http.post(API.REGISTER, json={"registration": body, "signature": "0x" + "1" * 130})
    assert r.status_code == 422 and "images" in r.text
