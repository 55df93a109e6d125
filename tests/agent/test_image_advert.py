"""The images an agent advertises: read from its real Docker engine (``GET /images/json``),
only pinned references, bounded, the newest first; a listing that is not what dockerd sends is
read defensively; an engine that stops answering keeps the last list."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from agent.capacity import CachedImages, engine_client, pinned_images
from devstack.dockerd import Dockerd
from devstack.images import ensure_busybox_image, push_image
from devstack.registry import Registry
from gridmarket.wire import MAX_ADVERTISED_IMAGES, HeartbeatRequest, NodeCapacityIn

DIGEST = "sha256:" + "c" * 64


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("advert-registry")) as reg:
        yield reg


def test_the_engine_s_pinned_images_are_advertised(
    dockerd: Dockerd, docker_client: docker.DockerClient, registry: Registry, test_image: str
) -> None:
    tag = "gridmarket/advert:1"
    ensure_busybox_image(docker_client, tag, extra_files={"marker": b"advert"})
    ref = push_image(docker_client, registry.host, tag)  # host/name@sha256:...
    repository, digest = ref.split("@")
    docker_client.images.pull(repository, tag=digest)
    cached = CachedImages(dockerd.host, refresh_s=0)
    images = cached()
    assert ref in images
    assert all("@sha256:" in i and not i.startswith("gridmarket/") for i in images)
    # what the wire accepts: a registration and a heartbeat carry it as is
    NodeCapacityIn(
        cpu_cores=1, ram_mib=128, disk_mib=0, region="eu-west", executors=["docker"], images=images
    )
    HeartbeatRequest(images=images)

    docker_client.images.remove(ref)
    docker_client.images.remove(tag)
    assert ref not in cached()


def test_an_engine_that_stops_answering_keeps_the_last_list(tmp_path: Path) -> None:
    cached = CachedImages(f"unix://{tmp_path / 'no-such.sock'}", refresh_s=0)
    assert cached() == []
    cached._images = ["127.0.0.1:5000/x@" + DIGEST]  # as listed before the engine went away
    assert cached() == ["127.0.0.1:5000/x@" + DIGEST]
    throttled = CachedImages(f"unix://{tmp_path / 'no-such.sock'}", refresh_s=60)
    started = time.monotonic()
    for _ in range(100):  # within refresh_s: answered from memory, no connection
        throttled()
    assert time.monotonic() - started < 0.5


def test_a_hostile_listing_is_read_defensively() -> None:
    good = "127.0.0.1:5000/gridmarket/busybox@" + DIGEST
    newer = "127.0.0.1:5000/gridmarket/python-numpy@" + DIGEST
    listing = [
        {"Created": 1, "RepoDigests": [good, good]},
        {"Created": 2, "RepoDigests": [newer, "busybox@" + DIGEST, "x" * 10_000 + "@" + DIGEST]},
        {"Created": "yesterday", "RepoDigests": "not a list"},
        {"RepoDigests": [None, 7, {"a": 1}, "127.0.0.1:5000/x@sha256:short"]},
        "not an image",
        None,
    ]
    assert pinned_images(listing) == [newer, good]  # newest first, each once
    assert pinned_images({"message": "error"}) == []
    assert pinned_images(None) == []
    many = [{"Created": i, "RepoDigests": [f"127.0.0.1:5000/img{i}@" + DIGEST]} for i in range(200)]
    kept = pinned_images(many)
    assert len(kept) == MAX_ADVERTISED_IMAGES and kept[0] == "127.0.0.1:5000/img199@" + DIGEST


@pytest.mark.parametrize("host", ["unix:///var/run/docker.sock", "tcp://127.0.0.1:2375"])
def test_the_engine_client_loads_no_certificates(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image list is asked at each heartbeat: a client that parsed a CA bundle each time
    cost 35 ms of CPU per heartbeat, all of the idle daemon's CPU (docs/agent.md)."""
    import ssl

    loaded: list[object] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:  # the real one, counted
        loaded.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    client, base = engine_client(host, timeout_s=1)
    client.close()
    assert loaded == []
    assert base in ("http://docker", "http://127.0.0.1:2375")
