"""DockerExecutor pulling job images by digest: a real registry (Debian's docker-registry), the
session's dockerd pushing to it, and a second, empty dockerd as the agent's engine.

A small HTTP proxy in front of the registry plays the slow and the lying registry.
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
import requests

from agent.errors import ExecutorError, ImageNotFoundError
from agent.executors import ExecutionSpec
from agent.executors.docker import (
    DockerExecutor,
    ImagePullError,
    ImagePullUnavailableError,
    PullPolicy,
)
from devstack.dockerd import Dockerd
from devstack.images import ensure_busybox_image, push_image
from devstack.registry import Registry
from gridmarket.images import ACCEPT_MANIFESTS, Credentials, parse_pinned
from gridmarket.registry_policy import RegistryPolicy

MiB = 1024 * 1024
PublishFn = Callable[[], str]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with Registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def agent_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[docker.DockerClient]:
    """A second dockerd, empty: the provider's engine, which has to pull."""
    with Dockerd(tmp_path_factory.mktemp("agent-dockerd")) as engine:
        client = docker.DockerClient(base_url=engine.host)
        yield client
        client.close()


@pytest.fixture
def publish(
    registry: Registry, docker_client: docker.DockerClient, test_image: str
) -> Iterator[PublishFn]:
    """Build a busybox variant (its own layer, its own digest) and push it: the pinned ref."""

    def publish() -> str:
        marker = uuid.uuid4().hex[:10]
        tag = f"gridmarket/pull-{marker}:1"
        ensure_busybox_image(docker_client, tag, extra_files={"marker": marker.encode()})
        ref = push_image(docker_client, registry.host, tag)
        docker_client.images.remove(tag)
        return ref

    yield publish


def executor(
    client: docker.DockerClient, tmp_path: Path, allow: list[str], **policy: object
) -> DockerExecutor:
    """An executor that pulls from public registries and ``allow`` (``host:port``: the test's
    registries are on loopback, which only a listed entry admits)."""
    registries = RegistryPolicy(("public", *allow), "pull_registries")
    pull = PullPolicy(state_file=tmp_path / "pulled.json", registries=registries, **policy)  # type: ignore[arg-type]
    return DockerExecutor(client, pull=pull)


def marker_job(image: str) -> ExecutionSpec:
    return ExecutionSpec(image=image, command=("/bin/sh", "-c", "cat /marker > /output/marker"))


def via(proxy: Proxy, ref: str) -> str:
    """The same image through the proxy."""
    return proxy.host + "/" + ref.split("/", 1)[1]


def present(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards registry API reads to ``upstream``. With ``trickle``, blob bodies come at
    ``trickle`` bytes per second (a slow registry) and ``hung_up`` records a client that left;
    ``swap`` serves another manifest path than the one asked for (a lying registry)."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = upstream
        self.trickle = 0
        self.hold = 0.0  # seconds a blob request waits before any answer (a tarpit)
        self.swap: dict[str, str] = {}  # requested manifest path -> the path served instead
        self.hung_up = threading.Event()
        self.blob_requests = 0
        self.token_login: tuple[str, str] | None = None  # token auth in front: (user, password)
        self.token = "tok-" + uuid.uuid4().hex
        self.token_requests: list[str] = []  # the query strings of the token requests

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: Proxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._forward(head=True)

    def do_GET(self) -> None:
        self._forward(head=False)

    def _token_gate(self) -> bool:
        """Token auth (the Docker registry token flow): False when the request was answered."""
        login = self.server.token_login
        if login is None:
            return True
        if self.path.startswith("/token"):
            self.server.token_requests.append(self.path.partition("?")[2])
            expected = "Basic " + base64.b64encode(":".join(login).encode()).decode()
            ok = self.headers.get("Authorization") == expected
            body = json.dumps({"token": self.server.token}).encode() if ok else b"{}"
            self._answer(200 if ok else 401, body)
            return False
        if self.headers.get("Authorization") == f"Bearer {self.server.token}":
            return True
        realm = f"http://{self.server.host}/token"
        self._answer(401, b"{}", f'Bearer realm="{realm}",service="proxy"')
        return False

    def _answer(self, status: int, body: bytes, challenge: str | None = None) -> None:
        self.send_response(status)
        if challenge:
            self.send_header("WWW-Authenticate", challenge)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, head: bool) -> None:
        if not self._token_gate():
            return
        path = self.server.swap.get(self.path, self.path)
        blob = "/blobs/" in path and not head
        if blob:
            self.server.blob_requests += 1
            time.sleep(self.server.hold)
        upstream = requests.request(
            "HEAD" if head else "GET",
            f"{self.server.upstream}{path}",
            headers={"Accept": self.headers.get("Accept", ACCEPT_MANIFESTS)},
            timeout=10,
        )
        body = b"" if head else upstream.content
        self.send_response(upstream.status_code)
        for name in ("Content-Type", "Docker-Content-Digest", "Docker-Distribution-Api-Version"):
            if name in upstream.headers:
                self.send_header(name, upstream.headers[name])
        self.send_header("Content-Length", upstream.headers.get("Content-Length", str(len(body))))
        self.end_headers()
        if head:
            return
        step = max(1, self.server.trickle // 10) if blob and self.server.trickle else len(body)
        try:
            for i in range(0, len(body), step):
                self.wfile.write(body[i : i + step])
                self.wfile.flush()
                if step < len(body):
                    time.sleep(0.1)
        except OSError:  # the client hung up
            self.server.hung_up.set()
            self.close_connection = True


@pytest.fixture
def proxy(registry: Registry) -> Iterator[Proxy]:
    server = Proxy(registry.url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# --------------------------------------------------------------------------- pulls


def test_pulls_by_digest_runs_and_reuses(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    assert not present(agent_engine, ref)
    ex = executor(agent_engine, tmp_path, [registry.host])

    started = time.monotonic()
    result = ex.run(marker_job(ref), None, tmp_path / "out1")
    first = time.monotonic() - started
    assert result.ok, result
    marker = (result.output_dir / "marker").read_text()
    assert len(marker) == 10

    image = agent_engine.images.get(ref)
    assert ref in image.attrs["RepoDigests"] and image.attrs["RepoTags"] == []
    assert ex.images.pulled_images() == {ref: image.attrs["Size"]}
    assert ref in ex.cached_images()
    state = json.loads((tmp_path / "pulled.json").read_text())
    assert list(state["pulled"]) == [ref]

    started = time.monotonic()
    again = ex.run(marker_job(ref), None, tmp_path / "out2")  # present now: no pull
    assert again.ok and (again.output_dir / "marker").read_text() == marker
    assert (
        json.loads((tmp_path / "pulled.json").read_text())["pulled"][ref]["pulled_at"]
        == (state["pulled"][ref]["pulled_at"])
    )
    print(f"first run with pull {first:.2f} s, second {time.monotonic() - started:.2f} s")


def test_tag_reference_is_refused_as_the_jobs_fault(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    repository = ref.split("@")[0]
    tagged = f"{repository}:1"  # in the registry, under that tag
    assert requests.head(
        f"{registry.url}/v2/{parse_pinned(ref).name}/manifests/1",
        headers={"Accept": ACCEPT_MANIFESTS},
        timeout=5,
    ).ok
    ex = executor(agent_engine, tmp_path, [registry.host])
    for image in (tagged, repository, "gridmarket/nowhere:latest"):
        with pytest.raises(ImagePullError, match="not named by digest are never pulled"):
            ex.run(marker_job(image), None, tmp_path / "out")
    assert not present(agent_engine, ref)
    # The runner maps ImageNotFoundError to workload_error: the job's own fault.
    assert issubclass(ImagePullError, ImageNotFoundError)


def test_unknown_digest_is_refused(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    missing = ref.split("@")[0] + "@sha256:" + "0" * 64
    ex = executor(agent_engine, tmp_path, [registry.host])
    with pytest.raises(ImagePullError, match="not in registry") as info:
        ex.run(marker_job(missing), None, tmp_path / "out")
    assert "this node does not run" not in str(info.value)  # the job's fault, not the node's
    other_repo = f"{registry.host}/gridmarket/elsewhere@{parse_pinned(ref).digest}"
    with pytest.raises(ImagePullError, match="not in registry"):
        ex.run(marker_job(other_repo), None, tmp_path / "out")


def test_registry_serving_other_bytes_is_refused(
    publish: PublishFn, proxy: Proxy, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    wanted, other = parse_pinned(via(proxy, publish())), parse_pinned(via(proxy, publish()))
    assert wanted.digest and other.digest
    # Asked for one image's manifest, the registry serves the other's.
    proxy.swap[f"/v2/{wanted.name}/manifests/{wanted.digest}"] = (
        f"/v2/{other.name}/manifests/{other.digest}"
    )
    ex = executor(agent_engine, tmp_path, [proxy.host])
    with pytest.raises(ImagePullError, match=r"whose digest is .*: refused"):
        ex.run(marker_job(str(wanted)), None, tmp_path / "out")
    assert not present(agent_engine, str(wanted)) and not present(agent_engine, str(other))
    assert proxy.blob_requests == 0


def test_size_cap_refuses_before_pulling(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    name = parse_pinned(ref).name
    ex = executor(agent_engine, tmp_path, [registry.host], max_download_bytes=200_000)
    started = time.monotonic()
    with pytest.raises(ImagePullError, match=r"this node does not run images over 200000 bytes"):
        ex.run(marker_job(ref), None, tmp_path / "out")
    assert time.monotonic() - started < 5
    assert not present(agent_engine, ref)
    assert f'"GET /v2/{name}/blobs/' not in registry.log_path.read_text()  # nothing downloaded


def test_unpacked_cap_removes_the_image(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    # busybox unpacks to ~2 MB
    ex = executor(agent_engine, tmp_path, [registry.host], max_image_bytes=1_000_000)
    with pytest.raises(ImagePullError, match="over 1000000 bytes unpacked"):
        ex.run(marker_job(ref), None, tmp_path / "out")
    assert not present(agent_engine, ref) and ex.images.pulled_images() == {}


def test_time_limit_aborts_the_pull(
    publish: PublishFn, proxy: Proxy, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = via(proxy, publish())
    proxy.trickle = 5000  # 5 kB/s: the ~1 MB layer would take minutes
    ex = executor(agent_engine, tmp_path, [proxy.host], timeout_s=3.0)
    started = time.monotonic()
    with pytest.raises(ImagePullUnavailableError, match="past the pull time limit of 3 s"):
        ex.run(marker_job(ref), None, tmp_path / "out")
    elapsed = time.monotonic() - started
    assert 3.0 <= elapsed < 8.0, elapsed
    # dockerd aborted its pull: it hung up on the blob download at once.
    assert proxy.hung_up.wait(10), "dockerd kept pulling after the abort"
    assert not present(agent_engine, ref)
    assert issubclass(ImagePullUnavailableError, ExecutorError)  # agent_error: the node's


def test_time_limit_holds_against_a_registry_that_never_answers(
    publish: PublishFn, proxy: Proxy, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    """The agent is free at the limit. (dockerd 20.10 itself waits on such a blob request until
    the registry answers: its blob reader takes no context; docs/platform.md.)"""
    ref = via(proxy, publish())
    proxy.hold = 20.0
    ex = executor(agent_engine, tmp_path, [proxy.host], timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(ImagePullUnavailableError, match="past the pull time limit of 2 s"):
        ex.run(marker_job(ref), None, tmp_path / "out")
    assert time.monotonic() - started < 6
    assert proxy.blob_requests >= 1 and not present(agent_engine, ref)


def test_cancel_aborts_the_pull(
    publish: PublishFn, proxy: Proxy, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = via(proxy, publish())
    proxy.trickle = 5000
    ex = executor(agent_engine, tmp_path, [proxy.host], timeout_s=60.0)
    cancel = threading.Event()
    threading.Timer(1.5, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(ImagePullUnavailableError, match="cancelled by the agent"):
        ex.run(marker_job(ref), None, tmp_path / "out", cancel=cancel)
    assert time.monotonic() - started < 6
    assert proxy.hung_up.wait(10)


def test_an_unreachable_registry_is_the_jobs_fault(
    agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    """Nothing listens there (a closed port, allowed by the list): every node would fail the
    same way, so the job fails at once (issue 32, item 5), not the node."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ref = f"127.0.0.1:{port}/gridmarket/gone@sha256:" + "1" * 64
    ex = executor(agent_engine, tmp_path, [f"127.0.0.1:{port}"])
    with pytest.raises(ImagePullError, match="unreachable") as info:
        ex.run(marker_job(ref), None, tmp_path / "out")
    assert "this node does not run" not in str(info.value)  # the job's fault


def test_pulls_disabled_behaves_as_before(
    publish: PublishFn, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    ref = publish()
    ex = DockerExecutor(agent_engine, pull=PullPolicy(enabled=False))
    with pytest.raises(ImageNotFoundError, match="never pulled"):
        ex.run(marker_job(ref), None, tmp_path / "out")
    assert not present(agent_engine, ref)


# --------------------------------------------------------------------------- the cache


def test_cache_evicts_least_recently_used_pulled_images(
    publish: PublishFn, registry: Registry, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    a, b, c, d = (publish() for _ in range(4))
    local = f"gridmarket/local-{uuid.uuid4().hex[:8]}:1"  # loaded by the operator: never evicted
    ensure_busybox_image(agent_engine, local, extra_files={"marker": b"local"})
    # two ~2 MB images fit, not three
    ex = executor(agent_engine, tmp_path, [registry.host], cache_bytes=5 * MiB)

    def run(ref: str) -> None:
        assert ex.run(marker_job(ref), None, tmp_path / f"out-{uuid.uuid4().hex}").ok
        time.sleep(0.01)  # distinct last-used times

    run(a)
    run(b)
    run(a)  # a is now more recent than b
    run(c)  # over budget: b (least recently used) goes
    assert present(agent_engine, a) and present(agent_engine, c)
    assert not present(agent_engine, b)
    assert set(ex.images.pulled_images()) == {a, c}

    ex.images.acquire(a)  # a run of a is about to start: a is in use
    try:
        run(d)  # a is the least recently used, but in use: c goes
    finally:
        ex.images.release(a)
    assert present(agent_engine, a) and present(agent_engine, d)
    assert not present(agent_engine, c)
    assert present(agent_engine, local)  # never pulled by the agent: never touched

    # A restarted agent remembers what it pulled (and when it last used it).
    again = executor(agent_engine, tmp_path, [registry.host], cache_bytes=5 * MiB)
    assert set(again.images.pulled_images()) == {a, d}
    assert {a, d} <= set(again.cached_images())


def test_basic_auth_registry(
    tmp_path_factory: pytest.TempPathFactory,
    docker_client: docker.DockerClient,
    test_image: str,
    agent_engine: docker.DockerClient,
    tmp_path: Path,
) -> None:
    with Registry(tmp_path_factory.mktemp("locked"), users={"carol": "open sesame"}) as locked:
        tag = f"gridmarket/private-{uuid.uuid4().hex[:8]}:1"
        ensure_busybox_image(docker_client, tag, extra_files={"marker": b"private"})
        auth = {"username": "carol", "password": "open sesame"}
        ref = push_image(docker_client, locked.host, tag, auth_config=auth)

        without = executor(agent_engine, tmp_path, [locked.host])
        with pytest.raises(ImagePullError, match=r"this node does not run images from .*"
                           "credentials"):  # fmt: skip
            without.run(marker_job(ref), None, tmp_path / "out0")

        bad = {locked.host: Credentials("carol", "x")}
        wrong = executor(agent_engine, tmp_path, [locked.host], credentials=bad)
        with pytest.raises(ImagePullUnavailableError, match="refused this node's credentials"):
            wrong.run(marker_job(ref), None, tmp_path / "out1")

        creds = {locked.host: Credentials("carol", "open sesame")}
        result = executor(agent_engine, tmp_path, [locked.host], credentials=creds).run(
            marker_job(ref), None, tmp_path / "out2"
        )
        assert result.ok, result
        assert (result.output_dir / "marker").read_text() == "private"


def test_token_auth_registry(
    publish: PublishFn, proxy: Proxy, agent_engine: docker.DockerClient, tmp_path: Path
) -> None:
    """A registry behind the bearer-token flow (401 + ``WWW-Authenticate: Bearer realm=...``,
    token fetched from the realm with the user and password): the manifest check and dockerd's
    pull both go through it."""
    ref = via(proxy, publish())
    proxy.token_login = ("dave", "tokens please")
    without = executor(agent_engine, tmp_path, [proxy.host])
    with pytest.raises(ImagePullError, match=r"this node does not run images from .*token server"):
        without.run(marker_job(ref), None, tmp_path / "out0")
    creds = {proxy.host: Credentials("dave", "tokens please")}
    result = executor(agent_engine, tmp_path, [proxy.host], credentials=creds).run(
        marker_job(ref), None, tmp_path / "out1"
    )
    assert result.ok, result
    wrong = {proxy.host: Credentials("dave", "nope")}
    with pytest.raises(ImagePullUnavailableError, match="refused this node's credentials"):
        executor(agent_engine, tmp_path, [proxy.host], credentials=wrong).run(
            marker_job(via(proxy, publish())), None, tmp_path / "out2"
        )
    name = parse_pinned(ref).name
    scopes = [urllib.parse.parse_qs(q).get("scope") for q in proxy.token_requests]
    assert [f"repository:{name}:pull"] in scopes, scopes  # ours, and dockerd's
