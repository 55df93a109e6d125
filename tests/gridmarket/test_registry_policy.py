"""gridmarket.registry_policy: the address classifier over every class it refuses (IPv4, IPv6,
IPv4 inside IPv6), the static and the resolved checks, and the guarded HTTP session against real
listeners that must see no connection (issue 32, item 4)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridmarket.images import RegistryClient, parse_pinned
from gridmarket.registry_policy import (
    PUBLIC,
    RegistryPolicy,
    RegistryRefusedError,
    address_problem,
    host_problem,
    split_host,
)
from gridmarket.registry_session import guarded_session
from tests.probe import Probe

FORBIDDEN = {
    # IPv4
    "0.0.0.0": "unspecified",  # noqa: S104 (an address judged, nothing binds it)
    "0.1.2.3": "unspecified",
    "10.0.0.1": "private",
    "172.16.5.4": "private",
    "172.31.255.255": "private",
    "192.168.0.1": "private",
    "100.64.0.1": "shared",
    "127.0.0.1": "loopback",
    "127.255.255.254": "loopback",
    "169.254.0.1": "link-local",
    "169.254.169.254": "metadata",
    "169.254.170.2": "metadata",
    "100.100.100.200": "metadata",
    "168.63.129.16": "metadata",
    "224.0.0.251": "multicast",
    "239.255.255.250": "multicast",
    "255.255.255.255": "broadcast",
    "240.0.0.1": "reserved",
    "192.0.2.1": "special-purpose",  # documentation
    "198.18.0.1": "special-purpose",  # benchmarking
    # IPv6
    "::": "unspecified",
    "::1": "loopback",
    "fe80::1": "link-local",
    "fe80::1%lo": "link-local",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "fd00:ec2::254": "metadata",
    "fec0::1": "site-local",
    "ff02::1": "multicast",
    "2001:db8::1": "special-purpose",
    "::127.0.0.1": "reserved",  # IPv4-compatible
    # IPv4 inside IPv6
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.1.2.3": "private",
    "::ffff:169.254.169.254": "metadata",
    "::ffff:192.168.1.1": "private",
    "64:ff9b::a9fe:a9fe": "metadata",  # NAT64 of 169.254.169.254
    "2002:c0a8:0101::1": "private",  # 6to4 of 192.168.1.1
}
PUBLIC_ADDRESSES = ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "kind"), sorted(FORBIDDEN.items()))
def test_every_non_public_class_is_refused(address: str, kind: str) -> None:
    why = address_problem(address)
    assert why is not None and kind in why, (address, why)


@pytest.mark.parametrize("address", PUBLIC_ADDRESSES)
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(address) is None


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.1", "loopback"),  # what inet_aton (and so the resolver) reads as 127.0.0.1
        ("2130706433", "loopback"),
        ("0x7f000001", "loopback"),
        ("0177.0.0.1", "loopback"),
        ("0xa9.0xfe.0xa9.0xfe", "metadata"),
        ("LOCALHOST", "loopback"),
        ("registry.localhost", "loopback"),
        ("metadata.google.internal", "metadata"),
        ("[::1]", "loopback"),
        ("10.0.0.1", "private"),
    ],
)
def test_names_refused_without_dns(host: str, kind: str) -> None:
    why = host_problem(host)
    assert why is not None and kind in why, why


def test_names_that_need_dns_pass_the_static_check() -> None:
    assert host_problem("ghcr.io") is None and host_problem("registry-1.docker.io") is None
    assert host_problem("1.2.3.4") is None


def test_split_host() -> None:
    assert split_host("Registry.Example.com:5000") == ("registry.example.com", 5000)
    assert split_host("[::1]:5000") == ("::1", 5000)
    assert split_host("127.1:80") == ("127.0.0.1", 80)
    assert split_host("ghcr.io") == ("ghcr.io", None)
    for bad in ("a/b", "host:0", "host:99999", "[::1", ""):
        with pytest.raises(ValueError):
            split_host(bad)


def test_the_policy_lists_by_host_and_port() -> None:
    policy = RegistryPolicy((PUBLIC, "127.0.0.1:5000", "10.9.9.9"), "pull_registries")
    policy.check("127.0.0.1:5000")
    policy.check("10.9.9.9:1234")  # a host without a port: all its ports
    policy.check("ghcr.io")
    for refused, kind in [
        ("127.0.0.1:5001", "loopback"),
        ("127.0.0.2:5000", "loopback"),
        ("localhost:5000", "loopback"),
        ("10.0.0.1:5000", "private"),
        ("169.254.169.254", "metadata"),
        ("[::ffff:127.0.0.1]:5000", "loopback"),
    ]:
        with pytest.raises(RegistryRefusedError, match=kind) as info:
            policy.check(refused)
        assert refused in str(info.value) and "pull_registries" in str(info.value)
        assert not info.value.by_list
    listed_only = RegistryPolicy(("ghcr.io",), "pull_registries")
    listed_only.check("ghcr.io")
    with pytest.raises(RegistryRefusedError, match=r"not among .* \(ghcr.io\)") as info:
        listed_only.check("quay.io")
    assert info.value.by_list  # public, but this policy's own choice
    with pytest.raises(ValueError, match="not host"):
        RegistryPolicy((PUBLIC, "a/b"))


def test_refusal_reads_a_job_s_image() -> None:
    policy = RegistryPolicy(setting="image_registries")
    why = policy.refusal("10.0.0.1:5000/x@sha256:" + "a" * 64)
    assert why is not None and "registry 10.0.0.1:5000" in why and "private" in why
    assert "image_registries" in why
    assert policy.refusal("ghcr.io/x@sha256:" + "a" * 64) is None
    assert policy.refusal("busybox:1") is None  # Docker Hub's short name
    assert policy.refusal("not an image!") is None  # the spec's own validation says why


def test_resolved_names_are_checked_address_by_address() -> None:
    answers = {
        "lan.example": ["10.1.2.3"],
        "mixed.example": ["93.184.216.34", "127.0.0.1"],  # one forbidden address refuses it
        "good.example": ["93.184.216.34", "2606:4700::1"],
        "v6.example": ["::ffff:169.254.169.254"],
    }
    policy = RegistryPolicy(resolver=lambda host, port: answers[host])
    with pytest.raises(RegistryRefusedError, match=r"lan\.example resolves to 10\.1\.2\.3, a priv"):
        policy.addresses("lan.example:5000")
    with pytest.raises(RegistryRefusedError, match=r"resolves to 127\.0\.0\.1, a loopback"):
        policy.addresses("mixed.example")
    with pytest.raises(RegistryRefusedError, match="metadata"):
        policy.addresses("v6.example")
    assert policy.addresses("good.example") == answers["good.example"]
    with pytest.raises(RegistryRefusedError, match="loopback name"):  # before any DNS
        policy.addresses("localhost:5000")


def test_the_system_resolver_is_used_and_checked() -> None:
    """This machine's own name resolves to a loopback or LAN address here (never public in a
    test environment): refused after resolution, not by its name."""
    name = socket.gethostname().lower()
    assert host_problem(name) is None
    found = {info[4][0] for info in socket.getaddrinfo(name, 5000)}
    assert all(address_problem(a) is not None for a in found), found
    with pytest.raises(RegistryRefusedError, match=f"{name} resolves to"):
        RegistryPolicy().addresses(f"{name}:5000")
    with pytest.raises(socket.gaierror):
        RegistryPolicy().addresses("no-such-registry.invalid:5000")


# --------------------------------------------------------------------------- connections


@pytest.fixture(params=["127.0.0.1", "127.0.0.2", "::1"])
def probe(request: pytest.FixtureRequest) -> Iterator[Probe]:
    with Probe(request.param) as p:
        yield p


def test_a_guarded_session_never_connects_to_a_forbidden_registry(probe: Probe) -> None:
    session = guarded_session(RegistryPolicy(setting="pull_registries"))
    with pytest.raises(RegistryRefusedError, match="loopback"):
        session.get(f"http://{probe.registry}/v2/", timeout=5)
    client = RegistryClient(timeout=5, session=guarded_session(RegistryPolicy()))
    with pytest.raises(RegistryRefusedError, match="loopback"):
        client.manifest(parse_pinned(probe.image()))
    assert probe.connections == []
    # the same listener, listed: reached (the probe was listening all along)
    allowed = guarded_session(RegistryPolicy((PUBLIC, probe.registry)))
    assert allowed.get(f"http://{probe.registry}/v2/", timeout=5).status_code == 404
    assert len(probe.connections) == 1


def test_a_listed_name_connects_only_to_the_address_it_checked() -> None:
    """Connections go to the addresses the policy's resolver gave (a name the system cannot
    resolve at all reaches the listener), and a rebinding answer at connection time is
    refused although the name was checked before."""
    with Probe() as target, Probe("127.0.0.2") as other:
        answers = [["127.0.0.1"]]
        policy = RegistryPolicy(
            (f"registry.test:{target.port}",), resolver=lambda host, port: answers[-1]
        )
        session = guarded_session(policy)
        r = session.get(f"http://registry.test:{target.port}/v2/", timeout=5)
        assert r.status_code == 404
        assert f"Host: registry.test:{target.port}".encode() in target.connections[0]
        public = RegistryPolicy(resolver=lambda host, port: answers[-1])
        answers.append(["93.184.216.34"])
        assert public.addresses(f"rebind.test:{other.port}") == ["93.184.216.34"]
        answers.append(["127.0.0.2"])  # the name now points at this machine
        with pytest.raises(RegistryRefusedError, match=r"resolves to 127\.0\.0\.2"):
            guarded_session(public).get(f"http://rebind.test:{other.port}/v2/", timeout=5)
        assert other.connections == [] and len(target.connections) == 1


class _Redirector(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, location: str, challenge: str = "") -> None:
        super().__init__(("127.0.0.1", 0), _RedirectHandler)
        self.location = location
        self.challenge = challenge


class _RedirectHandler(http.server.BaseHTTPRequestHandler):
    server: _Redirector

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.server.challenge:
            self.send_response(401)
            self.send_header("WWW-Authenticate", self.server.challenge)
        else:
            self.send_response(307)
            self.send_header("Location", self.server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.mark.parametrize("how", ["redirect", "token realm"])
def test_an_allowed_registry_cannot_send_the_client_elsewhere(how: str) -> None:
    """A listed registry that redirects its manifest, or names its token server, at a
    forbidden address: that address gets no connection."""
    with Probe("127.0.0.2") as inner:
        url = f"http://{inner.registry}/v2/x/manifests/latest"
        if how == "redirect":
            server = _Redirector(url)
        else:
            server = _Redirector("", challenge=f'Bearer realm="{url}",service="x"')
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            host = f"127.0.0.1:{server.server_address[1]}"
            client = RegistryClient(
                timeout=5, session=guarded_session(RegistryPolicy((PUBLIC, host)))
            )
            with pytest.raises(RegistryRefusedError, match=r"127\.0\.0\.2 is a loopback"):
                client.manifest(parse_pinned(f"{host}/x@sha256:" + "b" * 64))
        finally:
            server.shutdown()
            server.server_close()
        assert inner.connections == []


def test_no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy would resolve and connect where nothing was checked: the session ignores
    HTTP(S)_PROXY (here one pointing at the probe: it gets nothing either)."""
    with Probe() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://{proxy.registry}")
        monkeypatch.setenv("HTTPS_PROXY", f"http://{proxy.registry}")
        session = guarded_session(RegistryPolicy())
        with pytest.raises(RegistryRefusedError):
            session.get("http://10.0.0.1:5000/v2/", timeout=5)
        with pytest.raises(RegistryRefusedError):
            session.get("http://x/", proxies={"http": f"http://{proxy.registry}"}, timeout=5)
        assert proxy.connections == []
        assert isinstance(session, requests.Session)


def test_the_guarded_session_uses_no_proxy_but_the_environments_ca_bundle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """trust_env is off (no proxy from the environment), yet an operator's CA bundle still
    applies: the devstack's registry off loopback is self-signed (tests/e2e/test_remote_agent)."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    session = guarded_session(RegistryPolicy())
    assert session.trust_env is False and session.verify == str(bundle)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    assert guarded_session(RegistryPolicy()).verify is True
