"""Image references and tag -> digest resolution against a real registry (devstack/registry.py:
Debian's docker-registry on loopback), with images pushed by the session's real dockerd."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import requests

from devstack.images import BUSYBOX_IMAGE, ensure_busybox_image, publish_busybox, push_image
from devstack.registry import Registry, free_port, htpasswd_line
from gridmarket.images import (
    ACCEPT_MANIFESTS,
    Credentials,
    ImageRef,
    ImageRefError,
    RegistryClient,
    RegistryError,
    RegistryUnavailableError,
    load_docker_credentials,
    parse_image_ref,
    parse_pinned,
    resolve_image,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def locked_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("locked"), users={"alice": "s3cret pw"}) as reg:
        yield reg


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("busybox", ImageRef(None, "busybox")),
        ("library/busybox:1.36", ImageRef(None, "library/busybox", "1.36")),
        ("localhost/a:b", ImageRef("localhost", "a", "b")),
        ("127.0.0.1:5000/grid/bb@" + DIGEST, ImageRef("127.0.0.1:5000", "grid/bb", None, DIGEST)),
        ("reg.example.org/a/b/c:v1", ImageRef("reg.example.org", "a/b/c", "v1")),
        ("[::1]:5000/x", ImageRef("[::1]:5000", "x")),
        ("h.io/a:t@" + DIGEST, ImageRef("h.io", "a", "t", DIGEST)),
    ],
)
def test_parse_image_ref(text: str, expected: ImageRef) -> None:
    ref = parse_image_ref(text)
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "UPPER/case",
        "a//b",
        "name@sha256:abc",  # short digest
        "name@md5:" + "0" * 32,
        "h.io/a@sha256:" + "AB" * 32,  # upper-case hex
        "-lead/x",
        "x" * 600,
    ],
)
def test_parse_image_ref_refuses(text: str) -> None:
    with pytest.raises(ImageRefError):
        parse_image_ref(text)


def test_parse_pinned_wants_host_and_digest_alone() -> None:
    assert parse_pinned("h.io:5000/a/b@" + DIGEST).pinned
    for text, why in [
        ("h.io/a:latest", "not pinned"),
        ("busybox@" + DIGEST, "names no registry"),
        ("h.io/a:t@" + DIGEST, "without the tag"),
    ]:
        with pytest.raises(ImageRefError, match=why):
            parse_pinned(text)
    assert parse_image_ref("h.io/a:t").pin(DIGEST) == ImageRef("h.io", "a", None, DIGEST)
    with pytest.raises(ImageRefError):
        parse_image_ref("h.io/a").pin("sha256:1234")


def test_credentials_never_print_secrets() -> None:
    creds = Credentials("bob", "hunter2", "tok3n")
    assert "hunter2" not in repr(creds) and "tok3n" not in repr(creds)
    assert Credentials("bob", "pw").docker_auth() == {"username": "bob", "password": "pw"}


# --------------------------------------------------------------------------- a real registry


def test_resolve_tag_to_the_pushed_digest(
    registry: Registry, docker_client: docker.DockerClient, test_image: str
) -> None:
    name = f"gridmarket/resolve-{uuid.uuid4().hex[:8]}"
    pinned = push_image(docker_client, registry.host, test_image, repository=name, tag="v1")
    assert pinned.startswith(f"{registry.host}/{name}@sha256:")

    client = RegistryClient()
    ref = client.resolve(f"{registry.host}/{name}:v1")
    assert str(ref) == pinned and ref.pinned
    assert str(client.resolve(pinned)) == pinned  # a digest is checked, and kept
    assert resolve_image(f"{registry.host}/{name}:v1") == pinned

    # What the registry says is the digest of the manifest's bytes, as served for our Accept.
    response = requests.get(
        f"{registry.url}/v2/{name}/manifests/v1", headers={"Accept": ACCEPT_MANIFESTS}, timeout=5
    )
    assert "sha256:" + hashlib.sha256(response.content).hexdigest() == ref.digest
    log = (registry.log_path).read_text()
    assert f'"HEAD /v2/{name}/manifests/v1 HTTP/1.1" 200' in log  # resolved with a HEAD

    info = client.manifest(ref)
    assert info.media_type == "application/vnd.docker.distribution.manifest.v2+json"
    assert len(info.layer_bytes) == 1 and 500_000 < info.download_bytes < 5_000_000
    assert client.download_size(pinned) == info.download_bytes

    # The tag moves: resolution follows it, the old digest still resolves to itself.
    other = push_image(
        docker_client,
        registry.host,
        _variant(docker_client, "moved"),
        repository=name,
        tag="v1",
    )
    assert other != pinned
    assert str(client.resolve(f"{registry.host}/{name}:v1")) == other
    assert str(client.resolve(pinned)) == pinned


def test_publish_busybox_gives_the_pinned_reference(
    registry: Registry, docker_client: docker.DockerClient
) -> None:
    ref = publish_busybox(docker_client, registry.host)
    assert parse_pinned(ref).name == "gridmarket/busybox"
    assert resolve_image(f"{registry.host}/{BUSYBOX_IMAGE}") == ref
    assert ref in docker_client.images.get(BUSYBOX_IMAGE).attrs["RepoDigests"]


def test_resolve_refuses_unknown_tags_digests_and_names(
    registry: Registry, docker_client: docker.DockerClient, test_image: str
) -> None:
    name = f"gridmarket/unknown-{uuid.uuid4().hex[:8]}"
    push_image(docker_client, registry.host, test_image, repository=name, tag="v1")
    client = RegistryClient()
    for ref in (f"{name}:v2", f"{name}@{DIGEST}", "gridmarket/never-pushed:v1"):
        with pytest.raises(RegistryError, match="not in registry") as info:
            client.resolve(f"{registry.host}/{ref}")
        assert info.value.status == 404
    with pytest.raises(ImageRefError, match="names no registry"):
        client.resolve("busybox:latest")


def test_unreachable_registry_is_unavailable_not_refused() -> None:
    client = RegistryClient(timeout=2)
    with pytest.raises(RegistryUnavailableError, match="unreachable"):
        client.resolve(f"127.0.0.1:{free_port()}/a/b:c")


def test_basic_auth_registry(
    locked_registry: Registry, docker_client: docker.DockerClient, test_image: str
) -> None:
    name = f"gridmarket/locked-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match="no basic auth credentials"):
        push_image(docker_client, locked_registry.host, test_image, repository=name)
    auth = {"username": "alice", "password": "s3cret pw"}
    pinned = push_image(
        docker_client, locked_registry.host, test_image, repository=name, auth_config=auth
    )
    tag_ref = f"{locked_registry.host}/{name}:test"

    with pytest.raises(RegistryError, match="wants credentials") as info:
        RegistryClient().resolve(tag_ref)
    assert info.value.status == 401
    wrong = RegistryClient({locked_registry.host: Credentials("alice", "wrong")})
    with pytest.raises(RegistryError, match="wants credentials"):
        wrong.resolve(tag_ref)
    good = RegistryClient({locked_registry.host: Credentials("alice", "s3cret pw")})
    assert str(good.resolve(tag_ref)) == pinned
    assert good.download_size(pinned) > 0


def test_load_docker_credentials(
    tmp_path: Path, locked_registry: Registry, docker_client: docker.DockerClient, test_image: str
) -> None:
    path = tmp_path / "config.json"
    basic = base64.b64encode(b"alice:s3cret pw").decode()
    path.write_text(
        json.dumps(
            {
                "auths": {
                    locked_registry.host: {"auth": basic},
                    "https://reg.example.org/v1/": {"username": "u", "password": "p"},
                    "tok.example.org": {"registrytoken": "abc"},
                },
                "credsStore": "desktop",
            }
        )
    )
    creds = load_docker_credentials(path)
    assert creds == {
        locked_registry.host: Credentials("alice", "s3cret pw"),
        "reg.example.org": Credentials("u", "p"),
        "tok.example.org": Credentials(token="abc"),
    }
    name = f"gridmarket/fromfile-{uuid.uuid4().hex[:8]}"
    auth = creds[locked_registry.host].docker_auth()
    pinned = push_image(
        docker_client, locked_registry.host, test_image, repository=name, auth_config=auth
    )
    assert resolve_image(f"{locked_registry.host}/{name}:test", creds) == pinned
    path.write_text(json.dumps({"auths": {"h": {"auth": base64.b64encode(b"nocolon").decode()}}}))
    with pytest.raises(ValueError, match="bad auth"):
        load_docker_credentials(path)


def test_htpasswd_line_is_bcrypt(tmp_path: Path) -> None:
    line = htpasswd_line("bob", "pw", rounds=16)
    user, _, hashed = line.partition(":")
    assert user == "bob" and hashed.startswith("$2b$04$") and len(hashed) == 60
    with pytest.raises(ValueError):
        htpasswd_line("a:b", "pw")


def _variant(client: docker.DockerClient, marker: str) -> str:
    tag = f"gridmarket/variant-{marker}-{uuid.uuid4().hex[:8]}:1"
    ensure_busybox_image(client, tag, extra_files={"marker": f"{marker} {uuid.uuid4()}".encode()})
    return tag
